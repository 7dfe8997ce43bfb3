"""``eventide store serve``: the one process that owns the embedded chDB directory and serves ClickHouse's HTTP
interface (the subset clickhouse-connect's ``http://`` client uses) on 127.0.0.1.

Why a process of its own: chDB allows one process per data directory and has no server. Opening it per unit of
work cost 55-70 ms and left 5 threads and ~8 descriptors behind each time (docs/architecture.md, "Store access").
Here the engine starts once, kept alive by an anchor connection held for the life of the process, and the job,
the dashboard, the evaluator, the tests and the benches all use the code path of a production ClickHouse server.

Requests run on chDB connection handles from a small pool. Handles to the running engine are cheap (~1 ms, nothing
leaked), run queries in parallel, and carry session state (``USE``, ``SET``): a handle is reused only by requests
asking for the same database and settings, and is closed after a statement that may have changed that state.
An acknowledged insert has been committed by chDB as a part on disk (its rename done) before the answer is sent.

    python -m store.server            (or: eventide store serve)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import gzip
import hmac
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import parse_qsl, urlsplit

import chdb

from eventide.config import Config, load_config_or_exit

log = logging.getLogger("eventide.store.server")

IDLE_HANDLES = 8
"""chDB handles kept open between requests (more are opened while more requests run at once)."""
KEEP_ALIVE_S = 10
"""An idle client connection (and its server thread) is closed after this long, as ClickHouse's keep_alive_timeout."""
DRAIN_S = 20.0
"""On SIGTERM: longest wait for requests in progress before chDB is closed."""
LOG_SLOW_S = 5.0
"""Requests slower than this are logged."""

# URL parameters that belong to the HTTP transport, not to the query's settings (ClickHouse's HTTP handler
# consumes them itself; chDB would reject most as unknown settings).
TRANSPORT_PARAMS = frozenset({
    "query", "database", "default_format", "user", "password", "query_id", "quota_key", "role",
    "session_id", "session_timeout", "session_check", "compress", "decompress", "buffer_size",
    "wait_end_of_query", "client_protocol_version", "enable_http_compression", "http_zlib_compression_level",
    "send_progress_in_http_headers", "http_headers_progress_interval_ms",
})
_SETTING_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TRAILING_FORMAT = re.compile(r"\bFORMAT\s+(\w+)\s*;?\s*$", re.IGNORECASE)
# An INSERT whose data follows in the body: ``INSERT INTO <target> [SETTINGS …] FORMAT <fmt>`` + newline + data.
_INSERT_WITH_DATA = re.compile(rb"^\s*INSERT\s+INTO\s+(?P<target>.+?)\s+FORMAT\s+(?P<fmt>\w+)[ \t]*(?:\r?\n|$)",
                               re.IGNORECASE | re.DOTALL)
_TRAILING_SETTINGS = re.compile(r"\s+SETTINGS\s+(?P<settings>.*)$", re.IGNORECASE | re.DOTALL)
_STATE_CHANGING = re.compile(r"^\s*(SET|USE)\b", re.IGNORECASE)
_ERROR = re.compile(r"Code: (?P<code>\d+)\..*?(?:\((?P<name>[A-Z_0-9]+)\))?\s*$", re.DOTALL)

# ClickHouse's exceptionCodeToHTTPStatus (src/Server/HTTP/exceptionCodeToHTTPStatus.cpp), by error name.
_STATUS_BY_ERROR = {
    **dict.fromkeys(("REQUIRED_PASSWORD",), 401),
    **dict.fromkeys(("UNKNOWN_USER", "WRONG_PASSWORD", "AUTHENTICATION_FAILED", "SET_NON_GRANTED_ROLE",
                     "ACCESS_DENIED"), 403),
    **dict.fromkeys((
        "BAD_ARGUMENTS", "CANNOT_COMPILE_REGEXP", "CANNOT_PARSE_TEXT", "CANNOT_PARSE_ESCAPE_SEQUENCE",
        "CANNOT_PARSE_QUOTED_STRING", "CANNOT_PARSE_DATE", "CANNOT_PARSE_DATETIME", "CANNOT_PARSE_NUMBER",
        "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING", "CANNOT_PARSE_IPV4", "CANNOT_PARSE_IPV6",
        "CANNOT_PARSE_INPUT_ASSERTION_FAILED", "CANNOT_PARSE_UUID", "DUPLICATE_COLUMN", "ILLEGAL_COLUMN",
        "UNKNOWN_ELEMENT_IN_AST", "UNKNOWN_TYPE_OF_AST_NODE", "THERE_IS_NO_COLUMN", "TOO_DEEP_AST", "TOO_BIG_AST",
        "UNEXPECTED_AST_STRUCTURE", "SYNTAX_ERROR", "INCORRECT_DATA", "TYPE_MISMATCH",
        "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE"), 400),
    **dict.fromkeys((
        "UNKNOWN_TABLE", "UNKNOWN_FUNCTION", "UNKNOWN_IDENTIFIER", "UNKNOWN_TYPE", "UNKNOWN_STORAGE",
        "UNKNOWN_DATABASE", "UNKNOWN_SETTING", "UNKNOWN_DIRECTION_OF_SORTING", "UNKNOWN_AGGREGATE_FUNCTION",
        "UNKNOWN_FORMAT", "UNKNOWN_DATABASE_ENGINE", "UNKNOWN_TYPE_OF_QUERY", "UNKNOWN_ROLE"), 404),
    "QUERY_IS_TOO_LARGE": 413, "NOT_IMPLEMENTED": 501, "SOCKET_TIMEOUT": 503, "CANNOT_OPEN_FILE": 503,
    "HTTP_LENGTH_REQUIRED": 411, "TIMEOUT_EXCEEDED": 408, "CANNOT_SCHEDULE_TASK": 503,
    "UNSUPPORTED_MEDIA_TYPE": 415,
}
_CONTENT_TYPES = {"Native": "application/octet-stream", "RowBinary": "application/octet-stream",
                  "TabSeparated": "text/tab-separated-values; charset=UTF-8",
                  "JSON": "application/json; charset=UTF-8", "JSONEachRow": "application/x-ndjson; charset=UTF-8"}


class StoreError(Exception):
    """An error answered the way ClickHouse answers it: ``Code: N. DB::Exception: … (NAME)``."""

    def __init__(self, message: str, code: int, name: str) -> None:
        super().__init__(message)
        self.message, self.code, self.name = message, code, name

    @classmethod
    def of(cls, code: int, name: str, text: str) -> StoreError:
        return cls(f"Code: {code}. DB::Exception: {text}. ({name})", code, name)

    @classmethod
    def from_chdb(cls, exc: Exception) -> StoreError:
        text = str(exc)
        text = text[text.find("Code: "):].strip() if "Code: " in text else text.strip()
        match = _ERROR.match(text)
        if not match:
            return cls.of(1000, "POCO_EXCEPTION", text or type(exc).__name__)   # ClickHouse's "unknown" family
        return cls(text, int(match["code"]), match["name"] or "")

    @property
    def status(self) -> int:
        return _STATUS_BY_ERROR.get(self.name, 500)


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
            for name, value in state.settings:
                conn.query(f"SET {name} = {_quote(value)}", "TabSeparated")
        except Exception as exc:
            conn.close()
            raise StoreError.from_chdb(exc) from None
        return conn

    @contextlib.contextmanager
    def lease(self, state: HandleState, reusable: bool = True) -> Iterator[Any]:
        """A handle in ``state`` for one statement; ``reusable=False`` when the statement may change its state."""
        with self._lock:
            found = next((i for i, (s, _) in enumerate(self._idle) if s == state), None)
            conn = self._idle.pop(found)[1] if found is not None else None
        conn = conn or self._open(state)
        try:
            yield conn
        finally:   # a failed statement leaves the handle as it was
            self._release(state, conn, reusable)

    def _release(self, state: HandleState, conn: Any, reusable: bool) -> None:
        evicted = conn
        if reusable:
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
        data_dir.mkdir(parents=True, exist_ok=True)
        self._owner = open(data_dir.with_name(data_dir.name + ".lock"), "a+")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(self._owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._owner.close()
            raise RuntimeError(f"{data_dir} is already served by another process") from None
        self.path = str(data_dir.resolve())
        self._anchor = chdb.connect(self.path)
        version, tz = self._anchor.query("SELECT version(), timezone()", "TabSeparated").bytes().decode().split()
        self.version, self.timezone = version, tz
        self.handles = HandlePool(self.path)

    def close(self) -> None:
        """Pooled handles first, the anchor last: the engine shuts down (cleanly) with its last connection."""
        self.handles.close()
        self._anchor.close()
        self._owner.close()

    def execute(self, sql: bytes, state: HandleState, params: dict[str, str], default_format: str) -> Answer:
        insert = _INSERT_WITH_DATA.match(sql)
        if insert:
            return self._insert(insert, sql[insert.end():], state)
        try:
            text = sql.decode()
        except UnicodeDecodeError:
            raise StoreError.of(36, "BAD_ARGUMENTS", "Query is not valid UTF-8") from None
        if not text.strip():
            raise StoreError.of(62, "SYNTAX_ERROR", "Empty query")
        explicit = _TRAILING_FORMAT.search(text)
        # Without a FORMAT clause ClickHouse answers in default_format and names it in X-ClickHouse-Format only
        # when the statement has a result set; asking chDB for the names line tells the two apart.
        with_names = not explicit and default_format == "TabSeparated"
        fmt = explicit[1] if explicit else ("TabSeparatedWithNames" if with_names else default_format)
        with self.handles.lease(state, reusable=not _STATE_CHANGING.match(text)) as conn:
            try:
                result = conn.query(text, fmt, params=params)
            except Exception as exc:
                raise StoreError.from_chdb(exc) from None
        body = result.bytes() or b""
        result_fmt: str | None = explicit[1] if explicit else default_format
        if with_names:
            result_fmt = "TabSeparated" if body else None
            body = body[body.find(b"\n") + 1:] if body else b""
        return Answer(body, result_fmt, _summary(result, written=False))

    def _insert(self, insert: re.Match[bytes], data: bytes, state: HandleState) -> Answer:
        """``INSERT … FORMAT X`` with its data in the body: chDB reads the data from a file (as clickhouse-connect's
        own chdb driver does), so it goes through a temporary file next to the data directory."""
        target, fmt = insert["target"].decode(), insert["fmt"].decode()
        settings = _TRAILING_SETTINGS.search(target)
        clause = f" SETTINGS {settings['settings']}" if settings else ""
        target = target[:settings.start()] if settings else target
        with tempfile.NamedTemporaryFile(prefix="insert-", suffix=".data") as staged:
            staged.write(data)
            staged.flush()
            sql = f"INSERT INTO {target} FROM INFILE {_quote(staged.name)}{clause} FORMAT {fmt}"
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


def _decompress(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    try:
        return _decompressed(body, encoding)
    except StoreError:
        raise
    except Exception as exc:  # lz4/zstd/zlib each raise their own kind
        raise StoreError.of(271, "CANNOT_DECOMPRESS", f"Cannot decompress {encoding} request body: {exc}") from None


def _decompressed(body: bytes, encoding: str) -> bytes:
    if encoding == "lz4":
        import lz4.frame

        return lz4.frame.decompress(body)
    if encoding == "zstd":
        from clickhouse_connect.driver.compression import _zstd_decompress

        return _zstd_decompress(body)
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise StoreError.of(36, "BAD_ARGUMENTS", f"Unsupported Content-Encoding: {encoding}")


class ClientGone(Exception):
    """The client closed the connection before its request was complete."""


def _read_exact(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise ClientGone(f"expected {size} bytes, got {len(data)}")
    return data


def _read_chunked(stream: BinaryIO) -> bytes:
    """A ``Transfer-Encoding: chunked`` body (clickhouse-connect streams inserts that way)."""
    parts = []
    while True:
        line = stream.readline(1024)
        if not line.endswith(b"\n"):
            raise ClientGone("connection closed inside a chunked body")
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while stream.readline(1024) not in (b"\r\n", b"\n", b""):   # trailers
                pass
            return b"".join(parts)
        parts.append(_read_exact(stream, size))
        _read_exact(stream, 2)


class StoreServer(ThreadingHTTPServer):
    daemon_threads = True        # idle keep-alive connections must not hold up shutdown
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], engine: Engine, password: str) -> None:
        super().__init__(address, StoreRequestHandler)
        self.engine, self.password = engine, password
        self._busy = 0
        self._idle = threading.Condition()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        with self._idle:
            self._busy += 1
        try:
            yield
        finally:
            with self._idle:
                self._busy -= 1
                self._idle.notify_all()

    def drain(self, timeout_s: float) -> bool:
        """Wait for requests in progress; True when none is left."""
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout_s)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):   # e.g. a client reset an idle connection
            log.debug("connection from %s ended abruptly", client_address)
            return
        log.warning("request from %s failed", client_address, exc_info=True)


class StoreRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"        # keep-alive: clickhouse-connect reuses pooled connections
    timeout = KEEP_ALIVE_S
    server: StoreServer

    def setup(self) -> None:
        super().setup()
        # Answers go out in one write; without this, Nagle's algorithm and the client's delayed ACK add ~40 ms
        # to every request that arrives in two segments (headers, then body).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.client_address[0], *args)

    def do_GET(self) -> None:
        self._serve(with_body=False)

    def do_POST(self) -> None:
        self._serve(with_body=True)

    def _serve(self, with_body: bool) -> None:
        url = urlsplit(self.path)
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        if url.path.rstrip("/") in ("", "/ping") and not with_body and "query" not in params:
            self._send(200, b"Ok.\n", {"Content-Type": "text/html; charset=UTF-8"})
            return
        query_id = params.get("query_id") or os.urandom(16).hex()
        started = time.perf_counter()
        try:
            body = self._body() if with_body else b""
        except (ClientGone, ConnectionError, TimeoutError, ValueError) as exc:
            log.info("client %s went away mid-request (%s)", self.client_address[0], exc)
            self.close_connection = True
            return
        try:
            self._authenticate(params)
            if url.path.rstrip("/") not in ("", "/query"):
                raise StoreError.of(48, "NOT_IMPLEMENTED", f"No handler for {url.path}")
            if self.headers.get("Content-Type", "").startswith("multipart/"):
                raise StoreError.of(48, "NOT_IMPLEMENTED", "multipart requests (external data) are not served")
            body = _decompress(body, self.headers.get("Content-Encoding", ""))
            query = params.get("query", "").encode()
            sql = query + b"\n" + body if query and body else query or body
            settings = {k: v for k, v in params.items() if k not in TRANSPORT_PARAMS and not k.startswith("param_")}
            for name in settings:
                if not _SETTING_NAME.match(name):
                    raise StoreError.of(115, "UNKNOWN_SETTING", f"Unknown setting '{name}'")
            state = HandleState(params.get("database", ""), tuple(sorted(settings.items())))
            bound = {k[len("param_"):]: v for k, v in params.items() if k.startswith("param_")}
            with self.server.busy():
                answer = self.server.engine.execute(sql, state, bound, params.get("default_format", "TabSeparated"))
        except StoreError as exc:
            self._fail(exc, query_id)
            return
        except Exception as exc:  # a bug of ours: answered like ClickHouse's std::exception, the server goes on
            log.exception("request failed")
            self._fail(StoreError.of(1001, "STD_EXCEPTION", f"{type(exc).__name__}: {exc}"), query_id)
            return
        elapsed = time.perf_counter() - started
        if elapsed > LOG_SLOW_S:
            log.info("slow request (%.1f s): %.200s", elapsed, sql)
        headers = {"Content-Type": _CONTENT_TYPES.get(answer.fmt or "", "text/plain; charset=UTF-8"),
                   "X-ClickHouse-Query-Id": query_id, "X-ClickHouse-Timezone": self.server.engine.timezone,
                   "X-ClickHouse-Summary": json.dumps(answer.summary, separators=(",", ":"))}
        if answer.fmt:
            headers["X-ClickHouse-Format"] = answer.fmt
        self._send(200, answer.body, headers)

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return _read_chunked(self.rfile)
        return _read_exact(self.rfile, int(self.headers.get("Content-Length") or 0))

    def _authenticate(self, params: dict[str, str]) -> None:
        """User ``default`` with the configured password (none: empty), given any way ClickHouse accepts it."""
        user, password = params.get("user", "default"), params.get("password", "")
        if self.headers.get("X-ClickHouse-User"):
            user, password = self.headers["X-ClickHouse-User"], self.headers.get("X-ClickHouse-Key", "")
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            try:
                user, _, password = base64.b64decode(auth[len("Basic "):]).decode().partition(":")
            except ValueError:
                user, password = "", ""
        if user != "default" or not hmac.compare_digest(password.encode(), self.server.password.encode()):
            raise StoreError.of(516, "AUTHENTICATION_FAILED", f"{user}: Authentication failed: password is "
                                "incorrect, or there is no user with such name")

    def _fail(self, exc: StoreError, query_id: str) -> None:
        body = f"{exc.message} (version {self.server.engine.version})\n".encode()
        self._send(exc.status, body, {"Content-Type": "text/plain; charset=UTF-8", "X-ClickHouse-Query-Id": query_id,
                                      "X-ClickHouse-Exception-Code": str(exc.code)})

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Keep-Alive", f"timeout={KEEP_ALIVE_S}")
            self._headers_buffer.append(b"\r\n")     # end_headers() without its flush: one write with the body
            self._headers_buffer.append(body)
            self.flush_headers()
        except (ConnectionError, TimeoutError) as exc:
            log.info("client %s went away before its answer (%s)", self.client_address[0], exc)
            self.close_connection = True


def serve(config: Config, ready: threading.Event | None = None) -> int:
    """Serve the embedded store until SIGTERM/SIGINT; then finish requests in progress and close chDB cleanly."""
    if not config.store.embedded:
        print(f"store.url is set ({config.store_url}): nothing to serve here", file=sys.stderr)
        return 2
    engine = Engine(config.store_data_dir)
    try:
        server = StoreServer((config.store.host, config.store.port), engine, config.store.password)
    except OSError:
        engine.close()
        raise
    stopping = threading.Event()

    def stop(signum: int, _frame: Any) -> None:
        if not stopping.is_set():
            stopping.set()
            log.info("signal %d: stopping", signum)
            threading.Thread(target=server.shutdown, daemon=True).start()   # shutdown() waits for serve_forever

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("serving chDB %s (%s) at %s on http://%s:%d (pid %d)", engine.version, engine.path,
             config.store_data_dir, config.store.host, config.store.port, os.getpid())
    if ready is not None:
        ready.set()
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        if not server.drain(DRAIN_S):
            log.warning("requests still running after %.0f s; closing chDB anyway", DRAIN_S)
        engine.close()
        log.info("stopped; chDB closed")
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
        proc = subprocess.Popen([sys.executable, "-m", "store.server"], env=env, stdout=out,
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
