"""Log search over the ``logs`` table (sql/0013_logs.sql): the lines of a time range that match an app, level,
logger name, text and tag filters, newest first; their most frequent message patterns; and the log records that
were dead-lettered instead. How a search's words, phrases and filters become SQL: :mod:`store.log_query`, which alert
rules on log lines share.

Patterns: a message with its variable parts masked (:data:`MASKS`: UUIDs, ``0x`` and long hex strings, any word
holding a digit) becomes ``<*>`` in place, so ``user u42 logged in from 10.0.3.7`` and ``user u7 logged in from
10.0.9.1`` are one pattern, ``user <*> logged in from <*>.<*>.<*>.<*>``. The same regular expression masks in SQL
(``replaceRegexpAll``, RE2) and in Python (:func:`mask`, ``re`` with ASCII classes).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pandas as pd
from clickhouse_connect.driver.client import Client

# The Logs page's links live in eventide.links (alert notifications make them too); importable from here as before.
from eventide.links import LOGS_PAGE as LOGS_PAGE
from eventide.links import format_time as format_time
from eventide.links import logs_params as logs_params
from eventide.links import logs_url as logs_url
from store.log_query import LogQuery as LogQuery
from store.log_query import naive_utc as naive_utc
from store.log_query import parse_text as parse_text
from store.log_query import phrase_regex as phrase_regex
from store.log_query import tokens as tokens
from store.log_query import where_clause

LINE_COLUMNS = ("corrected_event_time", "level", "app", "name", "device", "user", "message", "tags", "event_id",
                "event_time", "received_time", "source_partition", "source_offset")
"""The columns :func:`search_lines` returns (plus ``late``)."""

MASK = "<*>"
"""What a masked variable part of a message becomes in a pattern."""

MASKS = (
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",   # a UUID, whole
    r"\b0[xX][0-9a-fA-F]+\b",                                                           # 0x-prefixed hex
    r"\b[0-9a-fA-F]{8,}\b",                                                             # a long hex string (hashes)
    r"\b[A-Za-z_]*[0-9]\w*\b",                                                          # a word holding a digit
)
"""Variable parts of a message, most specific first (a UUID before its digit-holding pieces). Written in the common
subset of RE2 (ClickHouse) and Python ``re`` with ``re.ASCII``: ``\\w`` = ``[A-Za-z0-9_]``, ``\\b`` its boundary."""

MASK_PATTERN = "|".join(f"(?:{m})" for m in MASKS)
""":data:`MASKS` as one alternation: one ``replaceRegexpAll`` pass per message instead of one per mask."""

_MASK_RE = re.compile(MASK_PATTERN, re.ASCII)

def mask(message: str) -> str:
    """``message`` with its variable parts (:data:`MASKS`) replaced by :data:`MASK`, as the store masks it."""
    return _MASK_RE.sub(MASK, message)


FIRST_SLICE = timedelta(hours=1)
"""A search reads its range newest first in slices, the first this long and each next one :data:`SLICE_GROWTH`
times longer, and stops once it has its lines: a word in every minute's lines is answered from the newest minutes
instead of being sorted out of a whole day."""
SLICE_GROWTH = 4


def _slices(since: datetime, until: datetime) -> Iterator[tuple[datetime, datetime]]:
    """``[since, until)`` cut into consecutive spans, newest first, each :data:`SLICE_GROWTH` times the last."""
    length, hi = FIRST_SLICE, until
    while hi > since:
        lo = max(since, hi - length)
        yield lo, hi
        hi, length = lo, length * SLICE_GROWTH


def search_lines(client: Client, query: LogQuery, limit: int, offset: int = 0) -> pd.DataFrame:
    """The matching lines ``offset`` to ``offset + limit``, newest first (``corrected_event_time`` descending, then
    ``event_id``): :data:`LINE_COLUMNS` and ``late``, true when the event is a dropped straggler (its app and id are
    in ``stragglers``: it arrived after a window it belonged to had closed). ``tags`` is a dict.

    The range is read newest first in growing slices (:func:`_slices`) until ``offset + limit`` lines are found: the
    slices do not overlap and a timestamp lies in one only, so their answers, one after the other, are the whole
    range's order. ``late`` is computed on each slice's rows only (an outer query over its ``LIMIT``), against the
    stragglers of that slice (``stragglers`` keeps the event's corrected time; a window holding it starts no later,
    which prunes the table's partitions). The ids are not sent back as a parameter: parameters travel in the URL,
    which the store bounds.
    """
    wanted = offset + limit
    found: list[pd.DataFrame] = []
    count = 0
    for lo, hi in _slices(naive_utc(query.since), naive_utc(query.until)):
        part = _search_slice(client, replace(query, since=lo, until=hi), wanted - count)
        if not part.empty:
            found.append(part)
            count += len(part)
        if count >= wanted:
            break
    columns = [*LINE_COLUMNS, "late"]
    lines = pd.concat(found, ignore_index=True) if found else pd.DataFrame(columns=columns)
    lines = lines.iloc[offset:offset + limit].reset_index(drop=True)
    lines["tags"] = [dict(t) for t in lines["tags"]]
    lines["late"] = lines["late"].astype(bool)
    return lines


def _search_slice(client: Client, query: LogQuery, limit: int) -> pd.DataFrame:
    """The newest ``limit`` matching lines of ``query``'s range, with ``late``."""
    where = where_clause(query)
    apps = "AND app IN {apps:Array(String)} " if query.apps else ""
    result = client.query(
        f"SELECT {', '.join(LINE_COLUMNS)}, (app, event_id) IN ("
        " SELECT app, event_id FROM stragglers WHERE window_start < {until:DateTime64(3)}"
        " AND corrected_event_time >= {since:DateTime64(3)} AND corrected_event_time < {until:DateTime64(3)} "
        f" {apps}) AS late "
        f"FROM (SELECT {', '.join(LINE_COLUMNS)} FROM logs WHERE {where.sql} "
        " ORDER BY corrected_event_time DESC, event_id LIMIT {limit:UInt32}) "
        "ORDER BY corrected_event_time DESC, event_id",
        parameters={**where.parameters, "limit": limit})
    return pd.DataFrame(result.result_rows, columns=[*LINE_COLUMNS, "late"])


def stored_line_count(client: Client) -> int:
    """Every line the store holds: it changes whenever lines are stored, and ClickHouse answers it from its parts'
    metadata without reading a line."""
    return int(client.query("SELECT count() FROM logs").result_rows[0][0])


def count_lines(client: Client, query: LogQuery, cap: int | None = None) -> int:
    """How many lines match ``query``; with ``cap``, at most ``cap + 1`` (more than ``cap`` lines match).

    The page shows "10,000+" rather than an exact count of a common word over a day: capped, the store stops reading
    once it has found ``cap + 1`` lines instead of reading every matching granule of the range."""
    where = where_clause(query)
    sql = (f"SELECT count() FROM logs WHERE {where.sql}" if cap is None else
           f"SELECT count() FROM (SELECT 1 FROM logs WHERE {where.sql} LIMIT {int(cap) + 1})")
    return int(client.query(sql, parameters=where.parameters).result_rows[0][0])


def message_patterns(client: Client, query: LogQuery, top: int = 20, max_lines: int | None = None) -> pd.DataFrame:
    """The ``top`` most frequent (pattern, level) pairs among the matching lines: a pattern is the message with its
    variable parts masked (:func:`mask`). Columns: pattern, level, lines, example (one original message), newest
    (the latest ``corrected_event_time`` of the pattern); most lines first.

    ``max_lines``: mask at most about this many lines, the newest (each is a regular expression pass): when the
    range holds more, the patterns are those of its newest whole minutes holding no more than that (at least its
    newest minute). ``attrs["since"]`` is the start of the span counted, ``attrs["lines"]`` its matching lines.
    """
    since = _pattern_start(client, query, max_lines) if max_lines is not None else naive_utc(query.since)
    counted = replace(query, since=max(naive_utc(query.since), since))
    where = where_clause(counted)
    result = client.query(
        "SELECT replaceRegexpAll(message, {mask_re:String}, {mask:String}) AS pattern, level, count() AS lines, "
        "any(message) AS example, max(corrected_event_time) AS newest, sum(count()) OVER () AS total "
        f"FROM logs WHERE {where.sql} GROUP BY pattern, level ORDER BY lines DESC, pattern, level LIMIT {{top:UInt32}}",
        parameters={**where.parameters, "mask_re": MASK_PATTERN, "mask": MASK, "top": top})
    patterns = pd.DataFrame(result.result_rows, columns=["pattern", "level", "lines", "example", "newest", "total"])
    patterns.attrs.update(since=counted.since, lines=int(patterns["total"].iloc[0]) if len(patterns) else 0)
    return patterns.drop(columns="total")


def _pattern_start(client: Client, query: LogQuery, max_lines: int) -> datetime:
    """The start of the newest whole minutes of ``query``'s range that hold at most ``max_lines`` matching lines
    (the newest minute's start if it alone holds more); ``query.since`` if the whole range does. One pass over the
    time column (and the text index, for a text query), no message masked."""
    where = where_clause(query)
    minutes = client.query(
        "SELECT toStartOfMinute(corrected_event_time) AS minute, count() FROM logs "
        f"WHERE {where.sql} GROUP BY minute ORDER BY minute DESC", parameters=where.parameters).result_rows
    total, start = 0, naive_utc(query.since)
    for i, (minute, lines) in enumerate(minutes):
        total += lines
        if total > max_lines:
            return naive_utc(minutes[i - 1][0]) if i else naive_utc(minute)
    return start


DEAD_LETTER_COLUMNS = ("kafka_timestamp", "reason", "app", "level", "device", "message", "raw", "raw_bytes",
                       "source_partition", "source_offset", "detected_at")


def dead_lettered_logs(client: Client, since: datetime, until: datetime, limit: int,
                       apps: Sequence[str] = ()) -> pd.DataFrame:
    """Records refused by the job (``dead_letters``) whose value is a log record (``"kind": "log"``), that reached
    the broker in ``[since, until)`` (``kafka_timestamp``), newest first, at most ``limit``: the reason and what could
    be read of the record (app, level, device, message; empty when the JSON does not say), with the raw value.
    ``apps``: only records naming one of these apps. A record too broken to parse counts as a log when its text
    still says ``"kind":"log"``."""
    app_filter = "AND JSONExtractString(raw, 'app') IN {apps:Array(String)} " if apps else ""
    result = client.query(
        "SELECT kafka_timestamp, reason, JSONExtractString(raw, 'app') AS app, "
        "JSONExtractString(raw, 'level') AS level, JSONExtractString(raw, 'device') AS device, "
        "JSONExtractString(raw, 'message') AS message, raw, raw_bytes, source_partition, source_offset, detected_at "
        "FROM dead_letters FINAL "
        "WHERE kafka_timestamp >= {since:DateTime64(3)} AND kafka_timestamp < {until:DateTime64(3)} "
        "AND (JSONExtractString(raw, 'kind') = 'log' OR match(raw, {kind_re:String})) "
        f"{app_filter}ORDER BY kafka_timestamp DESC, source_partition, source_offset LIMIT {{limit:UInt32}}",
        parameters={"since": naive_utc(since), "until": naive_utc(until), "limit": limit, "apps": list(apps),
                    "kind_re": r'"kind"\s*:\s*"log"'})
    return pd.DataFrame(result.result_rows, columns=list(DEAD_LETTER_COLUMNS))


def distinct_values(client: Client, since: datetime, until: datetime, column: str) -> list[str]:
    """The values of ``column`` (``app`` or ``name``) among the lines of ``[since, until)``, sorted: what the page's
    pickers offer."""
    if column not in ("app", "name"):
        raise ValueError(f"no picker for column {column!r}")
    rows = client.query(
        f"SELECT DISTINCT {column} FROM logs "
        "WHERE corrected_event_time >= {since:DateTime64(3)} AND corrected_event_time < {until:DateTime64(3)} "
        f"ORDER BY {column}", parameters={"since": naive_utc(since), "until": naive_utc(until)}).result_rows
    return [r[0] for r in rows]


# Links ---------------------------------------------------------------------------------------------------------

"""The Logs page's URL path (dashboard/app.py)."""


def parse_time(text: str) -> datetime:
    """A URL's ``from``/``to``: ISO 8601 (naive means UTC) or milliseconds since the epoch; a UTC datetime.
    Raises ValueError for anything else."""
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        return datetime.fromtimestamp(int(text) / 1000, UTC)
    t = datetime.fromisoformat(text.replace("Z", "+00:00").replace(" ", "T"))
    return t.astimezone(UTC) if t.tzinfo else t.replace(tzinfo=UTC)


def parse_tag(text: str) -> tuple[str, str] | None:
    """``k=v`` as (k, v), split at the first ``=``; None when there is no ``=`` or no key."""
    key, sep, value = text.partition("=")
    return (key.strip(), value.strip()) if sep and key.strip() else None
