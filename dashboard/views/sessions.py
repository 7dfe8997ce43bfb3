"""Sessions: how many per app, how long they last, how many events they hold (sessions that ended in range)."""

from __future__ import annotations

import streamlit as st

from dashboard import common, queries
from dashboard.data.sessions import sessions_data
from dashboard.live import last_minutes_when_new
from store import pipeline


def page() -> None:
    config, minutes = common.start_page("Sessions", lambda c: f"session gap: {c.stream.session_gap_s} s")

    @common.refreshing(config)
    def live() -> None:
        batches, ((since, until), data) = last_minutes_when_new(
            config, "sessions", pipeline.KEYED_WINDOWS_QUERY, minutes, (), sessions_data)
        common.show_freshness(config, batches, pipeline.KEYED_WINDOWS_QUERY)
        resolution, per_app, shapes = data.resolution_s, data.per_app, data.shapes
        if per_app.empty:
            st.info("No sessions ended in the chosen range yet (a session ends once the watermark passes its "
                    f"last event + {config.stream.session_gap_s} s).")
            return
        cols = st.columns(3)
        cols[0].metric("sessions ended", f"{int(per_app['sessions'].sum()):,}")
        cols[1].metric("median duration", f"{shapes['duration_s'].median():.0f} s")
        cols[2].metric("median events", f"{shapes['event_count'].median():.0f}")
        st.plotly_chart(common.time_chart(per_app, "sessions", f"Sessions ended per {resolution} s by app",
                                          "sessions", (since, until), "app", kind="bar", bucket_s=resolution),
                        width="stretch")
        left, right = st.columns(2)
        left.plotly_chart(common.histogram(shapes, "duration_s", "Session duration (s)", "app"), width="stretch")
        right.plotly_chart(common.histogram(shapes, "event_count", "Events per session", "app"), width="stretch")
        if len(shapes) == queries.DISTRIBUTION_ROWS:
            st.caption(f"medians and distributions: the newest {queries.DISTRIBUTION_ROWS:,} sessions of the range")

    live()


page()
