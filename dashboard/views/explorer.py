"""Metric explorer: rate, percentiles and distinct users over time for any series, at any resolution.

A bucket as long as a stored tumbling window is that window; a longer one is merged from its windows' sketches
(``store.range_query``): percentiles are never averaged.
"""

from __future__ import annotations

from datetime import datetime

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboard import common, queries
from dashboard.data.explorer import explorer_catalog, explorer_data
from dashboard.figure_cache import reused
from dashboard.live import last_minutes_when_new
from store import pipeline
from store.range_query import SeriesKey


@reused
def line_chart(df: pd.DataFrame, columns: list[str], title: str, unit: str, span: tuple[datetime, datetime],
               x_title: str = "window start (UTC)") -> go.Figure:
    """One line per column over ``window_start``, across the chosen range ``span``."""
    fig = go.Figure()
    for col in columns:
        fig.add_trace(go.Scatter(x=df["window_start"], y=df[col], mode="lines+markers", name=col))
    fig.update_layout(title=title, yaxis_title=unit)
    return common.time_axis(common.chart_layout(fig, height=340), span, x_title)


def _param(series: SeriesKey) -> str:
    return "|".join((series.app, series.kind, series.name, series.series_tags))


def page() -> None:
    st.title("Metric explorer")
    config = common.config_or_stop()
    picked = common.page_data(config, explorer_catalog)
    catalog = picked.catalog
    series, lengths = catalog.series, catalog.lengths_ms
    if series:
        chosen = common.url_select("Series", "series", series, lambda s: s.label, _param)
        hopping = catalog.hopping.get(chosen, [])
    if not series:
        common.show_freshness(config, picked.batches or {}, pipeline.WINDOWS_QUERY)
        st.info(f"No windows yet in {common.store_origin(config)}. Start the job and send events (`./run demo`); "
                "the first windows appear once a micro-batch has run.")
        return
    kinds = ["tumbling", *(["hopping"] if hopping else []), "sliding"]
    kind = common.url_select("Window kind", "kind", kinds)
    resolution_s: int | None = None
    spec: tuple[int, int] | None = None
    if kind == "tumbling":
        resolution_s = common.url_select("Resolution", "resolution", queries.resolutions_s(lengths),
                                         lambda n: f"{n} s")
    elif kind == "hopping":
        spec = common.url_select("Hopping window", "hopping", hopping,
                                 lambda s: f"{s[0] // 1000} s every {s[1] // 1000} s", lambda s: f"{s[0]}-{s[1]}")
    minutes = common.range_minutes(config)
    st.sidebar.caption(f"store: {common.store_origin(config)}")

    @common.refreshing(config)
    def charts() -> None:
        query = pipeline.KEYED_WINDOWS_QUERY if kind == "sliding" else pipeline.WINDOWS_QUERY
        batches, (span, data) = last_minutes_when_new(
            config, "explorer", query, minutes, (chosen, kind, lengths, resolution_s, spec), explorer_data, chosen,
            kind, lengths_ms=lengths, resolution_s=resolution_s, hopping=spec)
        common.show_freshness(config, batches, query)
        df = data.windows
        if df.empty:
            st.info(f"No {kind} windows for this series in the chosen range.")
            return
        left, right = st.columns(2)
        label = common.plot_text(chosen.label)      # app, logger and tag names from the store, in chart titles
        if kind == "sliding":
            df = df.rename(columns={"window_end": "window_start"})
            length = int(df["window_s"].iloc[0])
            left.plotly_chart(line_chart(df, ["rate"], f"Rate over the trailing {length} s · {label}",
                                         "events / s", span, "event time (window end, UTC)"), width="stretch")
            value_columns = ["mean", "max"] if chosen.kind == "metric" else ["errors"]
            right.plotly_chart(line_chart(df, value_columns, f"Trailing {length} s · {label}", "value",
                                          span, "event time (window end, UTC)"), width="stretch")
            st.caption(f"{len(df)} sliding windows (one per event; quantiles and distinct counts are kept for "
                       "tumbling and hopping windows only)")
            return
        left.plotly_chart(line_chart(df, ["rate"], f"Rate · {label}", "events / s", span), width="stretch")
        right.plotly_chart(line_chart(df, ["p50", "p90", "p99"], f"Percentiles · {label}", "value", span),
                           width="stretch")
        st.plotly_chart(line_chart(df, ["distinct_users"], f"Distinct users · {label}", "users", span),
                        width="stretch")
        if kind == "tumbling":
            source = "stored windows" if resolution_s * 1000 in lengths else "merged sketches"
            st.caption(f"{len(df)} buckets of {resolution_s} s ({source})")
        else:
            st.caption(f"{len(df)} hopping windows of {spec[0] // 1000} s every {spec[1] // 1000} s "
                       "(each window's own sketches)")

    charts()


page()
