"""What every dashboard page shares: config, store access with clear error states, and URL-backed pickers.

Pickers keep their value in the page URL (``st.query_params``), so a link reproduces the view.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st
from clickhouse_connect.driver.client import Client

from eventide.config import Config, ConfigError, load_config
from store.client import StoreUnavailable, connect

T = TypeVar("T")



def config_or_stop() -> Config:
    try:
        return load_config()
    except ConfigError as exc:
        st.error(str(exc))
        st.stop()
        raise


@contextmanager
def store(config: Config) -> Iterator[Client]:
    """A store client; an unreachable store becomes an error naming the URL tried, and the page stops."""
    try:
        with connect(config) as client:
            yield client
    except StoreUnavailable as exc:
        st.error(f"Store unreachable at {config.store_url}: {exc}")
        st.stop()


def url_select(label: str, key: str, options: Sequence[T], format_func: Callable[[T], str] = str,
               to_param: Callable[[T], str] = str) -> T:
    """A sidebar selectbox whose choice lives in the URL as ``?key=...``."""
    params = [to_param(o) for o in options]
    wanted = st.query_params.get(key)
    index = params.index(wanted) if wanted in params else 0
    chosen = st.sidebar.selectbox(label, options, index=index, format_func=format_func, key=f"url_{key}")
    st.query_params[key] = to_param(chosen)
    return chosen


def range_minutes(config: Config) -> int:
    """The sidebar's "last N minutes" slider (``?minutes=N`` in the URL)."""
    try:
        default = int(st.query_params.get("minutes", config.dashboard.default_range_minutes))
    except ValueError:
        default = config.dashboard.default_range_minutes
    minutes = st.sidebar.slider("Last minutes", 1, 24 * 60, min(max(default, 1), 24 * 60), key="url_minutes")
    st.query_params["minutes"] = str(minutes)
    return minutes


def start_page(title: str, note: str | Callable[[Config], str] | None = None) -> tuple[Config, int]:
    """What every time-range page starts with: its title, the config, the range slider (and a sidebar note)."""
    st.title(title)
    config = config_or_stop()
    minutes = range_minutes(config)
    if note:
        st.sidebar.caption(note(config) if callable(note) else note)
    return config, minutes


def refreshing(config: Config) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Decorator: the page part that re-runs every ``dashboard.refresh_s`` (a Streamlit fragment)."""
    return st.fragment(run_every=timedelta(seconds=config.dashboard.refresh_s))


def bucket_seconds(client: Client, minutes: int) -> tuple[list[int], int]:
    """(stored tumbling lengths in ms, the chart bucket in s for a range of ``minutes``)."""
    from dashboard.queries import overview_resolution_s, window_lengths_ms

    lengths = window_lengths_ms(client)
    return lengths, overview_resolution_s(lengths, minutes)


def last(minutes: int) -> tuple[datetime, datetime]:
    """(now − minutes, now): computed at each refresh, so an auto-refreshing chart moves with time."""
    until = datetime.now(UTC)
    return until - timedelta(minutes=minutes), until


def time_chart(df: pd.DataFrame, y: str, title: str, unit: str, colour: str | None = None,
               kind: str = "line", height: int = 300) -> go.Figure:
    """A line (or bar) chart over the ``t`` column, one trace per value of ``colour``."""
    draw = px.bar if kind == "bar" else px.line
    fig = draw(df, x="t", y=y, color=colour, title=title)
    fig.update_layout(height=height, yaxis_title=unit, xaxis_title="UTC", legend={"orientation": "h"},
                      margin={"l": 40, "r": 20, "t": 50, "b": 40})
    return fig


def histogram(df: pd.DataFrame, x: str, title: str, colour: str | None = None, log_y: bool = True) -> go.Figure:
    fig = px.histogram(df, x=x, color=colour, title=title, log_y=log_y, nbins=60)
    fig.update_layout(height=300, bargap=0.05, legend={"orientation": "h"},
                      margin={"l": 40, "r": 20, "t": 50, "b": 40})
    return fig
