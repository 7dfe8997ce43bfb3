"""Sessions: how many are open now and were active over time, per app; how long ended ones lasted and how many
events they held."""

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
            config, "sessions", pipeline.SESSION_ROWS, minutes, (), sessions_data)
        common.show_freshness(config, batches, pipeline.KEYED_WINDOWS_QUERY,
                              sooner={"open sessions": pipeline.SESSION_ROWS})
        gap_s, resolution, per_app, shapes = config.stream.session_gap_s, data.resolution_s, data.per_app, data.shapes
        if not data.open_now and per_app.empty and data.active.empty:
            st.info("No session yet in the chosen range: a session opens with a user's (or a device's) first "
                    "event and shows here after the job's next batch.")
            return
        cols = st.columns(4)
        cols[0].metric("open now", f"{data.open_now:,}",
                       help=f"sessions whose last event is less than the gap ({gap_s} s) before the watermark")
        cols[1].metric("sessions ended", f"{int(per_app['sessions'].sum()) if not per_app.empty else 0:,}")
        cols[2].metric("median duration", f"{shapes['duration_s'].median():.0f} s" if not shapes.empty else "—")
        cols[3].metric("median events", f"{shapes['event_count'].median():.0f}" if not shapes.empty else "—")
        st.plotly_chart(common.time_chart(data.active, "sessions", f"Active sessions per {resolution} s by app",
                                          "sessions", (since, until), "app"), width="stretch")
        if data.open_now:
            st.subheader("Open sessions")
            st.caption(f"as of the job's latest accepted batch, the {len(data.newest_open):,} with the latest "
                       f"events; each closes once the watermark passes its last event + {gap_s} s, and is then "
                       "counted as ended")
            st.dataframe(common.shown(data.newest_open), hide_index=True, width="stretch", height=260)
        if per_app.empty:
            st.info(f"No session ended in the chosen range yet (a session ends once the watermark passes its last "
                    f"event + {gap_s} s).")
            return
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
