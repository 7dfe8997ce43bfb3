"""Logs: lines by level and app over time, the peaks of sliding windows that reveal error bursts, and the lines
themselves: a search (time, app, level, logger, words and phrases, tags; newest first), their most frequent message
patterns and the log records that were dead-lettered.

Every filter lives in the URL, so a link reproduces the view; ``?from=&to=`` (ISO 8601 or epoch ms) sets an
absolute window instead of the "last N minutes", as a drill-down does: a click on a bar or point of the charts here,
on the Overview's error chart or on a firing ``error_ratio`` alert opens the lines of that app, level and window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import common, log_search
from dashboard.data.logs import (
    LogLines,
    logs_charts_data,
    logs_dead_letters,
    logs_lines,
    logs_patterns,
    logs_pickers,
    stored_lines,
)
from dashboard.live import read_when_changed, read_when_new
from dashboard.log_search import LogQuery
from eventide.envelope import LEVELS
from store import pipeline

LEVEL_COLOURS = {"debug": "#9edae5", "info": "#1f77b4", "warning": "#ff7f0e", "error": "#d62728",
                 "critical": "#7b1fa2"}
SEVERE = ("error", "critical")
# The URL keys of the search; a drill-down replaces them all. (Comments, not docstrings: a page script writes
# its bare strings onto the page.)
FILTER_KEYS = ("app", "level", "name", "q", "tag", "from", "to")
VIEWS = {"lines": "Lines", "patterns": "Patterns", "dead": "Dead-lettered log records"}
MAX_TEXT = 500     # longest search text: query parameters travel in the URL, which the store bounds


def page() -> None:
    _apply_pending_drill_down()
    config, minutes = common.start_page("Logs")
    window = _url_window()

    def span() -> tuple[datetime, datetime]:
        return window or common.last(minutes)

    @common.refreshing(config)
    def live() -> None:
        batches, ((since, until), data) = read_when_new(
            config, "logs_charts", pipeline.WINDOW_ROWS, (window, minutes),
            lambda: (chosen := span(), common.page_data(config, logs_charts_data, *chosen)))
        # lines (accept), their windows (tumbling rows in the charts), sliding
        common.show_freshness(config, batches, *pipeline.QUERIES, sooner={
            "log lines": (pipeline.ACCEPT_QUERY,), "tumbling windows": pipeline.WINDOW_ROWS})
        resolution, levels, peaks = data.resolution_s, data.levels, data.peaks
        if levels is None or levels.empty:
            st.info("No log windows in the chosen range yet.")
            return
        by_level = levels.groupby(["t", "level"], as_index=False)["lines"].sum()
        chart_span = (since, until)
        fig = common.time_chart(by_level, "lines", f"Log lines per {resolution} s by level", "lines", chart_span,
                                "level", kind="bar", bucket_s=resolution, colours=LEVEL_COLOURS)
        _drill_chart(st, fig, "chart_levels", resolution,
                     lambda name, t: ((), (name,), t, t + timedelta(seconds=resolution)))
        severe = levels[levels["level"].isin(SEVERE)]
        errors = severe.groupby(["t", "app"], as_index=False)["lines"].sum()
        left, right = st.columns(2)
        _drill_chart(left, common.time_chart(errors, "lines", f"Error + critical lines per {resolution} s by app",
                                             "lines", chart_span, "app"), "chart_errors", resolution,
                     lambda name, t: ((name,), SEVERE, t, t + timedelta(seconds=resolution)))
        if peaks.empty:
            right.info("No sliding windows yet (they are emitted once the watermark passes each event).")
        else:
            length = int(peaks["window_s"].iloc[0])
            _drill_chart(right, common.time_chart(peaks, "peak", f"Error bursts: most error lines in any {length} s",
                                                  "lines in a sliding window", chart_span, "app"), "chart_peaks",
                         resolution, lambda name, t: ((name,), SEVERE, t - timedelta(seconds=length),
                                          t + timedelta(seconds=resolution)))
        st.caption("Click a bar or point (shift-click for more) to list those lines below.")

    live()
    _search(config, span, window is not None)


# The search -----------------------------------------------------------------------------------------------------

def _search(config: Any, span: Callable[[], tuple[datetime, datetime]], absolute: bool) -> None:
    st.subheader("Find a line")
    since, until = span()
    follow = False
    if not absolute:
        # A relative range ends at this run: the lines stay put until the page is used or refreshed, unless the
        # user follows new lines (then they refresh with the charts, and the table may move while being read).
        top = st.columns([3, 1, 1])
        follow = common.url_toggle("Follow new lines", "follow", top[1],
                                   help="List new matching lines as they are stored, at the sidebar's "
                                        "\"Refresh every\" (the list moves while you read it)")
        if follow:
            top[0].caption("Lines of the last minutes, followed: new matching lines appear as they are stored.")
        else:
            top[0].caption(f"Lines of {_fmt(since)} – {_fmt(until)} UTC (the last minutes as of this search).")
            top[2].button("Refresh lines", key="logs_refresh")
    pickers = common.page_data(config, logs_pickers, since, until)
    apps, names = pickers.apps, pickers.names
    cols = st.columns(3)
    chosen_apps = common.url_multiselect("App", "app", apps, cols[0])
    chosen_levels = common.url_multiselect("Level", "level", list(LEVELS), cols[1])
    chosen_names = common.url_multiselect("Logger name", "name", names, cols[2])
    cols = st.columns([3, 2])
    text = common.url_text("Words and \"phrases\"", "q", cols[0], max_chars=MAX_TEXT,
                           help='Every word and "quoted phrase" must match, whole words, any case: '
                                'timeout "connection refused" db-12')
    tags = _tags(cols[1])
    query = LogQuery(since, until, tuple(chosen_apps), tuple(chosen_levels), tuple(chosen_names), text, tags)
    wanted = st.query_params.get("view")
    view = st.radio("View", list(VIEWS), index=list(VIEWS).index(wanted) if wanted in VIEWS else 0,
                    format_func=VIEWS.__getitem__, horizontal=True, key="url_view", label_visibility="collapsed")
    st.query_params["view"] = view
    if view == "patterns":
        _patterns(config, query)
    elif view == "dead":
        _dead_letters(config, query)
    elif follow:
        @common.refreshing_every(common.chosen_refresh_interval())
        def followed() -> None:
            _lines(config, query, span)

        followed()
    else:
        _lines(config, query)


def _tags(container: Any) -> tuple[tuple[str, str], ...]:
    """The tag filter: ``k=v`` pairs separated by spaces, each one ``?tag=k=v`` in the URL."""
    text = common.url_text("Tags", "tag", container, max_chars=MAX_TEXT, many=True,
                           help="k=v pairs separated by spaces (region=eu version=2); all must match")
    pairs = {t: log_search.parse_tag(t) for t in text.split()}
    if bad := [t for t, pair in pairs.items() if pair is None]:
        # The URL's text, shown verbatim: a link's ?tag= must not put a link or an image on the page.
        st.caption(f"Ignored (not k=v): {' '.join(common.literal(t) for t in bad)}")
    return tuple(dict.fromkeys(p for p in pairs.values() if p is not None))


def _lines(config: Any, query: LogQuery, followed: Callable[[], tuple[datetime, datetime]] | None = None) -> None:
    """The newest lines matching ``query``; ``followed``: the range of each refresh of a followed search, which
    reads again whenever the store's count of lines moved (``dashboard.live.read_when_changed``)."""
    per_page, most = config.dashboard.log_lines_per_page, config.dashboard.log_lines_max
    # "Load more" grows the page of this search only: any change of the filters starts again at one page.
    filters = repr((query.apps, query.levels, query.names, query.text, query.tags, st.query_params.get("from"),
                    st.query_params.get("to")))
    if st.session_state.get("logs_filters") != filters:
        st.session_state["logs_filters"], st.session_state["logs_shown"] = filters, per_page
    shown = min(st.session_state.get("logs_shown", per_page), most)
    if followed is None:
        found = common.page_data(config, logs_lines, query, shown)
    else:
        def read() -> LogLines:
            since, until = followed()
            return common.page_data(config, logs_lines, replace(query, since=since, until=until), shown)

        found = read_when_changed(config, "logs_lines", stored_lines, (filters, shown, query.until - query.since),
                                  read)
    lines, total, counted = found.lines, found.total, found.counted
    if lines.empty:
        st.info("No line matches in this range. Widen the time range, or remove a filter.")
        return
    late = int(lines["late"].sum())
    matching = f"more than {counted:,}" if total > counted else f"{total:,}"
    st.caption(f"{matching} lines match · newest {len(lines):,} shown"
               + (f" · {late} late (arrived after a window they belonged to had closed)" if late else ""))
    table = pd.DataFrame({
        "time (UTC)": lines["corrected_event_time"], "level": lines["level"], "app": lines["app"],
        "device": lines["device"], "message": lines["message"],
        "tags": [" ".join(f"{k}={v}" for k, v in sorted(t.items())) for t in lines["tags"]],
        "late": ["late" if x else "" for x in lines["late"]],
        "logger": lines["name"], "user": lines["user"], "event id": lines["event_id"]})
    st.dataframe(common.shown(table), hide_index=True, width="stretch", column_config={
        "time (UTC)": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss.SSS"),
        "message": st.column_config.TextColumn(width="large"),
        "late": st.column_config.TextColumn(help="The event arrived after a window it belonged to had closed: "
                                                 "a dropped straggler (see Stragglers & clocks)")})
    if len(lines) < total:
        if shown < most:
            if st.button(f"Load {min(per_page, most - shown, total - shown):,} more", key="logs_more"):
                st.session_state["logs_shown"] = shown + per_page
                st.rerun()
        else:
            st.caption(f"Showing the newest {most:,} (`dashboard.log_lines_max`): narrow the time range or add "
                       "words to reach older lines.")


def _patterns(config: Any, query: LogQuery) -> None:
    budget = config.dashboard.log_pattern_lines
    patterns = common.page_data(config, logs_patterns, query)
    if patterns.empty:
        st.info("No line matches in this range, so no patterns.")
        return
    counted = f"{patterns.attrs['lines']:,} lines"
    if patterns.attrs["since"] > log_search.naive_utc(query.since):
        counted += (f", the newest: since {_fmt(patterns.attrs['since'])} UTC (at most about {budget:,}, "
                    "`dashboard.log_pattern_lines`)")
    st.caption(f"The {len(patterns)} most frequent messages per level among {counted}; numbers, hex strings and "
               f"ids masked as `{log_search.MASK}`. Follow \"lines\" to search for a pattern's fixed words.")
    links = [log_search.logs_url(apps=query.apps, levels=(level,), names=query.names, since=query.since,
                                 until=query.until, tags=query.tags,
                                 text=" ".join([query.text, *_fixed_words(pattern)]).strip())
             for pattern, level in zip(patterns["pattern"], patterns["level"], strict=True)]
    st.dataframe(common.shown(patterns.assign(search=links), links=["search"]), hide_index=True, width="stretch",
                 column_config={
        "pattern": st.column_config.TextColumn(width="large"),
        "example": st.column_config.TextColumn(width="medium"),
        "newest": st.column_config.DatetimeColumn("newest (UTC)", format="YYYY-MM-DD HH:mm:ss"),
        "search": st.column_config.LinkColumn("lines", display_text="search")})


def _fixed_words(pattern: str) -> list[str]:
    """The words of a pattern that no mask touched (a masked part splits its neighbours off)."""
    return [w for part in pattern.split(log_search.MASK) for w in log_search.tokens(part)][:8]


def _dead_letters(config: Any, query: LogQuery) -> None:
    dead = common.page_data(config, logs_dead_letters, query)
    st.caption("Log records the job refused (dead letters) that reached Kafka in the range, with the reason; "
               "app filter applies, the other filters do not (a refused record may lack them). All dead letters: "
               "the Overview's dead-letter rate.")
    if dead.empty:
        st.info("No log record was dead-lettered in this range.")
        return
    st.dataframe(common.shown(dead), hide_index=True, width="stretch", column_config={
        "kafka_timestamp": st.column_config.DatetimeColumn("arrived (UTC)", format="YYYY-MM-DD HH:mm:ss.SSS"),
        "reason": st.column_config.TextColumn(width="medium"),
        "raw": st.column_config.TextColumn(width="large")})


# Time window and drill-down -------------------------------------------------------------------------------------

def _url_window() -> tuple[datetime, datetime] | None:
    """The absolute window ``?from=&to=`` (a drill-down's), shown in the sidebar with a way back to the "last N
    minutes"; None without one (or with a malformed one, said in the sidebar)."""
    raw_from, raw_to = st.query_params.get("from"), st.query_params.get("to")
    if not raw_from and not raw_to:
        return None
    try:
        since = log_search.parse_time(raw_from) if raw_from else None
        until = log_search.parse_time(raw_to) if raw_to else datetime.now(UTC)
    except ValueError:
        shown = " ".join(f"{key}={common.literal(raw)}" for key, raw in (("from", raw_from), ("to", raw_to)) if raw)
        st.sidebar.error(f"Unreadable window {shown}: ISO 8601 or epoch ms expected.")
        since = until = None
    if since is not None and until is not None and since < until:
        st.sidebar.info(f"Window {_fmt(since)} – {_fmt(until)} UTC, from a link: the slider above is not used.")
    elif since is not None and until is not None:
        st.sidebar.error("The window's end is not after its start.")
        since = None
    if st.sidebar.button("Clear window (back to the last minutes)", key="logs_clear_window"):
        for key in ("from", "to"):
            if key in st.query_params:
                del st.query_params[key]
        st.rerun()
    return (since, until) if since is not None and until is not None else None


def _fmt(t: datetime) -> str:
    return (t.astimezone(UTC) if t.tzinfo else t).strftime("%Y-%m-%d %H:%M:%S")


DrillTarget = tuple[tuple[str, ...], tuple[str, ...], datetime, datetime]   # (apps, levels, since, until)


def _drill_chart(container: Any, fig: Any, key: str, bucket_s: int,
                 target: Callable[[str, datetime], DrillTarget]) -> None:
    """Draw ``fig``; a click on its points (shift-click for more) opens the search on their apps, levels and
    window: ``target(trace name, bucket start)`` for each point, merged (all apps and levels, earliest to latest)."""
    targets = [target(name, common.bucket_start(t, bucket_s)) for name, t in common.drill_chart(container, fig, key)]
    if targets:
        apps = tuple(dict.fromkeys(a for tgt in targets for a in tgt[0]))
        levels = tuple(dict.fromkeys(lv for tgt in targets for lv in tgt[1]))
        st.session_state["logs_drill"] = {
            "params": log_search.logs_params(apps=apps, levels=levels, since=min(t[2] for t in targets),
                                             until=max(t[3] for t in targets)),
        }
        st.rerun(scope="app")


def _apply_pending_drill_down() -> None:
    """A click in a chart (in the refreshing fragment) asked for other filters: rewrite the URL's filters and set
    the filter widgets to them."""
    drill = st.session_state.pop("logs_drill", None)
    if not drill:
        return
    for key in FILTER_KEYS:
        if key in st.query_params:
            del st.query_params[key]
    for key, values in drill["params"].items():
        st.query_params[key] = values
    common.url_widgets_follow(lists=("app", "level", "name"), texts=("q",), many=("tag",))


page()
