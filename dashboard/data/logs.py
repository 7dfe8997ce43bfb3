"""The Logs page's data: its charts (lines by level and app, error-burst peaks), then the search below them (the
pickers' values, and the matching lines with their count, their message patterns, or the dead-lettered records)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandas as pd

from dashboard import log_search, queries
from dashboard.data.reader import Reader, batches_and_buckets
from dashboard.log_search import LogQuery

PATTERNS_SHOWN = 20
"""Message patterns the page lists (the most frequent)."""
DEAD_LETTERS_SHOWN = 200
"""Dead-lettered log records the page lists (the newest)."""


@dataclass(frozen=True)
class LogChartsData:
    """What the charts at the top of the page show for a range."""

    batches: dict[str, datetime]
    resolution_s: int
    levels: pd.DataFrame | None
    """Lines per bucket, app and level, long format (``queries.log_levels``); None before the first tumbling window."""
    peaks: pd.DataFrame
    """The most error lines any sliding window ending in a bucket held, per app (``queries.error_burst_peaks``)."""


def logs_charts_data(reader: Reader, since: datetime, until: datetime) -> LogChartsData:
    """The charts' queries over ``[since, until)``: the freshness batches beside the window lengths (which set the
    bucket), then levels and peaks side by side."""
    batches, lengths, resolution = batches_and_buckets(reader, since, until)
    data = reader.together(
        levels=lambda c: queries.log_levels(c, since, until, resolution, min(lengths)) if lengths else None,
        peaks=lambda c: queries.error_burst_peaks(c, since, until, resolution))
    return LogChartsData(batches, resolution, data["levels"], data["peaks"])


@dataclass(frozen=True)
class LogPickers:
    """The app and logger names the search's pickers offer: those of the range's lines, sorted."""

    apps: list[str]
    names: list[str]


def logs_pickers(reader: Reader, since: datetime, until: datetime) -> LogPickers:
    """The app and logger names among the lines of ``[since, until)``, one after the other on one client."""
    return reader.one("pickers", lambda c: LogPickers(log_search.distinct_values(c, since, until, "app"),
                                                      log_search.distinct_values(c, since, until, "name")))


@dataclass(frozen=True)
class LogLines:
    """A page of matching lines and how many match."""

    lines: pd.DataFrame
    """The newest matching lines (``log_search.search_lines``), with ``late``."""
    total: int
    """Lines matching, counted up to ``counted + 1``."""
    counted: int
    """Past this count the page says "more than": the count stops reading there."""


def stored_lines(reader: Reader) -> int:
    """How many lines the store holds: what a followed search asks at every refresh, to read again only when lines
    were stored (``dashboard.live``)."""
    return reader.one("stored_lines", log_search.stored_line_count)


def logs_lines(reader: Reader, query: LogQuery, shown: int) -> LogLines:
    """The newest ``shown`` lines matching ``query`` beside the count of all of them, capped at the larger of
    ``dashboard.log_count_max`` and ``dashboard.log_lines_max``."""
    settings = reader.config.dashboard
    counted = max(settings.log_count_max, settings.log_lines_max)
    data = reader.together(lines=lambda c: log_search.search_lines(c, query, shown),
                           total=lambda c: log_search.count_lines(c, query, cap=counted))
    return LogLines(data["lines"], data["total"], counted)


def logs_patterns(reader: Reader, query: LogQuery) -> pd.DataFrame:
    """The :data:`PATTERNS_SHOWN` most frequent message patterns of the lines matching ``query`` (at most about
    ``dashboard.log_pattern_lines`` of them, the newest): ``log_search.message_patterns``."""
    budget = reader.config.dashboard.log_pattern_lines
    return reader.one("patterns", lambda c: log_search.message_patterns(c, query, PATTERNS_SHOWN, budget))


def logs_dead_letters(reader: Reader, query: LogQuery) -> pd.DataFrame:
    """The newest :data:`DEAD_LETTERS_SHOWN` log records dead-lettered in ``query``'s range, of its apps if it names
    any (the other filters do not apply: a refused record may lack them)."""
    return reader.one("dead", lambda c: log_search.dead_lettered_logs(c, query.since, query.until,
                                                                      DEAD_LETTERS_SHOWN, query.apps))
