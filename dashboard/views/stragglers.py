"""Stragglers & clocks: what the watermark dropped, how late it was, which windows late events corrected, and
whose clocks are off.

A dropped straggler is an event whose window had already closed (BRIEF §3); the job counts each one exactly.
Device clock offsets are ``received_time − sent_time`` per device (positive: the device clock is behind).
"""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from dashboard import common
from dashboard.data.stragglers import stragglers_data
from dashboard.figure_cache import reused
from dashboard.live import last_minutes_when_new
from store import pipeline


@reused
def worst_clocks_chart(worst: pd.DataFrame) -> go.Figure:
    """The devices whose clocks are most off, one bar each."""
    fig = px.bar(worst, x="offset_s", y=(worst["app"] + " · " + worst["device"]).map(common.plot_text),
                 orientation="h", title="Worst device clocks (s off)", labels={"y": "device", "offset_s": "offset (s)"})
    fig.update_yaxes(type="category")     # device names, whatever they look like
    return common.chart_layout(fig)


def page() -> None:
    config, minutes = common.start_page("Stragglers & clocks",
                                        lambda c: f"allowed lateness: {c.stream.allowed_lateness_s:g} s")

    @common.refreshing(config)
    def live() -> None:
        batches, ((since, until), data) = last_minutes_when_new(
            config, "stragglers", (pipeline.WINDOWS_QUERY,), minutes, (), stragglers_data)
        # stragglers of every window kind, accept's clocks
        common.show_freshness(config, batches, *pipeline.QUERIES)
        resolution, dropped, lateness = data.resolution_s, data.dropped, data.lateness
        worst_windows, clocks, corrected = data.worst_windows, data.clocks, data.corrected
        st.subheader("Dropped stragglers")
        if dropped.empty:
            st.info("No stragglers dropped in the chosen range.")
        else:
            left, right = st.columns(2)
            left.plotly_chart(common.time_chart(dropped, "dropped", f"Dropped per {resolution} s by window kind",
                                                "events", (since, until), "window_kind", kind="bar",
                                                bucket_s=resolution), width="stretch")
            right.plotly_chart(common.histogram(lateness, "lateness_s", "Lateness behind the watermark (s)",
                                                "window_kind"), width="stretch")
            st.caption("Windows that lost the most events")
            st.dataframe(common.shown(worst_windows), hide_index=True, width="stretch")
        st.subheader("Corrections")
        if corrected.empty:
            st.info("No window was corrected by late events in the chosen range.")
        else:
            st.plotly_chart(common.time_chart(corrected, "windows", f"Windows corrected by late events per "
                                              f"{resolution} s", "windows re-published", (since, until),
                                              "window_kind", kind="bar", bucket_s=resolution), width="stretch")
        st.subheader("Device clocks")
        if clocks.empty:
            st.info("No device clock offsets in the chosen range yet.")
            return
        left, right = st.columns(2)
        left.plotly_chart(common.histogram(clocks, "offset_s", "Clock offset per device (s)", "app", log_y=False),
                          width="stretch")
        right.plotly_chart(worst_clocks_chart(clocks.head(15).iloc[::-1]), width="stretch")

    live()


page()
