"""Statement scanning without a parser: where an ``INSERT … FORMAT X`` statement ends and its data begins, and a
statement's trailing ``FORMAT``; linear in the text, since it runs on whatever a client sends."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from store.server.errors import StoreError

# Every regex here is anchored or matched at a given position, with possessive/atomic repetition: its time is
# linear in the text it reads (a quadratic one let a 40 KB request stall the server for seconds).
SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*+")
_TOKEN = re.compile(rb"""
    (?P<ws>\s++)
  | (?P<comment>--[^\n]*+|\#[^\n]*+)
  | (?P<string>'(?:[^'\\]++|\\.?)*+(?:'|\Z)|"(?:[^"\\]++|\\.?)*+(?:"|\Z)|`(?:[^`\\]++|\\.?)*+(?:`|\Z))
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*+)
  | (?P<block>/\*)
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)


@dataclass(frozen=True)
class InsertSplit:
    """``INSERT INTO <target> [SETTINGS …] FORMAT <fmt>`` followed by its data: where each part is."""

    target: str
    settings: str          # "SETTINGS …" or ""
    fmt: str
    statement_end: int     # the statement is head[:statement_end]
    data_start: int        # the data begins at head[data_start:]


def _tokens(text: bytes, pos: int = 0) -> Iterator[tuple[str, int, int]]:
    """(kind, start, end) of ClickHouse's lexical tokens, enough to find keywords outside strings and comments.
    Linear: each token is matched once at its position; block comments nest (as ClickHouse's lexer allows)."""
    n = len(text)
    while pos < n:
        match = _TOKEN.match(text, pos)
        assert match is not None and match.lastgroup is not None   # ``other`` matches any single byte
        kind, end = match.lastgroup, match.end()
        if kind == "block":
            # Each find() resumes only once the scan has passed its last answer: linear however deep the nesting.
            depth, close, opening = 1, -1, -1
            while depth and end < n:
                if close < end:
                    close = text.find(b"*/", end)
                    if close < 0:
                        end = n         # unterminated: the rest is comment
                        break
                if opening != n and opening < end:
                    opening = text.find(b"/*", end)
                    opening = n if opening < 0 else opening
                if opening < close:
                    depth, end = depth + 1, opening + 2
                else:
                    depth, end = depth - 1, close + 2
            kind = "comment"
        yield kind, pos, end
        pos = end


def split_insert(head: bytes) -> InsertSplit | bool | None:
    """Where an ``INSERT … FORMAT X`` statement ends and its data begins (ClickHouse's rule: after the format name,
    spaces, and one newline; or right after ``VALUES``). None: not an insert with data after it (the text is one
    statement); False: the head ends before the statement does."""
    words: list[tuple[bytes, int, int]] = []
    depth = 0
    target_start = settings_start = -1
    for kind, start, end in _tokens(head):
        if kind in ("ws", "comment"):
            continue
        if kind != "word":
            if depth == 0 and not words:
                return None
            depth += {b"(": 1, b")": -1}.get(head[start:end], 0)
            continue
        word = head[start:end].upper()
        if not words:
            if word != b"INSERT":
                return None
        elif len(words) == 1:
            if word != b"INTO":
                return None
            target_start = end
        elif depth == 0 and word in (b"SELECT", b"WITH"):
            return None
        elif depth == 0 and word == b"VALUES":      # the data (in the Values format) begins right after it
            end_of_target = settings_start if settings_start >= 0 else start
            return InsertSplit(_utf8(head[target_start:end_of_target]).strip(),
                               _utf8(head[settings_start:start]).strip() if settings_start >= 0 else "",
                               "Values", end, end)
        elif depth == 0 and word == b"SETTINGS" and settings_start < 0:
            settings_start = start
        elif depth == 0 and word == b"FORMAT":
            return _after_format(head, end, target_start, settings_start, start)
        words.append((word, start, end))
    return False if words else None


def _after_format(head: bytes, pos: int, target_start: int, settings_start: int, format_start: int) \
        -> InsertSplit | bool:
    n = len(head)
    while pos < n and head[pos] in b" \t":
        pos += 1
    name_start = pos
    while pos < n and (head[pos:pos + 1].isalnum() or head[pos] == 95):
        pos += 1
    if pos == n:
        return False
    if pos == name_start:
        raise StoreError.of(62, "SYNTAX_ERROR", "Syntax error: expected a format name after FORMAT")
    statement_end = pos
    while pos < n and head[pos] in b" \t\r":
        pos += 1
    if pos == n:
        return False
    if head[pos] == 10:
        pos += 1
    end_of_target = settings_start if settings_start >= 0 else format_start
    return InsertSplit(_utf8(head[target_start:end_of_target]).strip(),
                       _utf8(head[settings_start:format_start]).strip() if settings_start >= 0 else "",
                       _utf8(head[name_start:statement_end]), statement_end, pos)


def _utf8(text: bytes) -> str:
    try:
        return text.decode()
    except UnicodeDecodeError:
        raise StoreError.of(36, "BAD_ARGUMENTS", "Query is not valid UTF-8") from None
