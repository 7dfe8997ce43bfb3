"""One log search (:class:`LogQuery`: time range, app, level, logger name, words and phrases, tags) as a WHERE
clause over the ``logs`` table (sql/0013_logs.sql), and its line counts per window: what the Logs page lists and what
an alert rule on log lines counts are the same lines.

How a text query becomes SQL
----------------------------
ClickHouse's token bloom filter (the ``message_tokens`` index on ``lowerUTF8(message)``) splits text into tokens:
maximal runs of ASCII letters and digits and of non-ASCII bytes; everything else separates. A word of the query is
one such token and matches a line holding it as a whole token, case-insensitively:
``hasToken(lowerUTF8(message), lowerUTF8({w:String}))``, the very expression of the index, so the index skips every
granule that cannot hold the word (``EXPLAIN indexes = 1`` shows ``message_tokens``). ``hasToken`` refuses a needle
with separators, so the query is tokenized here exactly as the index does.

A phrase (``"connection refused"``, or an unquoted term with separators such as ``db-12``) matches a line holding its
tokens in that order, separated only by separators: each token through ``hasToken`` (the index), then one regular
expression on the lowered message for the adjacency. Every word and phrase must match. All user input goes to the
store as query parameters (``{name:Type}``), never into the SQL text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from clickhouse_connect.driver.client import Client

# A token as ClickHouse's token extractors (hasToken, tokenbf_v1) see it: ASCII alphanumerics and any non-ASCII
# character (every byte of its UTF-8 encoding is >= 0x80, which the tokenizer counts as a token byte).
_TOKEN_RE = re.compile(r"[0-9A-Za-z\u0080-\U0010FFFF]+")
# A separator in a regular expression over the lowered message (RE2, UTF-8): an ASCII character that is not a
# letter or digit.
_SEPARATOR = r"[\x00-/:-@\[-`{-\x7f]"
_TERMS_RE = re.compile(r'"([^"]*)"?|(\S+)')


def tokens(text: str) -> list[str]:
    """``text`` split as ClickHouse's tokenizer splits it (runs of ASCII alphanumerics and non-ASCII characters)."""
    return _TOKEN_RE.findall(text)


def parse_text(text: str) -> tuple[list[str], list[str]]:
    """(words, phrases) of a search text, lower case, each listed once, in the order typed.

    A word is a term that is one token (``refused``, ``Timeout``). A phrase is a ``"quoted text"`` of two tokens or
    more, or an unquoted term with separators inside (``db-12``, ``/api/items``): its tokens, space-joined
    (``"db 12"``), which must appear in that order with only separators between them. A quoted single token is a
    word; a term without any token (``-``, ``""``) is ignored. An unclosed quote runs to the end of the text.
    """
    words: list[str] = []
    phrases: list[str] = []
    for quoted, bare in _TERMS_RE.findall(text):
        parts = tokens((quoted if quoted else bare).lower())
        if len(parts) == 1:
            target, item = words, parts[0]
        elif parts:
            target, item = phrases, " ".join(parts)
        else:
            continue
        if item not in target:
            target.append(item)
    return words, phrases


def phrase_regex(phrase: str) -> str:
    """An RE2 expression matching ``phrase``'s tokens in order, as whole tokens separated only by separators
    (in a lowered message)."""
    between = f"{_SEPARATOR}+"
    return f"(?:^|{_SEPARATOR})" + between.join(re.escape(t) for t in tokens(phrase)) + f"(?:{_SEPARATOR}|$)"


@dataclass(frozen=True)
class LogQuery:
    """What the Logs page searches for: lines with ``since <= corrected_event_time < until`` (UTC) that match every
    given filter. An empty filter matches everything."""

    since: datetime
    until: datetime
    apps: tuple[str, ...] = ()
    levels: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    text: str = ""
    """Words and "quoted phrases" (:func:`parse_text`): every one must match, case-insensitively, as whole words."""
    tags: tuple[tuple[str, str], ...] = ()
    """(key, value) pairs: ``tags[key] = value`` for every one."""


@dataclass
class Where:
    """A WHERE clause and its parameters, built from a :class:`LogQuery`."""

    clauses: list[str] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)

    def add(self, clause: str, **parameters: Any) -> None:
        self.clauses.append(clause)
        self.parameters.update(parameters)

    @property
    def sql(self) -> str:
        return " AND ".join(self.clauses) or "1"


def naive_utc(t: datetime) -> datetime:
    """Naive UTC, as the store's DateTime64 parameters (and Plotly's axes) take it; a naive ``t`` is already UTC."""
    return t.astimezone(UTC).replace(tzinfo=None) if t.tzinfo else t


def where_clause(query: LogQuery) -> Where:
    """``query`` as a WHERE clause on ``logs`` and its parameters (every user input a parameter)."""
    where = Where()
    where.add("corrected_event_time >= {since:DateTime64(3)} AND corrected_event_time < {until:DateTime64(3)}",
              since=naive_utc(query.since), until=naive_utc(query.until))
    # ``IN {x:Array(String)}``: the key condition the primary key (app, level, ...) prunes with.
    for column, values in (("app", query.apps), ("level", query.levels), ("name", query.names)):
        if values:
            where.add(f"{column} IN {{{column}s:Array(String)}}", **{f"{column}s": list(values)})
    words, phrases = parse_text(query.text)
    needles = list(dict.fromkeys([*words, *(t for p in phrases for t in p.split())]))
    for i, needle in enumerate(needles):
        # The index's own expression, so the token bloom filter skips granules without the word.
        where.add(f"hasToken(lowerUTF8(message), lowerUTF8({{w{i}:String}}))", **{f"w{i}": needle})
    for i, phrase in enumerate(phrases):
        where.add(f"match(lowerUTF8(message), {{p{i}:String}})", **{f"p{i}": phrase_regex(phrase)})
    for i, (key, value) in enumerate(query.tags):
        # has(mapValues(...)) lets the tag_values bloom filter skip granules; the map lookup is the exact test.
        where.add(f"has(mapValues(tags), {{tv{i}:String}}) AND tags[{{tk{i}:String}}] = {{tv{i}:String}}",
                  **{f"tk{i}": key, f"tv{i}": value})
    return where



def window_counts(client: Client, query: LogQuery, window_s: int) -> dict[tuple[str, int], int]:
    """How many lines match ``query`` in each ``window_s``-second window of its range (windows aligned to the epoch,
    as the job's tumbling windows are), per app: ``{(app, window end in epoch ms): lines}``. A window without a
    matching line is absent. One query, over the same WHERE clause (and so the same indexes) as a search."""
    where = where_clause(query)
    width = window_s * 1000
    rows = client.query(
        "SELECT app, (intDiv(toUnixTimestamp64Milli(corrected_event_time), {width:UInt64}) + 1) * {width:UInt64} "
        f"AS window_end, count() FROM logs WHERE {where.sql} GROUP BY app, window_end",
        parameters={**where.parameters, "width": width}).result_rows
    return {(app, int(end)): int(lines) for app, end, lines in rows}
