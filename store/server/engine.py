"""The chDB engine: its directory opened once and owned by this process, the connection handles statements run on
(pooled by the session state they carry), and running a query or an insert into an answer."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chdb

from store.server.errors import ClientGone, StoreError
from store.server.guard import Refused, check_format, is_database_name
from store.server.statements import InsertSplit

IDLE_HANDLES = 8
"""chDB handles kept open between requests (more are opened while more requests run at once)."""


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
    """``value`` as a ClickHouse string literal: a backslash and a quote are escaped, so nothing leaves the quotes;
    a NUL is refused (a C API may end the text there)."""
    if "\0" in value:
        raise StoreError.of(36, "BAD_ARGUMENTS", "A setting value contains a NUL character")
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def unknown_database(name: str) -> StoreError:
    """ClickHouse's answer for a database that does not exist (the name shown as a quoted literal, cut short)."""
    shown = name[:64].encode("unicode_escape").decode("ascii")
    return StoreError.of(81, "UNKNOWN_DATABASE", f"Database {shown!r} does not exist")


def checked_database(name: str) -> str:
    """The ``database`` a request names, if it can be one: a plain identifier (``store.server.guard.is_database_name``),
    the only kind of name the writer may create. Whether it exists is checked when a handle is opened for it."""
    if name and not is_database_name(name):
        raise unknown_database(name)
    return name


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
                # The name reaches SQL only as a query parameter until it is known to be an existing database
                # whose name is a plain identifier: only then is it spliced into USE (no quote or escape can be in it).
                found = conn.query("SELECT count() FROM system.databases WHERE name = {db:String}", "TabSeparated",
                                   params={"db": state.database}).bytes()
                if found.strip() != b"1" or not is_database_name(state.database):
                    raise unknown_database(state.database)
                conn.query(f"USE `{state.database}`", "TabSeparated")
            for name, value in state.settings:   # ``readonly`` sorts last of the caps: nothing is SET after it
                conn.query(f"SET {name} = {_quote(value)}", "TabSeparated")
        except Exception as exc:
            conn.close()
            if isinstance(exc, StoreError):
                raise
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


class Engine:
    """The chDB directory, opened once: an anchor connection keeps the engine up; statements run on pooled handles."""

    def __init__(self, data_dir: Path) -> None:
        # Owner-only, as the passwords file is: the parts hold every stored log line and tag. chDB creates its files
        # with the process's umask, and this process owns nothing else that others should read.
        os.umask(0o077)
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        data_dir.chmod(0o700)     # a directory created before (0755) is closed too
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
        fmt = self._checked_format(explicit or ("TabSeparatedWithNames" if with_names else default_format))
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
    def _checked_format(fmt: str) -> str:
        """Only the formats of the guard's allow-list reach chDB's Python API: some names there (DataFrame,
        ArrowTable, ...) return Python objects, not bytes."""
        try:
            return check_format(fmt)
        except Refused as exc:
            raise StoreError.of(exc.code, exc.name, exc.message, exc.http_status) from None

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
        # One part a line: a comment the client ended its target or SETTINGS with (``-- x``, ``# x``) ends with its
        # line, so the statement run is the one the guard checked, with FROM INFILE added, never less of it.
        sql = f"INSERT INTO {split.target}\nFROM INFILE {_quote(staged)}\n{split.settings}\nFORMAT {split.fmt}"
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
