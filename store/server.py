"""``eventide store serve``: the one process that owns the embedded chDB directory and serves ClickHouse's HTTP
interface (the subset clickhouse-connect's ``http://`` client uses) on loopback.

Why a process of its own: chDB allows one process per data directory and has no server. Opening it per unit of
work was slow and left threads and descriptors behind at every open (docs/architecture.md, "Store access";
docs/performance.md#one-store-server-dashboard-queries).
Here the engine starts once, kept alive by an anchor connection held for the life of the process, and the job,
the dashboard, the evaluator, the tests and the benches all use the code path of a production ClickHouse server.

chDB is clickhouse-local in-process: ClickHouse's access control does not apply, so this server enforces what a
ClickHouse server would (its HTTP interface, users and profiles):

- HTTP from uvicorn/h11 (request parsing, chunked bodies, keep-alive); a request's head must arrive within
  ``http_headers_timeout_s`` and its body within ``http_receive_timeout_s``; connections, concurrent queries,
  the head, the statement and the (decompressed) body are bounded (``StoreConfig``).
- Two users (``store/credentials.py``): the writer ``default`` and a read-only reader (``readonly = 2``). The
  password is checked on the headers, before a byte of the body is read. GET runs with ``readonly = 1``.
- Requests a browser could send for a web page are refused: an ``Origin`` header, ``Sec-Fetch-Site`` cross-site
  or same-site, a ``Host`` other than the address served (DNS rebinding).
- Every statement passes ``store.sql_guard`` (decided by ClickHouse's own parser): one statement, no table
  function or clause that reaches the host, no ``USE``/``SET``/temporary table; SETTINGS within the caps.
- Every query runs under ``max_execution_time``, ``max_memory_usage`` and ``max_result_bytes`` a client cannot
  raise. chDB calls block, so they run on a bounded thread pool, never on the event loop.

Requests run on chDB connection handles from a small pool. Handles to the running engine are cheap (~1 ms) and
carry session state (database, settings): a handle is reused only by requests asking for the same database and
settings, and carries only what the pool applied when it opened it, since the guard lets no statement that
changes session state through. An acknowledged insert has been committed by chDB as a part on disk.

    python -m store.server            (or: eventide store serve)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import concurrent.futures
import contextlib
import fcntl
import hmac
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import chdb
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from eventide.config import Config, StoreConfig, load_config_or_exit
from eventide.http_deadline import HeadDeadlineProtocol
from store import credentials, sql_guard

log = logging.getLogger("eventide.store.server")

IDLE_HANDLES = 8
"""chDB handles kept open between requests (more are opened while more requests run at once)."""
DRAIN_S = 20.0
"""On SIGTERM: longest wait for requests in progress before chDB is closed."""
LOG_SLOW_S = 5.0
"""Requests slower than this are logged."""
ERRORS_LOGGED_PER_S = 20
"""Error answers logged per second at most (the rest are only counted by their clients)."""
WRITER, READER = "writer", "reader"

# URL parameters that belong to the HTTP transport, not to the query's settings (ClickHouse's HTTP handler
# consumes them itself; chDB would reject most as unknown settings).
TRANSPORT_PARAMS = frozenset({
    "query", "database", "default_format", "user", "password", "query_id", "quota_key", "role",
    "session_id", "session_timeout", "session_check", "compress", "decompress", "buffer_size",
    "wait_end_of_query", "client_protocol_version", "enable_http_compression", "http_zlib_compression_level",
    "send_progress_in_http_headers", "http_headers_progress_interval_ms",
})
# Every regex here is anchored or matched at a given position, with possessive/atomic repetition: its time is
# linear in the text it reads (a quadratic one let a 40 KB request stall the server for seconds).
_SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*+")
_TOKEN = re.compile(rb"""
    (?P<ws>\s++)
  | (?P<comment>--[^\n]*+|\#[^\n]*+)
  | (?P<string>'(?:[^'\\]++|\\.?)*+(?:'|\Z)|"(?:[^"\\]++|\\.?)*+(?:"|\Z)|`(?:[^`\\]++|\\.?)*+(?:`|\Z))
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*+)
  | (?P<block>/\*)
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)

# ClickHouse's exceptionCodeToHTTPStatus (src/Server/HTTP/exceptionCodeToHTTPStatus.cpp), by error name.
_STATUS_BY_ERROR = {
    **dict.fromkeys(("REQUIRED_PASSWORD",), 401),
    **dict.fromkeys(("UNKNOWN_USER", "WRONG_PASSWORD", "AUTHENTICATION_FAILED", "SET_NON_GRANTED_ROLE",
                     "ACCESS_DENIED", "READONLY"), 403),
    **dict.fromkeys((
        "BAD_ARGUMENTS", "CANNOT_COMPILE_REGEXP", "CANNOT_PARSE_TEXT", "CANNOT_PARSE_ESCAPE_SEQUENCE",
        "CANNOT_PARSE_QUOTED_STRING", "CANNOT_PARSE_DATE", "CANNOT_PARSE_DATETIME", "CANNOT_PARSE_NUMBER",
        "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING", "CANNOT_PARSE_IPV4", "CANNOT_PARSE_IPV6",
        "CANNOT_PARSE_INPUT_ASSERTION_FAILED", "CANNOT_PARSE_UUID", "DUPLICATE_COLUMN", "ILLEGAL_COLUMN",
        "UNKNOWN_ELEMENT_IN_AST", "UNKNOWN_TYPE_OF_AST_NODE", "THERE_IS_NO_COLUMN", "TOO_DEEP_AST", "TOO_BIG_AST",
        "UNEXPECTED_AST_STRUCTURE", "SYNTAX_ERROR", "INCORRECT_DATA", "TYPE_MISMATCH",
        "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE", "CANNOT_DECOMPRESS",
        "SUPPORT_IS_DISABLED", "SETTING_CONSTRAINT_VIOLATION", "NO_DATA_TO_INSERT"), 400),   # (bad input)
    **dict.fromkeys((
        "UNKNOWN_TABLE", "UNKNOWN_FUNCTION", "UNKNOWN_IDENTIFIER", "UNKNOWN_TYPE", "UNKNOWN_STORAGE",
        "UNKNOWN_DATABASE", "UNKNOWN_SETTING", "UNKNOWN_DIRECTION_OF_SORTING", "UNKNOWN_AGGREGATE_FUNCTION",
        "UNKNOWN_FORMAT", "UNKNOWN_DATABASE_ENGINE", "UNKNOWN_TYPE_OF_QUERY", "UNKNOWN_ROLE"), 404),
    "QUERY_IS_TOO_LARGE": 413, "NOT_IMPLEMENTED": 501, "SOCKET_TIMEOUT": 503, "CANNOT_OPEN_FILE": 503,
    "HTTP_LENGTH_REQUIRED": 411, "TIMEOUT_EXCEEDED": 408, "CANNOT_SCHEDULE_TASK": 503,
    "UNSUPPORTED_MEDIA_TYPE": 415, "TOO_MANY_SIMULTANEOUS_QUERIES": 503, "TOO_MANY_ROWS_OR_BYTES": 500,
    "UNSUPPORTED_METHOD": 405,
}
_CONTENT_TYPES = {"Native": "application/octet-stream", "RowBinary": "application/octet-stream",
                  "TabSeparated": "text/tab-separated-values; charset=UTF-8",
                  "JSON": "application/json; charset=UTF-8", "JSONEachRow": "application/x-ndjson; charset=UTF-8"}


class StoreError(Exception):
    """An error answered the way ClickHouse answers it: ``Code: N. DB::Exception: … (NAME)``."""

    def __init__(self, message: str, code: int, name: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.name, self._status = message, code, name, status

    @classmethod
    def of(cls, code: int, name: str, text: str, status: int | None = None) -> StoreError:
        return cls(f"Code: {code}. DB::Exception: {text}. ({name})", code, name, status)

    @classmethod
    def from_chdb(cls, exc: Exception) -> StoreError:
        text = str(exc)
        text = text[text.find("Code: "):].strip() if "Code: " in text else text.strip()
        code, name = _error_code(text)
        if code is None:
            return cls.of(1000, "POCO_EXCEPTION", text or type(exc).__name__)   # ClickHouse's "unknown" family
        return cls(text, code, name)

    @property
    def status(self) -> int:
        return self._status or _STATUS_BY_ERROR.get(self.name, 500)


def _error_code(text: str) -> tuple[int | None, str]:
    """``Code: N. … (NAME)`` → (N, NAME), with string methods: the text may hold a client's query."""
    if not text.startswith("Code: "):
        return None, ""
    digits = text[6:6 + 12].split(".", 1)[0]
    if not digits.isdigit():
        return None, ""
    tail = text.rstrip()
    name = ""
    if tail.endswith(")"):
        candidate = tail[tail.rfind("(") + 1:-1]
        if candidate and all(c.isupper() or c.isdigit() or c == "_" for c in candidate):
            name = candidate
    return int(digits), name


def _refused(status: int, text: str) -> StoreError:
    """A request refused before it reaches chDB (ClickHouse answers these with ACCESS_DENIED or its HTTP code)."""
    return StoreError.of(497, "ACCESS_DENIED", text, status)


class Cancel:
    """Lets the event loop cancel a query running on a pool thread when its client leaves."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stream: Any = None
        self.cancelled = False

    @contextlib.contextmanager
    def running(self, stream: Any) -> Iterator[None]:
        with self._lock:
            self._stream = stream
            if self.cancelled:
                stream.cancel()
        try:
            yield
        finally:
            with self._lock:
                self._stream = None

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            if self._stream is not None:
                self._stream.cancel()     # chDB stops the query after the block it is computing


@dataclass(frozen=True)
class Answer:
    body: bytes
    fmt: str | None        # X-ClickHouse-Format: set when the statement produced a result set
    summary: dict[str, str]


@dataclass(frozen=True)
class HandleState:
    """What a chDB handle carries between queries; requests share a handle only when this is equal."""

    database: str
    settings: tuple[tuple[str, str], ...]


PARSER = HandleState("", (("readonly", "2"),))
"""The handles the statement guard parses on: nothing they run can change anything."""


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class HandlePool:
    """chDB connection handles to the one running engine, reused per :class:`HandleState`."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._idle: list[tuple[HandleState, Any]] = []
        self._lock = threading.Lock()

    def _open(self, state: HandleState) -> Any:
        conn = chdb.connect(self._path)
        try:
            if state.database:
                conn.query(f"USE `{state.database.replace('`', '``')}`", "TabSeparated")
            for name, value in state.settings:   # ``readonly`` sorts last of the caps: nothing is SET after it
                conn.query(f"SET {name} = {_quote(value)}", "TabSeparated")
        except Exception as exc:
            conn.close()
            raise StoreError.from_chdb(exc) from None
        return conn

    @contextlib.contextmanager
    def lease(self, state: HandleState) -> Iterator[Any]:
        """A handle in ``state`` for one statement (one the guard admitted: it leaves that state as it was)."""
        with self._lock:
            found = next((i for i, (s, _) in enumerate(self._idle) if s == state), None)
            conn = self._idle.pop(found)[1] if found is not None else None
        conn = conn or self._open(state)
        try:
            yield conn
        finally:   # a failed statement leaves the handle as it was
            self._release(state, conn)

    def _release(self, state: HandleState, conn: Any) -> None:
        with self._lock:
            self._idle.append((state, conn))
            evicted = self._idle.pop(0)[1] if len(self._idle) > IDLE_HANDLES else None
        if evicted is not None:
            evicted.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for _, conn in idle:
            conn.close()


# --------------------------------------------------------------------------------------------- statement scanning

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


def explicit_format(text: str) -> str | None:
    """The statement's trailing ``FORMAT <name>``, if any (string methods only: linear in the text)."""
    parts = text.rstrip().rstrip(";").rsplit(None, 2)
    if len(parts) >= 2 and parts[-2].upper() == "FORMAT" and _SETTING_NAME.fullmatch(parts[-1]):
        return parts[-1]
    return None


# --------------------------------------------------------------------------------------------------------- engine

class Engine:
    """The chDB directory, opened once: an anchor connection keeps the engine up; statements run on pooled handles."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self._owner = open(data_dir.with_name(data_dir.name + ".lock"), "a+")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(self._owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._owner.close()
            raise RuntimeError(f"{data_dir} is already served by another process") from None
        self.path = str(data_dir.resolve())
        self.staging = data_dir.with_name(data_dir.name + "-inserts")
        self.staging.mkdir(mode=0o700, exist_ok=True)
        for leftover in self.staging.iterdir():       # an insert's data from before a crash: never acknowledged
            leftover.unlink(missing_ok=True)
        self._anchor = chdb.connect(self.path)
        version, tz = self._anchor.query("SELECT version(), timezone()", "TabSeparated").bytes().decode().split()
        self.version, self.timezone = version, tz
        self.handles = HandlePool(self.path)

    def close(self) -> None:
        """Pooled handles first, the anchor last: the engine shuts down (cleanly) with its last connection."""
        self.handles.close()
        self._anchor.close()
        self._owner.close()

    def parse(self, sql: str) -> str:
        """The statement guard's parser calls (``parseQueryToJSON``, ``EXPLAIN AST``): their TabSeparatedRaw text;
        chDB's error (``Code: N. …``) is raised as it is."""
        with self.handles.lease(PARSER) as conn:
            return conn.query(sql, "TabSeparatedRaw").bytes().decode()

    def query(self, text: str, state: HandleState, params: dict[str, str], default_format: str,
              explicit: str | None, cancel: Cancel | None = None) -> Answer:
        # Without a FORMAT clause ClickHouse answers in default_format and names it in X-ClickHouse-Format only
        # when the statement has a result set; asking chDB for the names line tells the two apart.
        with_names = not explicit and default_format == "TabSeparated"
        fmt = explicit or ("TabSeparatedWithNames" if with_names else default_format)
        with self.handles.lease(state) as conn:
            try:
                if cancel is not None and fmt == "Native":
                    try:
                        return self._streamed(conn, text, params, cancel)
                    except Exception as exc:     # chDB streams SELECTs only (not DESCRIBE, SHOW, EXISTS, …)
                        if "Streaming query is not supported" not in str(exc):
                            raise
                result = conn.query(text, fmt, params=params)
            except StoreError:
                raise
            except Exception as exc:
                raise StoreError.from_chdb(exc) from None
        body = result.bytes() or b""
        result_fmt: str | None = explicit or default_format
        if with_names:
            result_fmt = "TabSeparated" if body else None
            body = body[body.find(b"\n") + 1:] if body else b""
        return Answer(body, result_fmt, _summary(result, written=False))

    @staticmethod
    def _streamed(conn: Any, text: str, params: dict[str, str], cancel: Cancel) -> Answer:
        """A Native query read block by block, so a client that leaves can cancel it between blocks (chDB's
        streaming query; Native blocks concatenate into one Native answer, other formats' blocks would not)."""
        stream = conn.send_query(text, "Native", params=params)
        parts: list[bytes] = []
        rows = size = 0
        elapsed = 0.0
        with cancel.running(stream):
            for block in stream:
                parts.append(block.bytes() or b"")
                rows, size, elapsed = rows + block.rows_read(), size + block.bytes_read(), elapsed + block.elapsed()
        if cancel.cancelled:
            raise ClientGone("cancelled: the client closed the connection")
        summary = {"read_rows": str(rows), "read_bytes": str(size), "written_rows": "0", "written_bytes": "0",
                   "total_rows_to_read": "0", "result_rows": str(rows), "result_bytes": "0",
                   "elapsed_ns": str(int(elapsed * 1e9))}
        return Answer(b"".join(parts), "Native", summary)

    def insert(self, split: InsertSplit, staged: str, state: HandleState) -> Answer:
        """``INSERT … FORMAT X`` with its data staged in a file: chDB reads it with FROM INFILE (as
        clickhouse-connect's own chdb driver does)."""
        clause = f" {split.settings}" if split.settings else ""
        sql = f"INSERT INTO {split.target} FROM INFILE {_quote(staged)}{clause} FORMAT {split.fmt}"
        with self.handles.lease(state) as conn:
            try:
                result = conn.query(sql, "TabSeparated")
            except Exception as exc:
                raise StoreError.from_chdb(exc) from None
        return Answer(b"", None, _summary(result, written=True))


def _summary(result: Any, written: bool) -> dict[str, str]:
    """X-ClickHouse-Summary. An INFILE insert reads exactly the rows it writes."""
    rows, size = str(result.rows_read()), str(result.bytes_read())
    return {"read_rows": "0" if written else rows, "read_bytes": "0" if written else size,
            "written_rows": rows if written else "0", "written_bytes": size if written else "0",
            "total_rows_to_read": "0", "result_rows": "0" if written else rows, "result_bytes": "0",
            "elapsed_ns": str(int(result.elapsed() * 1e9))}


# -------------------------------------------------------------------------------------------------- the statement guard

VERDICTS_KEPT = 1024
"""Admitted statements whose verdict is remembered (the job and the dashboard send the same texts again and again;
a verdict depends only on the text and the role). Only statements up to ``VERDICT_TEXT_MAX`` bytes are kept."""
VERDICT_TEXT_MAX = 8192
_verdicts: collections.OrderedDict[tuple[str, str], sql_guard.Verdict] = collections.OrderedDict()
_verdicts_lock = threading.Lock()


def remembered(statement: str, role: str, read_only: bool) -> sql_guard.Verdict | None:
    """The verdict already given to this statement and role, if it is remembered."""
    key = (statement, READER if read_only else role)
    with _verdicts_lock:
        verdict = _verdicts.get(key)
        if verdict is not None:
            _verdicts.move_to_end(key)
        return verdict


def guard(statement: str, role: str, read_only: bool, limits: Limits, engine: Engine) -> sql_guard.Verdict:
    """The one place every statement is checked before chDB runs it (``store.sql_guard``, from ClickHouse's own
    parser): a refused statement raises a :class:`StoreError` with the guard's code, name and message."""
    role = READER if read_only else role
    key = (statement, role)
    with _verdicts_lock:
        verdict = _verdicts.get(key)
        if verdict is not None:
            _verdicts.move_to_end(key)
            return verdict
    try:
        verdict = sql_guard.check(statement, role=role, parse=engine.parse,  # type: ignore[arg-type]
                                  caps=limits.caps, max_query_size=limits.max_query_size)
    except sql_guard.Refused as exc:
        raise StoreError.of(exc.code, exc.name, exc.message, exc.http_status) from None
    if len(statement) <= VERDICT_TEXT_MAX:
        with _verdicts_lock:
            _verdicts[key] = verdict
            if len(_verdicts) > VERDICTS_KEPT:
                _verdicts.popitem(last=False)
    return verdict


# -------------------------------------------------------------------------------------------------- request bodies

def _decompressor(encoding: str) -> Callable[[], Any] | None:
    """A factory of incremental decompressors with ``decompress(data, max_length)``, ``eof``, ``unused_data`` and
    ``needs_input`` (concatenated frames/members each get a new one)."""
    if encoding in ("", "identity"):
        return None
    if encoding == "lz4":
        import lz4.frame

        return lz4.frame.LZ4FrameDecompressor
    if encoding == "zstd":
        from clickhouse_connect.driver.compression import _zstd_decompressor

        return _zstd_decompressor
    if encoding in ("gzip", "x-gzip"):
        return lambda: _Zlib(zlib.decompressobj(wbits=31))
    if encoding == "deflate":
        return lambda: _Zlib(zlib.decompressobj())
    raise StoreError.of(36, "BAD_ARGUMENTS", f"Unsupported Content-Encoding: {encoding}", 415)


class _Zlib:
    """zlib's decompressobj with the interface of lz4/zstd's incremental decompressors."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def decompress(self, data: bytes, max_length: int) -> bytes:
        return self._obj.decompress(self._obj.unconsumed_tail + data, max_length)

    @property
    def needs_input(self) -> bool:
        return not self._obj.unconsumed_tail

    @property
    def eof(self) -> bool:
        return self._obj.eof

    @property
    def unused_data(self) -> bytes:
        return self._obj.unused_data


INLINE_SCAN = 16 * 1024
"""Heads up to this long are scanned for an insert's split on the event loop (well under a millisecond)."""
STEP = 1 << 20
"""Decompressed bytes produced per step: a small input cannot make one step allocate much (a zip bomb)."""


def _inflate(make: Callable[[], Any], chunk: bytes, state: list[Any]) -> Iterator[bytes]:
    """The decompressed bytes of ``chunk``, continuing the stream in ``state`` ([decompressor])."""
    data = chunk
    while True:
        if state[0] is None:
            state[0] = make()
        dec = state[0]
        try:
            out = dec.decompress(data, STEP)
        except Exception as exc:  # lz4/zstd/zlib each raise their own kind
            raise StoreError.of(271, "CANNOT_DECOMPRESS", f"Cannot decompress the request body: {exc}") from None
        data = b""
        if out:
            yield out
        if dec.eof:
            rest = dec.unused_data
            state[0] = None
            if not rest:
                return
            data = rest
        elif dec.needs_input:
            return


# ---------------------------------------------------------------------------------------------------- HTTP (ASGI)

@dataclass(frozen=True)
class Limits:
    """What one request may use (``StoreConfig``)."""

    max_query_size: int
    max_insert_bytes: int
    max_concurrent_queries: int
    receive_timeout_s: float
    caps: dict[str, float]
    allowed_hosts: frozenset[str]
    max_head_size: int

    @classmethod
    def of(cls, store: StoreConfig) -> Limits:
        # Host with the port (what every HTTP client sends), or a loopback name alone: a DNS-rebound page's Host
        # is its own domain name, never one of these.
        hosts = {f"{store.host}:{store.port}"}
        if store.host in ("127.0.0.1", "localhost"):
            hosts |= {f"127.0.0.1:{store.port}", f"localhost:{store.port}", "127.0.0.1", "localhost"}
        if store.host in ("::1", "[::1]"):
            hosts |= {f"[::1]:{store.port}", f"localhost:{store.port}", "[::1]", "localhost"}
        return cls(store.max_query_size, store.max_insert_bytes, store.max_concurrent_queries,
                   store.http_receive_timeout_s,
                   {"max_execution_time": store.max_execution_time, "max_memory_usage": store.max_memory_usage,
                    "max_result_bytes": store.max_result_bytes}, frozenset(h.lower() for h in hosts),
                   store.http_max_field_value_size)


class ClientGone(Exception):
    """The client closed the connection before its request was complete."""


class StoreApp:
    """The ASGI application: ClickHouse's HTTP interface over :class:`Engine`."""

    def __init__(self, engine: Engine, users: dict[str, tuple[str, str]], limits: Limits) -> None:
        self.engine, self.users, self.limits = engine, users, limits
        self.pool = concurrent.futures.ThreadPoolExecutor(limits.max_concurrent_queries, "chdb")
        self.running = 0
        self._logged_at, self._logged = 0.0, 0
        self._busy = 0
        self._idle = threading.Condition()

    # The threads' own count: SIGTERM waits on it before chDB is closed.
    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._idle:
            self._busy += 1
        try:
            return fn(*args)
        finally:
            with self._idle:
                self._busy -= 1
                self._idle.notify_all()

    def _check_slot(self) -> None:
        if self.running >= self.limits.max_concurrent_queries:
            raise StoreError.of(202, "TOO_MANY_SIMULTANEOUS_QUERIES", "Too many simultaneous queries. Maximum: "
                                f"{self.limits.max_concurrent_queries}")

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """A query running on chDB, counted against ``max_concurrent_queries``. Only execution counts: a client
        slow to send its body holds a connection (bounded, with a deadline), never a query slot."""
        self._check_slot()
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1

    def drain(self, timeout_s: float) -> bool:
        """Wait for queries in progress; True when none is left."""
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout_s)

    async def blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._run, fn, *args)

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                       send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            return
        query_id = ""
        headers: dict[str, str] = {}
        head_size = len(scope["raw_path"]) + len(scope["query_string"])
        for name, value in scope["headers"]:
            headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
            head_size += len(name) + len(value) + 4
        if head_size > self.limits.max_head_size:    # a head that arrived whole in one read (h11 bounds the rest)
            await self._fail(send, StoreError.of(229, "QUERY_IS_TOO_LARGE", f"The request head exceeds "
                                                 f"{self.limits.max_head_size} bytes (http_max_field_value_size)",
                                                 431), "", close=True)
            return
        try:
            params = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True,
                                    errors="strict"))
        except UnicodeDecodeError:
            await self._fail(send, StoreError.of(36, "BAD_ARGUMENTS", "URL parameters are not valid UTF-8"), "",
                             close=True)
            return
        query_id = params.get("query_id") or os.urandom(16).hex()
        started = time.perf_counter()
        try:
            self._refuse_browsers(headers)
            method, path = scope["method"], scope["path"].rstrip("/")
            if path in ("", "/ping") and method in ("GET", "HEAD") and "query" not in params:
                await self._send(send, 200, b"Ok.\n", {"Content-Type": "text/html; charset=UTF-8"})
                return
            role = self._authenticate(headers, params)
            if method not in ("GET", "POST"):
                raise StoreError.of(1, "UNSUPPORTED_METHOD", f"HTTP method {method} is not served", 405)
            if path not in ("", "/query"):
                raise StoreError.of(48, "NOT_IMPLEMENTED", f"No handler for {scope['path']}")
            if headers.get("content-type", "").startswith("multipart/"):
                raise StoreError.of(48, "NOT_IMPLEMENTED", "multipart requests (external data) are not served")
            make = _decompressor(headers.get("content-encoding", "").strip().lower())
            self._check_slot()        # chDB saturated: refused before the body is read
        except StoreError as exc:     # refused on the head alone: the body is never read, the connection closed
            await self._fail(send, exc, query_id, close=True)
            return
        try:
            answer, sql = await self._execute(scope, receive, params, headers, role, make)
        except ClientGone as exc:
            log.info("client %s went away mid-request (%s)", scope.get("client"), exc)
            return
        except StoreError as exc:
            # An over-long statement: the rest of its body is read and dropped (uvicorn does), so the client sees
            # the answer; a body over its size or deadline: the connection is closed.
            await self._fail(send, exc, query_id, close=exc.status == 408 or exc.name == "LIMIT_EXCEEDED")
            return
        except Exception as exc:  # a bug of ours: answered like ClickHouse's std::exception, the server goes on
            log.exception("request failed")
            await self._fail(send, StoreError.of(1001, "STD_EXCEPTION", f"{type(exc).__name__}: {exc}"), query_id)
            return
        elapsed = time.perf_counter() - started
        if elapsed > LOG_SLOW_S:
            log.info("slow request (%.1f s): %.200s", elapsed, sql)
        out = {"Content-Type": _CONTENT_TYPES.get(answer.fmt or "", "text/plain; charset=UTF-8"),
               "X-ClickHouse-Query-Id": query_id, "X-ClickHouse-Timezone": self.engine.timezone,
               "X-ClickHouse-Summary": json.dumps(answer.summary, separators=(",", ":"))}
        if answer.fmt:
            out["X-ClickHouse-Format"] = answer.fmt
        await self._send(send, 200, answer.body, out)

    def _refuse_browsers(self, headers: dict[str, str]) -> None:
        """A web page can make the browser POST here (a ``text/plain`` form needs no preflight); browsers mark
        such requests with ``Origin``/``Sec-Fetch-Site``, and a DNS-rebound name shows in ``Host``."""
        if "origin" in headers:
            raise _refused(403, f"Requests from web pages are refused (Origin: {headers['origin'][:100]})")
        if headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site"):
            raise _refused(403, f"Requests from web pages are refused (Sec-Fetch-Site: {headers['sec-fetch-site']})")
        host = headers.get("host")
        if host is not None and host.lower() not in self.limits.allowed_hosts:
            raise _refused(403, f"Host {host[:100]!r} is not the address this store serves "
                                f"({', '.join(sorted(self.limits.allowed_hosts))})")

    def _authenticate(self, headers: dict[str, str], params: dict[str, str]) -> str:
        """The role of the user the request names, given any way ClickHouse accepts; refused unless its password
        matches (checked on the head alone: no byte of the body has been read)."""
        user, password = params.get("user", "default"), params.get("password", "")
        if headers.get("x-clickhouse-user"):
            user, password = headers["x-clickhouse-user"], headers.get("x-clickhouse-key", "")
        auth = headers.get("authorization", "")
        if auth[:6].lower() == "basic ":
            try:
                user, _, password = base64.b64decode(auth[6:].strip(), validate=True).decode().partition(":")
            except ValueError:
                user, password = "", ""
        known = self.users.get(user)
        # compare_digest against a dummy for unknown users: the answer takes as long either way
        expected, role = known or ("\0unknown", "")
        if not hmac.compare_digest(password.encode(), expected.encode()) or known is None:
            raise StoreError.of(516, "AUTHENTICATION_FAILED", f"{user[:64]}: Authentication failed: password is "
                                "incorrect, or there is no user with such name")
        return role

    def _state(self, params: dict[str, str], headers: dict[str, str], role: str, read_only: bool) -> HandleState:
        """The handle state of this request: the caps, the URL's settings (within the caps), the role's readonly."""
        settings: dict[str, str] = {"max_execution_time": _num(self.limits.caps["max_execution_time"]),
                                    "max_memory_usage": _num(self.limits.caps["max_memory_usage"]),
                                    "max_result_bytes": _num(self.limits.caps["max_result_bytes"]),
                                    "result_overflow_mode": "throw"}
        readonly = 1 if read_only else 2 if role == READER else 0
        for name, value in params.items():
            if name in TRANSPORT_PARAMS or name.startswith("param_"):
                continue
            if not _SETTING_NAME.fullmatch(name):
                raise StoreError.of(115, "UNKNOWN_SETTING", f"Unknown setting '{name[:64]}'")
            if name == "result_overflow_mode" and value != "throw":
                raise StoreError.of(452, "SETTING_CONSTRAINT_VIOLATION",
                                    "Setting result_overflow_mode can only be 'throw' here", 403)
            try:     # the caps, readonly, and the settings that name files, URLs or dialects
                sql_guard.check_settings({name: value}, self.limits.caps)
            except sql_guard.Refused as exc:
                raise StoreError.of(exc.code, exc.name, exc.message, 403) from None
            settings[name] = value
        settings.update(sql_guard.ENFORCED_SETTINGS)     # after the client's: they cannot be undone
        ordered = tuple(sorted(settings.items()))
        if readonly:     # applied last: once it is set, the handle cannot change it
            ordered += (("readonly", str(readonly)),)
        database = headers.get("x-clickhouse-database") or params.get("database", "")
        return HandleState(database, ordered)

    async def _body(self, receive: Callable[[], Awaitable[dict[str, Any]]], make: Callable[[], Any] | None,
                    deadline: float) -> AsyncIterator[bytes]:
        """The request body, decompressed, as it arrives; the whole of it by ``deadline``."""
        state: list[Any] = [None]
        size = 0
        more = True
        while more:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise StoreError.of(209, "SOCKET_TIMEOUT", "The request body did not arrive within "
                                    f"{self.limits.receive_timeout_s:g} s (http_receive_timeout_s)", 408) from None
            if message["type"] == "http.disconnect":
                raise ClientGone("connection closed before the body was complete")
            more = message.get("more_body", False)
            chunk = message.get("body", b"")
            for out in (_inflate(make, chunk, state) if make else (chunk,) if chunk else ()):
                size += len(out)
                if size > self.limits.max_insert_bytes:
                    raise StoreError.of(290, "LIMIT_EXCEEDED",
                                        f"The request body exceeds {self.limits.max_insert_bytes} bytes "
                                        "(max_insert_bytes, after decompression)", 413)
                yield out

    async def _execute(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                       params: dict[str, str], headers: dict[str, str], role: str,
                       make: Callable[[], Any] | None) -> tuple[Answer, str]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.receive_timeout_s
        read_only = scope["method"] == "GET"
        state = self._state(params, headers, role, read_only)
        default_format = params.get("default_format", "TabSeparated")
        try:
            sql_guard.check_format(default_format)
        except sql_guard.Refused as exc:
            raise StoreError.of(exc.code, exc.name, exc.message, 400) from None
        limit = self.limits.max_query_size
        query = params.get("query", "").encode()
        if len(query) > limit:
            raise _too_large(limit)
        # ClickHouse's rule: the ``query`` parameter, then the body; an INSERT's data begins after its FORMAT name.
        head = bytearray(query)
        body = self._body(receive, make, deadline) if scope["method"] == "POST" else None
        ended = body is None
        split: InsertSplit | bool | None = None
        if query and not ended:
            # clickhouse-connect's inserts: the statement in ``query``, the data in the body (all of it).
            head += b"\n"
            split = await self._split(head)
        if not isinstance(split, InsertSplit):
            while not ended and len(head) <= limit:
                try:
                    chunk = await anext(body)      # type: ignore[arg-type]
                except StopAsyncIteration:
                    ended = True
                    break
                head += chunk
            split = await self._split(head[:limit + 1]) if head else None
        if isinstance(split, InsertSplit):
            if split.statement_end > limit:
                raise _too_large(limit)
            statement = head[:split.statement_end].decode(errors="replace")
            verdict = (remembered(statement, role, read_only)
                       or await self.blocking(guard, statement, role, read_only, self.limits, self.engine))
            if verdict.kind != "insert" or not verdict.expects_data:
                raise StoreError.of(62, "SYNTAX_ERROR", "Data follows a statement that takes none", 400)
            with tempfile.NamedTemporaryFile(prefix="insert-", suffix=".data", dir=self.engine.staging) as staged:
                staged.write(head[split.data_start:])
                del head
                if not ended:
                    async for chunk in body:      # type: ignore[union-attr]
                        staged.write(chunk)
                staged.flush()
                with self.slot():
                    return await self.blocking(self.engine.insert, split, staged.name, state), statement
        if not ended or len(head) > limit:
            raise _too_large(limit)
        try:
            text = bytes(head).decode()
        except UnicodeDecodeError:
            raise StoreError.of(36, "BAD_ARGUMENTS", "Query is not valid UTF-8") from None
        if not text.strip():
            raise StoreError.of(62, "SYNTAX_ERROR", "Empty query")
        bound = {k[len("param_"):]: v for k, v in params.items() if k.startswith("param_")}
        cancel = Cancel()
        with self.slot():
            work = asyncio.ensure_future(self.blocking(self._guarded_query, text, role, read_only, state, bound,
                                                       default_format, cancel))
            gone = asyncio.ensure_future(_disconnected(receive))
            try:
                await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not gone.done():
                    gone.cancel()
            if not work.done():   # the client left: cancel (Native reads, between blocks), else max_execution_time
                started = time.perf_counter()
                cancel.cancel()
                with contextlib.suppress(Exception):
                    await work
                raise ClientGone(f"closed the connection while its query ran; the query ended "
                                 f"{time.perf_counter() - started:.2f} s later")
            return work.result(), text

    async def _split(self, head: bytearray) -> InsertSplit | bool | None:
        """:func:`split_insert` of ``head``; a long one is scanned on a pool thread (linear, but not on the loop)."""
        return split_insert(bytes(head)) if len(head) <= INLINE_SCAN else await self.blocking(split_insert, bytes(head))

    def _guarded_query(self, text: str, role: str, read_only: bool, state: HandleState, bound: dict[str, str],
                       default_format: str, cancel: Cancel) -> Answer:
        """The guard, then the query, on one pool thread (one hop off the event loop, not two)."""
        verdict = guard(text, role, read_only, self.limits, self.engine)
        explicit = (verdict.format or explicit_format(text)) if verdict.kind == "select" else None
        return self.engine.query(text, state, bound, default_format, explicit,
                                 cancel if verdict.kind == "select" else None)

    async def _fail(self, send: Callable[[dict[str, Any]], Awaitable[None]], exc: StoreError, query_id: str,
                    close: bool = False) -> None:
        body = f"{exc.message} (version {self.engine.version})\n".encode()
        now = time.monotonic()
        if now - self._logged_at > 1.0:
            self._logged_at, self._logged = now, 0
        self._logged += 1
        if self._logged <= ERRORS_LOGGED_PER_S:      # a flood of refusals must not flood the log
            log.info("answered %d: %.300s", exc.status, exc.message.replace("\n", " "))
        headers = {"Content-Type": "text/plain; charset=UTF-8", "X-ClickHouse-Exception-Code": str(exc.code)}
        if query_id:
            headers["X-ClickHouse-Query-Id"] = query_id
        if close:
            headers["Connection"] = "close"
        await self._send(send, exc.status, body, headers)

    async def _send(self, send: Callable[[dict[str, Any]], Awaitable[None]], status: int, body: bytes,
                    headers: dict[str, str]) -> None:
        raw = [(k.encode("latin-1"), v.encode("latin-1", "replace")) for k, v in headers.items()]
        raw.append((b"content-length", str(len(body)).encode()))
        try:
            await send({"type": "http.response.start", "status": status, "headers": raw})
            await send({"type": "http.response.body", "body": body})
        except OSError as exc:
            log.info("client went away before its answer (%s)", exc)


async def _disconnected(receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    """Returns when the client closes the connection (its request body has been read whole already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _too_large(limit: int) -> StoreError:
    return StoreError.of(229, "QUERY_IS_TOO_LARGE",
                         f"The statement is longer than max_query_size ({limit} bytes)", 413)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# ------------------------------------------------------------------------------------------ connections (uvicorn)

def protocol(store: StoreConfig) -> type[H11Protocol]:
    """uvicorn's h11 protocol with what it lacks for a server facing hostile local clients: a cap on connections
    (one over it is closed at once), a bound on the size of a request head (431) and a deadline for it
    (:class:`HeadDeadlineProtocol`), all answered in ClickHouse's error format."""

    class StoreProtocol(HeadDeadlineProtocol):
        head_timeout_s = store.http_headers_timeout_s
        max_connections = store.max_connections

        def head_pending(self) -> bool:
            if self._head_bytes > store.http_max_field_value_size:
                self._reject(431, 229, "QUERY_IS_TOO_LARGE", f"The request head exceeds "
                             f"{store.http_max_field_value_size} bytes (http_max_field_value_size)")
                return False
            return True

        def late_response(self) -> bytes:
            return _error_response(408, 209, "SOCKET_TIMEOUT", f"The request head did not arrive within "
                                   f"{store.http_headers_timeout_s:g} s (http_headers_timeout_s)")

        def send_400_response(self, msg: str) -> None:
            self._reject(400, 408, "BAD_REQUEST_PARAMETER", f"Invalid HTTP request: {msg}")

        def _reject(self, status: int, code: int, name: str, text: str) -> None:
            """An answer in ClickHouse's format before any request was parsed, then close."""
            self.transport.write(_error_response(status, code, name, text))
            self.transport.close()

    return StoreProtocol


def _error_response(status: int, code: int, name: str, text: str) -> bytes:
    """A whole HTTP response, closing the connection, with an error in ClickHouse's format."""
    body = f"Code: {code}. DB::Exception: {text}. ({name})\n".encode()
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: text/plain; charset=UTF-8"
            f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    return head + body


_REASONS = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large"}


class _Server(uvicorn.Server):
    """uvicorn's server, but the signals are ours (uvicorn re-raises them on exit: the process would die before
    chDB is closed) and ``ready`` is set once it listens."""

    def __init__(self, config: uvicorn.Config, ready: threading.Event | None) -> None:
        super().__init__(config)
        self._ready = ready

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets)
        if self._ready is not None and self.started:
            self._ready.set()


def users_of(config: Config) -> dict[str, tuple[str, str]]:
    """User → (password, role) of the embedded store."""
    creds = credentials.load(config)
    if creds.reader_user == credentials.WRITER_USER:
        raise RuntimeError("store.reader_user cannot be 'default' (the writer)")
    return {credentials.WRITER_USER: (creds.writer_password, WRITER),
            creds.reader_user: (creds.reader_password, READER)}


def serve(config: Config, ready: threading.Event | None = None) -> int:
    """Serve the embedded store until SIGTERM/SIGINT; then finish requests in progress and close chDB cleanly."""
    if not config.store.embedded:
        print(f"store.url is set ({config.store_url}): nothing to serve here", file=sys.stderr)
        return 2
    users = users_of(config)
    engine = Engine(config.store_data_dir)
    store = config.store
    app = StoreApp(engine, users, Limits.of(store))
    server = _Server(uvicorn.Config(
        app, host=store.host, port=store.port, http=protocol(store), lifespan="off", log_config=None,
        access_log=False, timeout_keep_alive=int(max(1, store.keep_alive_timeout_s)),
        h11_max_incomplete_event_size=store.http_max_field_value_size + 1024,
        timeout_graceful_shutdown=int(DRAIN_S), server_header=False, date_header=False,
        # a listen backlog of ClickHouse's size: a burst of connections queues rather than being refused
        backlog=4096), ready)
    logging.getLogger("uvicorn.error").setLevel(logging.ERROR)

    def stop(signum: int, _frame: Any) -> None:
        if not server.should_exit:
            log.info("signal %d: stopping", signum)
        server.should_exit = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("serving chDB %s (%s) at %s on http://%s:%d (pid %d)", engine.version, engine.path,
             config.store_data_dir, store.host, store.port, os.getpid())
    try:
        server.run()
    finally:
        app.pool.shutdown(wait=False, cancel_futures=True)
        if not app.drain(DRAIN_S):
            log.warning("queries still running after %.0f s; closing chDB anyway", DRAIN_S)
        engine.close()
        log.info("stopped; chDB closed")
    if not server.started:
        return 1
    return 0


def _stop_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies, so a killed test run or bench leaves no server."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@contextlib.contextmanager
def child(config: Config, log: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m store.server`` over ``config``'s embedded store as a child process, until the block ends
    (then SIGTERM: chDB closes cleanly). For tests and benches that need a store of their own."""
    from eventide.config import to_environ
    from store.client import wait_until_up

    log = log or config.data_dir / "logs" / "store.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("EVENTIDE_")}, **to_environ(config)}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "store.server"], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parent.parent,
                                preexec_fn=_stop_with_parent)
    try:
        if not wait_until_up(config, config.store.start_timeout_s):
            raise RuntimeError(f"the store did not answer at {config.store_url}; see {log}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=DRAIN_S + 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run(config: Config) -> int:
    """``eventide store serve``: log to stderr (the service's log file) and serve."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return serve(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config")
    args = parser.parse_args(argv)
    return run(load_config_or_exit(args.config))


if __name__ == "__main__":
    sys.exit(main())
