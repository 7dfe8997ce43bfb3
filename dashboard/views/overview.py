"""Overview: is data flowing, is the pipeline keeping up, is anything on fire?

Events/s and error-log rate per app, dropped stragglers, dead-letter rate, duplicates per app and minute, pipeline
freshness (now − watermark), consumer lag per partition, records lost to Kafka retention and the alerts firing.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import streamlit as st

from dashboard import common, log_search, queries
from dashboard.data.overview import overview_data
from dashboard.live import last_minutes_when_new
from store import pipeline


def page() -> None:
    config, minutes = common.start_page("Overview", lambda c: f"store: {common.store_origin(c)}")

    @common.refreshing(config)
    def live() -> None:
        batches, ((since, until), data) = last_minutes_when_new(
            config, "overview", pipeline.WINDOW_ROWS, minutes, (), overview_data)
        # windows, and accept's dead letters and duplicates; the rate charts are tumbling rows
        common.show_freshness(config, batches, *pipeline.QUERIES, sooner={"tumbling windows": pipeline.WINDOW_ROWS})
        resolution, rates, dropped, dead = data.resolution_s, data.rates, data.dropped, data.dead
        duplicates, marks, states, lag, loss = data.duplicates, data.watermarks, data.alert_states, data.lag, data.loss
        now = datetime.now(UTC)
        cols = st.columns(5)
        mark = marks.get(pipeline.WINDOWS_QUERY)
        cols[0].metric("freshness (now − watermark)", f"{(now - mark).total_seconds():.0f} s" if mark else "—")
        cols[1].metric("consumer lag (records)", f"{sum(lag.values()):,}" if lag else "—")
        cols[2].metric("alerts firing", int((states["state"] == "firing").sum()) if not states.empty else 0)
        cols[3].metric("dead letters in range", f"{dead['per_s'].sum() * resolution:,.0f}" if not dead.empty else "0")
        cols[4].metric("records lost to Kafka retention", f"{loss.skipped:,}")
        if loss.skipped:
            # Shown before the "no windows" early return: a job that lost its input may have written no windows.
            st.error("Kafka deleted these records (retention) before the job read them: they are gone and missing "
                     "from every window. The job fell further behind than `kafka.events_retention_ms`; raise it "
                     "and watch the consumer lag (docs/operations.md, \"Retention and lag\"). Counts are Kafka "
                     "offsets, which may include transaction markers.")
            st.dataframe(common.shown(loss.ranges), hide_index=True, width="stretch")
        if rates.empty:
            st.info(f"No windows yet in {common.store_origin(config)}. Start the job and send events (`./run demo`).")
            return
        span = (since, until)
        left, right = st.columns(2)
        chart = common.time_chart
        left.plotly_chart(chart(rates, "events_per_s", "Events/s per app", "events / s", span, "app"),
                          width="stretch")
        errors = chart(rates, "errors_per_s", "Error + critical log lines/s per app", "lines / s", span, "app")
        if picked := [(app, common.bucket_start(t, resolution))
                      for app, t in common.drill_chart(right, errors, "overview_errors")]:
            # A click on an app's point opens the Logs page on that app's error lines of that bucket.
            st.switch_page(common.LOGS_PAGE_SCRIPT, query_params=log_search.logs_params(
                apps=dict.fromkeys(app for app, _ in picked), levels=("error", "critical"),
                since=min(t for _, t in picked), until=max(t for _, t in picked) + timedelta(seconds=resolution)))
        left, right = st.columns(2)
        if dropped.empty:
            left.info("No dropped stragglers in the chosen range.")
        else:
            left.plotly_chart(chart(dropped, "dropped", f"Dropped stragglers per {resolution} s", "events", span,
                                    "window_kind", "bar", resolution), width="stretch")
        if dead.empty:
            right.info("No dead letters in the chosen range.")
        else:
            right.plotly_chart(chart(dead, "per_s", "Dead-letter rate", "records / s", span), width="stretch")
        if duplicates.empty:
            st.info("No duplicates (re-sent events, same id) in the chosen range.")
        else:
            st.plotly_chart(chart(duplicates, "duplicates", "Duplicates per minute per app (re-sent, counted once)",
                                  "records", span, "app", "bar", queries.DUPLICATE_BUCKET_S), width="stretch")
        if lag:
            st.plotly_chart(common.partition_chart(lag), width="stretch")
        elif data.lag_error:
            st.warning(f"Consumer lag unknown: Kafka at {config.kafka.bootstrap} did not answer ({data.lag_error}).")
        firing = states[states["state"] == "firing"] if not states.empty else states
        if not firing.empty:
            st.subheader("Alerts firing")
            st.dataframe(common.shown(firing), hide_index=True, width="stretch")
        st.caption(f"buckets of {resolution} s · click a point of the error chart to read its lines")

    live()


page()
