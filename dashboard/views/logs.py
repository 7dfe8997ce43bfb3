"""Logs: lines by level and app over time, and the peaks of sliding windows that reveal error bursts."""

from __future__ import annotations

import streamlit as st

from dashboard import common, queries

LEVEL_COLOURS = {"debug": "#9edae5", "info": "#1f77b4", "warning": "#ff7f0e", "error": "#d62728",
                 "critical": "#7b1fa2"}


def page() -> None:
    config, minutes = common.start_page("Logs")

    @common.refreshing(config)
    def live() -> None:
        since, until = common.last(minutes)
        with common.store(config) as client:
            lengths, resolution = common.bucket_seconds(client, minutes)
        data = common.fetch(
            config,
            levels=lambda c: queries.log_levels(c, since, until, resolution, min(lengths)) if lengths else None,
            peaks=lambda c: queries.error_burst_peaks(c, since, until, resolution))
        levels, peaks = data["levels"], data["peaks"]
        if levels is None or levels.empty:
            st.info("No log windows in the chosen range yet.")
            return
        by_level = levels.groupby(["t", "level"], as_index=False)["lines"].sum()
        span = (since, until)
        fig = common.time_chart(by_level, "lines", f"Log lines per {resolution} s by level", "lines", span, "level",
                                kind="bar", bucket_s=resolution)
        fig.for_each_trace(lambda trace: trace.update(marker_color=LEVEL_COLOURS.get(trace.name)))
        st.plotly_chart(fig, width="stretch")
        severe = levels[levels["level"].isin(["error", "critical"])]
        errors = severe.groupby(["t", "app"], as_index=False)["lines"].sum()
        left, right = st.columns(2)
        left.plotly_chart(common.time_chart(errors, "lines", f"Error + critical lines per {resolution} s by app",
                                            "lines", span, "app"), width="stretch")
        if peaks.empty:
            right.info("No sliding windows yet (they are emitted once the watermark passes each event).")
        else:
            length = int(peaks["window_s"].iloc[0])
            right.plotly_chart(common.time_chart(peaks, "peak", f"Error bursts: most error lines in any {length} s",
                                                 "lines in a sliding window", span, "app"), width="stretch")

    live()


page()
