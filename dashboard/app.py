"""Streamlit dashboard: rate and percentiles over time for a chosen series and resolution.

Run with ``eventide dashboard`` (or ``streamlit run dashboard/app.py``); reads the store named in the config.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import plotly.graph_objects as go
import streamlit as st

from dashboard import queries
from eventide.config import ConfigError, load_config
from store.client import StoreUnavailable, connect


def _line_chart(df, columns: list[str], title: str, unit: str) -> go.Figure:
    fig = go.Figure()
    for col in columns:
        fig.add_trace(go.Scatter(x=df["window_start"], y=df[col], mode="lines+markers", name=col))
    fig.update_layout(title=title, yaxis_title=unit, xaxis_title="window start (UTC)", height=340,
                      margin={"l": 40, "r": 20, "t": 50, "b": 40}, legend={"orientation": "h"})
    return fig


def main() -> None:
    st.set_page_config(page_title="eventide", layout="wide")
    st.title("eventide · live metrics")
    try:
        config = load_config()
    except ConfigError as exc:
        st.error(str(exc))
        return
    try:
        with connect(config) as client:
            series = queries.list_series(client)
            lengths = queries.window_lengths_ms(client)
            dead = queries.dead_letter_count(client)
    except StoreUnavailable as exc:
        st.error(f"Store unreachable: {exc}")
        return
    if not series:
        st.info(f"No windows yet in {config.store_url}. Start the job and send events (`./run demo`); "
                "the first windows appear once a micro-batch has run.")
        return
    with st.sidebar:
        chosen = st.selectbox("Series", series, format_func=lambda s: s.label)
        resolution_s = st.selectbox("Resolution", queries.resolutions_s(lengths), format_func=lambda n: f"{n} s")
        minutes = st.slider("Last minutes", 1, 24 * 60, config.dashboard.default_range_minutes)
        st.caption(f"dead-lettered records: {dead}")
        st.caption(f"store: {config.store_url}")

    @st.fragment(run_every=timedelta(seconds=config.dashboard.refresh_s))
    def charts() -> None:
        until = datetime.now(UTC)
        since = until - timedelta(minutes=minutes)
        try:
            with connect(config) as client:
                df = queries.series_buckets(client, chosen, resolution_s, since, until)
        except StoreUnavailable as exc:
            st.error(f"Store unreachable: {exc}")
            return
        if df.empty:
            st.info("No windows for this series in the chosen range.")
            return
        left, right = st.columns(2)
        left.plotly_chart(_line_chart(df, ["rate"], f"Rate · {chosen.label}", "events / s"), width="stretch")
        right.plotly_chart(_line_chart(df, ["p50", "p99"], f"Percentiles · {chosen.label}", "value"),
                           width="stretch")
        st.caption(f"{len(df)} buckets of {resolution_s} s (merged sketches) · "
                   f"refreshes every {config.dashboard.refresh_s:g} s")

    charts()


main()
