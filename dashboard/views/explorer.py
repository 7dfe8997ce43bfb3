"""Metric explorer: rate, percentiles and distinct users over time for any series, at any resolution; for a log
series its lines per level and error ratio.

A bucket as long as a stored tumbling window is that window; a longer one is merged from its windows' sketches
(``store.range_query``): percentiles are never averaged.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboard import common, log_search, queries
from dashboard.data.explorer import explorer_catalog, explorer_data
from dashboard.figure_cache import reused
from dashboard.live import last_minutes_when_new
from eventide.envelope import LEVELS
from store import pipeline
from store.range_query import SeriesKey


@reused
def line_chart(df: pd.DataFrame, columns: list[str], title: str, unit: str, span: tuple[datetime, datetime],
               x_title: str = "window start (UTC)", empty: str = common.NOTHING_TO_DRAW) -> go.Figure:
    """One line per column over ``window_start``, across the chosen range ``span``; ``empty`` says why when no
    column has a value."""
    fig = go.Figure()
    for col in columns:
        fig.add_trace(go.Scatter(x=df["window_start"], y=df[col], mode="lines+markers", name=col))
    fig.update_layout(title=title, yaxis_title=unit)
    return common.time_axis(common.chart_layout(fig, height=340, empty=empty), span, x_title)


def _log_charts(left: Any, right: Any, df: pd.DataFrame, series: SeriesKey, label: str,
                span: tuple[datetime, datetime]) -> None:
    """What a log series has, in the page's two columns: its lines per level, its error ratio and a link to the
    lines themselves (a percentile or a distinct-user count of log lines means nothing)."""
    levels = [level for level in LEVELS if df[level].any()] or ["info"]
    left.plotly_chart(line_chart(df, levels, f"Lines per level · {label}", "lines", span), width="stretch")
    errors = (df["error"] + df["critical"]) / df["event_count"].where(df["event_count"] > 0)
    right.plotly_chart(line_chart(df.assign(error_ratio=errors), ["error_ratio"], f"Error ratio · {label}",
                                  "(error + critical) / lines", span), width="stretch")
    link = log_search.logs_url(apps=[series.app], names=[series.name], since=span[0], until=span[1])
    st.markdown(f":material/search: [Open these lines on the Logs page]({link})")


def _param(series: SeriesKey) -> str:
    return "|".join((series.app, series.kind, series.name, series.series_tags))


def page() -> None:
    st.title("Metric explorer")
    config = common.config_or_stop()
    minutes = common.range_minutes(config)
    picked = common.page_data(config, explorer_catalog, common.last(minutes)[0])
    catalog = picked.catalog
    if not catalog.series:
        common.show_freshness(config, picked.batches or {}, pipeline.WINDOWS_QUERY)
        st.info(f"No windows yet in {common.store_origin(config)}. Start the job and send events (`./run demo`); "
                "the first windows appear once a micro-batch has run.")
        return
    # Grouped by app, then kind (metrics first); it opens on the busiest metric of the range, where percentiles
    # and distinct users mean something.
    listed = sorted(catalog.series, key=lambda s: (s.app, s.kind != "metric", s.kind, s.name, s.series_tags))
    chosen = common.url_select(
        "Series", "series", listed, lambda s: f"{s.label} · {catalog.events.get(s, 0):,} events", _param,
        default=catalog.busiest("metric") or catalog.series[0])
    st.sidebar.caption(f"Events in the last {minutes} min beside each series.")
    hopping, lengths = catalog.hopping.get(chosen, []), catalog.lengths_ms
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
    st.sidebar.caption(f"store: {common.store_origin(config)}")

    @common.refreshing(config)
    def charts() -> None:
        query = pipeline.KEYED_WINDOWS_QUERY if kind == "sliding" else pipeline.WINDOWS_QUERY
        follows = (query,) if kind == "sliding" else pipeline.WINDOW_ROWS
        batches, (span, data) = last_minutes_when_new(
            config, "explorer", follows, minutes, (chosen, kind, lengths, resolution_s, spec), explorer_data, chosen,
            kind, lengths_ms=lengths, resolution_s=resolution_s, hopping=spec)
        common.show_freshness(config, batches, query,
                              sooner=None if kind == "sliding" else {f"{kind} windows": pipeline.WINDOW_ROWS})
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
        if chosen.kind == "log":
            _log_charts(left, right, df, chosen, label, span)
        else:
            left.plotly_chart(line_chart(df, ["rate"], f"Rate · {label}", "events / s", span), width="stretch")
            right.plotly_chart(line_chart(df, ["p50", "p90", "p99"], f"Percentiles · {label}", "value", span,
                                          empty="No values: this series' events carry none (counted, not measured)"),
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
