"""What every dashboard page shares: config, store access with clear error states, and URL-backed pickers.

Pickers keep their value in the page URL (``st.query_params``), so a link reproduces the view.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

from dashboard.data.reader import Reader
from dashboard.figure_cache import reused
from dashboard.log_search import naive_utc
from eventide.config import Config, ConfigError, load_config
from eventide.redaction import scrub_url, url_origin
from store.client import StoreUnavailable

T = TypeVar("T")
P = ParamSpec("P")


def config_or_stop() -> Config:
    try:
        return load_config()
    except ConfigError as exc:
        st.error(str(exc))
        st.stop()
        raise


def page_data(config: Config, data: Callable[Concatenate[Reader, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``data(reader, *args, **kwargs)``: a page's data function (``dashboard.data``) reading the store as the
    dashboard's reader (it never writes); an unreachable store becomes an error naming the URL tried, and the page
    stops."""
    try:
        return data(Reader(config), *args, **kwargs)
    except StoreUnavailable as exc:
        _unreachable(config, exc)
        raise


def _unreachable(config: Config, exc: StoreUnavailable) -> None:
    st.error(f"Store unreachable at {store_origin(config)}: {literal(scrub_url(str(exc), config.store_url))}")
    st.stop()


def store_origin(config: Config) -> str:
    """The store as a page may show it: scheme, host and port, never a ``user:password@`` of ``store.url``."""
    return url_origin(config.store_url)


def literal(text: object) -> str:
    """``text`` as Markdown that shows it verbatim, for text from a URL parameter or from the store (log
    messages, app names, tags, rule names) inside ``st.markdown``, ``st.caption``, ``st.info``, ``st.error``...

    An inline code span: its content is never parsed, so no link, image, emphasis, HTML, math or GFM autolink
    (a bare ``http://...``, which backslash escapes do not stop) can come out of it. Its fence is one backtick
    longer than the longest run inside, and line breaks become spaces: a blank line would end the paragraph
    before the span is closed and leave the rest to the Markdown parser. Use it after some text of the caller's
    own, not at the start of a block."""
    flat = " ".join(str(text).splitlines())
    fence = "`" * (max((len(run) for run in re.findall("`+", flat)), default=0) + 1)
    return f"{fence} {flat} {fence}"


def url_select(label: str, key: str, options: Sequence[T], format_func: Callable[[T], str] = str,
               to_param: Callable[[T], str] = str, default: T | None = None) -> T:
    """A sidebar selectbox whose choice lives in the URL as ``?key=...``; without one, ``default`` (or the first)."""
    params = [to_param(o) for o in options]
    wanted = st.query_params.get(key)
    index = params.index(wanted) if wanted in params else options.index(default) if default in options else 0
    chosen = st.sidebar.selectbox(label, options, index=index, format_func=format_func, key=f"url_{key}")
    st.query_params[key] = to_param(chosen)
    return chosen


def url_multiselect(label: str, key: str, options: Sequence[str], container: Any = None) -> list[str]:
    """A multiselect whose choices live in the URL as repeated ``?key=a&key=b``. A value the URL names but the
    options lack (a link to an app with no lines in the range) is offered too, so the link's filter still shows.

    The URL gives the first value only: afterwards the widget's own state (or :func:`url_widgets_follow`) holds it,
    and a default given beside a state set in code would be refused with a warning."""
    state = f"url_{key}"
    box = container or st.sidebar
    if state in st.session_state:
        offered = list(dict.fromkeys([*options, *st.session_state[state]]))
        chosen = box.multiselect(label, offered, key=state)
    else:
        wanted = st.query_params.get_all(key)
        chosen = box.multiselect(label, list(dict.fromkeys([*options, *wanted])), default=wanted, key=state)
    set_url_list(key, chosen)
    return chosen


def url_text(label: str, key: str, container: Any = None, max_chars: int | None = None, help: str | None = None,
             many: bool = False) -> str:
    """A text input whose text lives in the URL as ``?key=...`` (absent when empty); ``many``: each of its
    space-separated items is a ``?key=`` of its own."""
    state = f"url_{key}"
    box = container or st.sidebar
    if state in st.session_state:
        text = box.text_input(label, max_chars=max_chars, key=state, help=help)
    else:
        value = " ".join(st.query_params.get_all(key)) if many else st.query_params.get(key, "")
        text = box.text_input(label, value, max_chars=max_chars, key=state, help=help)
    set_url_list(key, text.split() if many else [text] if text else [])
    return text


def url_toggle(label: str, key: str, container: Any = None, help: str | None = None) -> bool:
    """A toggle whose state lives in the URL as ``?key=1`` (absent when off)."""
    state = f"url_{key}"
    box = container or st.sidebar
    if state in st.session_state:
        on = box.toggle(label, key=state, help=help)
    else:
        on = box.toggle(label, value=st.query_params.get(key) == "1", key=state, help=help)
    set_url_list(key, ["1"] if on else [])
    return on


def set_url_list(key: str, values: Sequence[str]) -> None:
    """``?key=`` repeated once per value; removed when there is none."""
    if values:
        st.query_params[key] = list(values)
    elif key in st.query_params:
        del st.query_params[key]


def url_widgets_follow(lists: Sequence[str] = (), texts: Sequence[str] = (), many: Sequence[str] = ()) -> None:
    """After code rewrote the URL (a drill-down), set the URL-backed widgets of these keys to what it now says:
    ``lists`` multiselects, ``texts`` text inputs, ``many`` text inputs of space-separated items. Only before the
    widgets of this run are drawn (Streamlit then sends the new values to the browser)."""
    for key in lists:
        st.session_state[f"url_{key}"] = st.query_params.get_all(key)
    for key in texts:
        st.session_state[f"url_{key}"] = st.query_params.get(key, "")
    for key in many:
        st.session_state[f"url_{key}"] = " ".join(st.query_params.get_all(key))


def selected_points(state: Any, names: Sequence[str]) -> list[tuple[str, datetime]]:
    """(trace name, x as a UTC datetime) of each point selected in a time chart drawn with ``on_select`` (``state``:
    the chart's selection state; ``names``: its traces' names, by curve number): the series and bucket chosen."""
    points = ((state or {}).get("selection") or {}).get("points") or []
    chosen = []
    for point in points:
        curve, x = point.get("curve_number"), point.get("x")
        if curve is None or x is None or not 0 <= curve < len(names):
            continue
        t = pd.Timestamp(x)
        t = t.tz_localize("UTC") if t.tzinfo is None else t.tz_convert("UTC")
        chosen.append((names[curve], t.to_pydatetime()))
    return chosen


def bucket_start(t: datetime, bucket_s: int) -> datetime:
    """The start of the ``bucket_s`` bucket holding ``t`` (buckets aligned to the epoch, as ``toStartOfInterval``):
    a clicked bar reports its middle, not the bucket it stands for."""
    seconds = t.timestamp()
    return datetime.fromtimestamp(seconds - seconds % bucket_s, UTC)


def drill_chart(container: Any, fig: go.Figure, key: str) -> list[tuple[str, datetime]]:
    """Draw a time chart whose points can be clicked (shift-click adds more); the (trace name, time) pairs a click
    just selected, once (empty on every other run).

    Read in the selection's callback: Streamlit identifies a chart by its figure too, and a refreshed figure (the
    range ends at "now") is a new chart whose selection starts empty, so the script would never see the click.
    Points only: with a box or lasso mode as well, Streamlit makes a drag select and a click select nothing.
    """
    # Plotly selects markers, never a bare line: a line trace gets small markers, its points to click.
    fig.update_traces(mode="lines+markers", marker_size=5, selector={"type": "scatter", "mode": "lines"})
    names = [html.unescape(str(trace.name)) for trace in fig.data]     # as stored: see plot_text
    picked = f"{key}__picked"

    def on_select() -> None:
        st.session_state[picked] = selected_points(st.session_state.get(key), names)

    container.plotly_chart(fig, width="stretch", key=key, on_select=on_select, selection_mode="points")
    return st.session_state.pop(picked, [])


LOGS_PAGE_SCRIPT = "views/logs.py"
"""The Logs page's script, relative to dashboard/app.py (what ``st.switch_page`` takes)."""


MAX_RANGE_MINUTES = 24 * 60


def longest_range_minutes(config: Config) -> int:
    """The longest range the picker offers: a day, and never more than the shortest retention of the tables the
    pages read (``[retention]``), so no range asks for rows the store has already deleted."""
    return max(1, min(MAX_RANGE_MINUTES, int(config.retention.shortest_days * 24 * 60)))


def range_minutes(config: Config) -> int:
    """The sidebar's "last N minutes" slider (``?minutes=N`` in the URL, held within ``longest_range_minutes``)."""
    longest = longest_range_minutes(config)
    try:
        default = int(st.query_params.get("minutes", config.dashboard.default_range_minutes))
    except ValueError:
        default = config.dashboard.default_range_minutes
    minutes = st.sidebar.slider("Last minutes", 1, longest, min(max(default, 1), longest), key="url_minutes")
    st.query_params["minutes"] = str(minutes)
    if longest < MAX_RANGE_MINUTES:
        st.sidebar.caption(f"Ranges up to {longest} min: the store keeps some of this data only "
                           f"{config.retention.shortest_days:g} days (`[retention]`).")
    return minutes


def start_page(title: str, note: str | Callable[[Config], str] | None = None) -> tuple[Config, int]:
    """What every time-range page starts with: its title, the config, the range slider (and a sidebar note)."""
    st.title(title)
    config = config_or_stop()
    minutes = range_minutes(config)
    if note:
        st.sidebar.caption(note(config) if callable(note) else note)
    return config, minutes


# Refresh and freshness -------------------------------------------------------------------------------------------

REFRESH_CHOICES_S = (1.0, 2.0, 5.0, 10.0, 30.0)
"""What the sidebar's "Refresh every" offers, besides the configured ``dashboard.refresh_s`` and "off"."""
REFRESH_STATE = "refresh_s"
"""The session's chosen interval (None: off). Not the widget's own key: a widget's state is dropped on a page
switch, and the choice must survive it."""
REFRESH_PARAM = "refresh"
"""The choice in the URL: ``?refresh=2`` or ``?refresh=off``, so a link opens with it."""


def refresh_options(config: Config) -> list[float | None]:
    """The intervals a user may pick, shortest first, then None ("off"). Only these: a URL cannot ask the server for
    a refresh every millisecond."""
    return [*sorted({*REFRESH_CHOICES_S, float(config.dashboard.refresh_s)}), None]


def refresh_label(interval_s: float | None) -> str:
    """An interval as the sidebar and the freshness line show it: ``2 s``, ``off``."""
    return "off" if interval_s is None else f"{interval_s:g} s"


def parse_refresh(param: str | None, options: Sequence[float | None], default: float) -> float | None:
    """The interval a ``?refresh=`` value names, if it is one of ``options``; otherwise ``default``."""
    if param == refresh_label(None):
        return None
    try:
        wanted = float(param) if param is not None else default
    except ValueError:
        return default
    return wanted if wanted in options else default


def refresh_interval(config: Config) -> float | None:
    """The sidebar's "Refresh every" picker: seconds between refreshes of the page's charts, None when off.

    Starts at the URL's ``?refresh=``, else ``dashboard.refresh_s``; the choice is kept for the session (every page
    uses it) and written back to the URL."""
    options = refresh_options(config)
    if st.session_state.get(REFRESH_STATE, -1) not in options:
        st.session_state[REFRESH_STATE] = parse_refresh(st.query_params.get(REFRESH_PARAM), options,
                                                        float(config.dashboard.refresh_s))
    # Labels, not the intervals: "off" as a None option would read as "nothing selected". A keyed widget's identity
    # is its key (and page), so on a later run of the page it keeps what the user picked whatever the index says;
    # the index only places a new page's picker on the session's choice.
    labels = [refresh_label(o) for o in options]
    label = st.sidebar.selectbox("Refresh every", labels, index=options.index(st.session_state[REFRESH_STATE]),
                                 key=f"url_{REFRESH_PARAM}",
                                 help="How often the charts reload in place; off: only when the page is used")
    interval = options[labels.index(label)]
    st.session_state[REFRESH_STATE] = interval
    st.query_params[REFRESH_PARAM] = refresh_label(interval).removesuffix(" s")
    return interval


def refreshing(config: Config) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Decorator: the page part that re-runs in place (a Streamlit fragment) at the interval of the sidebar's
    "Refresh every" (drawn here), never when it is off. Changing it re-runs the page, which registers the fragment
    again with the new interval (the browser drops the old timer on a full run)."""
    return refreshing_every(refresh_interval(config))


def refreshing_every(interval_s: float | None) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Decorator: a page part that re-runs in place every ``interval_s`` seconds, never when None. A page's second
    refreshing part takes the interval its first one's picker chose (:func:`chosen_refresh_interval`): the picker
    is drawn once per page."""
    return st.fragment(run_every=timedelta(seconds=interval_s) if interval_s is not None else None)


def chosen_refresh_interval() -> float | None:
    """The interval the sidebar's "Refresh every" holds for this session (None: off, or not drawn yet)."""
    return st.session_state.get(REFRESH_STATE)


@dataclass(frozen=True)
class Freshness:
    """What a page says about how current its data is."""

    text: str
    """One line: "data as of 10:42:07 UTC · 3 s behind · refreshes every 2 s", or why there is nothing."""
    level: Literal["fresh", "stale", "none"]
    """``fresh``: a caption; ``stale``: a warning (older than the threshold, or a query with no batch yet);
    ``none``: no query the page reads has stored a batch."""


def age_text(seconds: float) -> str:
    """A duration as a reader takes it in at a glance: ``3 s``, ``4 min``, ``2 h``, ``3 d`` (whole units)."""
    seconds = max(0.0, seconds)
    for unit, length in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= 2 * length:
            return f"{seconds // length:.0f} {unit}"
    return f"{seconds:.0f} s"


def freshness(now: datetime, batches: Mapping[str, datetime], queries: Sequence[str], stale_after_s: float,
              refresh_s: float | None, sooner: Mapping[str, Sequence[str]] | None = None) -> Freshness:
    """How fresh a page's data is at ``now``: as of the oldest of the newest batches (``batches``: when each query's
    last batch was stored, :func:`store.pipeline.last_batches`) of the ``queries`` the page reads; stale once that
    is more than ``stale_after_s`` old; ``refresh_s``: the page's refresh interval (None: off).

    ``sooner``: parts of the page that move more often than the page as a whole, by label, each with the names whose
    newest stamp is its own (e.g. the tumbling rows: the ``windows`` query's batches and ``accept``'s provisional
    rounds). A part at least a second fresher than the page gets its own age on the line, so the line never
    calls a chart older than it is, nor the page fresher than its oldest part."""
    refresh = "refresh off" if refresh_s is None else f"refreshes every {refresh_label(refresh_s)}"
    stored = [batches[q] for q in queries if q in batches]
    if not stored:
        return Freshness(f"No batch stored yet: is the stream job running? (`./run demo` starts it; its first "
                         f"batch lands once events arrive) · {refresh}", "none")
    oldest = min(stored)
    shown = oldest.astimezone(UTC)
    when = shown.strftime("%H:%M:%S" if shown.date() == now.astimezone(UTC).date() else "%Y-%m-%d %H:%M:%S")
    age = (now - oldest).total_seconds()
    parts = ""
    for label, names in (sooner or {}).items():
        if part := [batches[n] for n in names if n in batches]:
            part_age = (now - max(part)).total_seconds()
            if part_age <= age - 1:
                parts += f" · {label} {age_text(part_age)} behind"
    line = f"data as of {when} UTC · {age_text(age)} behind{parts} · {refresh}"
    if missing := [q for q in queries if q not in batches]:
        return Freshness(f"{line} · no batch of {', '.join(missing)} stored yet: is the stream job running?",
                         "stale")
    if age > stale_after_s:
        return Freshness(f"Stale: {line} · no newer batch for over {age_text(stale_after_s)}: is the stream job "
                         "running and keeping up?", "stale")
    return Freshness(line, "fresh")


def stale_after_s(config: Config) -> float:
    """How old the newest batch of a page's queries may get before the page calls its data stale:
    ``dashboard.stale_after_triggers`` trigger intervals of the job."""
    return config.stream.trigger_interval_s * config.dashboard.stale_after_triggers


def show_freshness(config: Config, batches: Mapping[str, datetime], *queries: str,
                   sooner: Mapping[str, Sequence[str]] | None = None) -> None:
    """The page's freshness line (:func:`freshness`) for the stream ``queries`` it reads (names as in
    ``store.pipeline``), from the ``batches`` its data function read (``store.pipeline.last_batches``), with the
    parts that move ``sooner``; draw it first in the page's refreshing fragment, so it updates in place."""
    line = freshness(datetime.now(UTC), batches, queries, stale_after_s(config),
                     st.session_state.get(REFRESH_STATE, config.dashboard.refresh_s), sooner)
    show = {"fresh": st.caption, "stale": st.warning, "none": st.info}[line.level]
    show(line.text)


def last(minutes: int) -> tuple[datetime, datetime]:
    """(now − minutes, now): computed at each refresh, so an auto-refreshing chart moves with time."""
    until = datetime.now(UTC)
    return until - timedelta(minutes=minutes), until


MISSING = "—"
"""What a table cell with nothing in it shows."""


def shown(df: pd.DataFrame, links: Sequence[str] = ()) -> pd.DataFrame:
    """``df`` as a page's table shows it: a missing value (None, NaN, NaT) or an empty text reads :data:`MISSING`,
    where Streamlit would draw "None" or nothing. Only the columns that have one are turned into text; in ``links``
    (link columns) a missing link is an empty cell, which draws no link."""
    out = df
    for column in df.columns:
        values = df[column]
        if column in links:
            if values.isna().any():     # an empty link cell shows nothing, a missing one "None"
                out = df.copy() if out is df else out
                out[column] = values.fillna("")
            continue
        textual = values.dtype == object or pd.api.types.is_string_dtype(values)
        missing = values.isna() | (values.astype(str) == "") if textual else values.isna()
        if missing.any():
            if out is df:
                out = df.copy()
            out[column] = [MISSING if gone else _cell(v) for v, gone in zip(values, missing, strict=True)]
    return out


def _cell(value: Any) -> str:
    if isinstance(value, datetime | pd.Timestamp):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# Chart look ----------------------------------------------------------------------------------------------------
# Every figure goes through chart_layout, every time chart also through time_axis, so a fix applies to all pages.

TITLE_BAND_PX = 40
"""The band at the top of every figure that holds its title; the legend starts under it."""


def legend_under_title(height: int) -> dict[str, Any]:
    """A horizontal legend between the title and the plot, placed in the figure (container) just under the title
    band, so however many rows its entries wrap to, the plot moves down rather than the legend over the title.
    Below the plot it covered the x-axis title and the dates under the ticks."""
    return {"orientation": "h", "xanchor": "left", "x": 0, "yref": "container", "yanchor": "top",
            "y": 1 - TITLE_BAND_PX / height}
MARGIN = {"l": 40, "r": 20, "t": 80, "b": 40}
"""The top margin holds the title and a row or two of legend."""
NO_SUB_SECOND_TICKS = [{"dtickrange": [None, 1000], "value": "%H:%M:%S"}]
"""Plotly labels ticks closer than 1 s with milliseconds (``18:44:49.9998``); nothing here is finer than 1 s."""


def plot_text(text: object) -> str:
    """``text`` as Plotly shows it verbatim in a title, legend, axis label or hover label.

    Plotly reads a subset of HTML in those (``<a href>``, ``<b>``, ``<br>``): an app, device, logger or rule name
    from the store drawn as it is could put a link to anywhere on the page. Escaped, ``<`` and ``&`` are shown as
    typed. :func:`drill_chart` unescapes the trace names it reports, so a click gives the stored name back."""
    return html.escape(str(text), quote=False)


def plot_texts(df: pd.DataFrame, *columns: str | None) -> pd.DataFrame:
    """``df`` with the text of ``columns`` (None: skipped) through :func:`plot_text`, for Plotly Express."""
    named = [c for c in columns if c is not None and c in df.columns]
    return df.assign(**{c: df[c].map(lambda v: plot_text(v) if isinstance(v, str) else v)
                        for c in named}) if named else df


NOTHING_TO_DRAW = "No values in the chosen range yet"
"""What an empty chart says unless its page knows better (e.g. a metric whose events carry no value)."""


def chart_layout(fig: go.Figure, height: int = 300, empty: str = NOTHING_TO_DRAW) -> go.Figure:
    """The layout every dashboard figure shares: title at the top, legend between it and the plot; a figure with
    nothing to draw says so in its middle (``empty``), where it would otherwise show bare axes."""
    fig.update_layout(height=height, margin=MARGIN, legend=legend_under_title(height),
                      title={"yref": "container", "y": 1, "yanchor": "top", "pad": {"t": 12}})
    if not any(_drawn(trace) for trace in fig.data):
        fig.add_annotation(text=empty, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                           font={"size": 14, "color": "#6b6b6b"})
    return fig


def _drawn(trace: Any) -> bool:
    """Whether a trace has a value to draw: a y (or, for horizontal bars and histograms, an x) that is not missing."""
    values = trace.x if trace.type == "histogram" or getattr(trace, "orientation", None) == "h" else trace.y
    return values is not None and bool(pd.notna(pd.Series(values, dtype=object)).any())


def time_axis(fig: go.Figure, span: tuple[datetime, datetime], title: str = "UTC") -> go.Figure:
    """The x axis spans the chosen range ``span`` (since, until), however much of it the data covers.

    Without a fixed range Plotly zooms to the data: a few buckets looked like the whole range, and a single one
    gave an axis milliseconds wide. Plotly reads naive datetimes as they are, so both ends are given in UTC.
    """
    fig.update_xaxes(type="date", range=[naive_utc(t) for t in span], tickformatstops=NO_SUB_SECOND_TICKS,
                     title_text=title)
    # A line needs two points: a line trace with one gets its marker, or it would not show at all.
    fig.for_each_trace(lambda t: t.update(mode="lines+markers")
                       if t.type == "scatter" and t.mode == "lines" and t.x is not None and len(t.x) < 2 else None)
    return fig


@reused
def time_chart(df: pd.DataFrame, y: str, title: str, unit: str, span: tuple[datetime, datetime],
               colour: str | None = None, kind: str = "line", bucket_s: int | None = None,
               height: int = 300, colours: Mapping[str, str] | None = None) -> go.Figure:
    """A line (or bar) chart over the ``t`` column (bucket starts), one trace per value of ``colour`` (drawn in
    ``colours[value]`` when given), across ``span``. Bars are ``bucket_s`` wide from their bucket's start, so one
    bucket is as wide as it lasts."""
    draw = px.bar if kind == "bar" else px.line
    fig = draw(plot_texts(df, colour), x="t", y=y, color=colour, title=title,
               color_discrete_map=dict(colours or {}))
    if kind == "bar" and bucket_s:
        fig.update_traces(width=bucket_s * 1000, offset=0)
    fig.update_yaxes(title_text=unit, rangemode="nonnegative")     # counts and rates: never below 0
    return time_axis(chart_layout(fig, height), span)


@reused
def histogram(df: pd.DataFrame, x: str, title: str, colour: str | None = None, log_y: bool = True) -> go.Figure:
    fig = px.histogram(plot_texts(df, colour), x=x, color=colour, title=title, log_y=log_y, nbins=60)
    fig.update_layout(bargap=0.05)
    return chart_layout(fig)


@reused
def partition_chart(records_behind: dict[int, int]) -> go.Figure:
    """Consumer lag per Kafka partition: partitions are names, not numbers (a numeric axis drew ``0.5`` ticks)."""
    fig = px.bar(x=[str(p) for p in records_behind], y=list(records_behind.values()),
                 title="Consumer lag per partition", labels={"x": "partition", "y": "records behind"})
    fig.update_xaxes(type="category")
    return chart_layout(fig, height=260)
