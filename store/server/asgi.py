"""ClickHouse's HTTP interface as an ASGI application over :class:`~store.server.engine.Engine`: the refusals
on the head (browsers, authentication, method, concurrency), the settings a request may ask for, its body read
against a deadline and a size, the query run off the event loop and cancelled when its client leaves, and its
answer sent in steps against a deadline, counted against its user's share until it is sent."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import dataclasses
import hmac
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl

from store.server import native
from store.server.bodies import decompressor, inflate
from store.server.engine import Answer, Cancel, Engine, HandleState, checked_database
from store.server.errors import ClientGone, StoreError, refused
from store.server.guard import ENFORCED_SETTINGS, PROTECTED_DATABASES, Refused, check_format, check_settings
from store.server.limits import READER, WRITER, Limits
from store.server.statements import SETTING_NAME, InsertSplit, split_insert
from store.server.verdicts import guard, remembered

log = logging.getLogger("eventide.store.server")

LOG_SLOW_S = 5.0
"""Requests slower than this are logged."""
ERRORS_LOGGED_PER_S = 20
"""Error answers logged per second at most (the rest are only counted by their clients)."""

# URL parameters that belong to the HTTP transport, not to the query's settings (ClickHouse's HTTP handler
# consumes them itself; chDB would reject most as unknown settings).
TRANSPORT_PARAMS = frozenset({
    "query", "database", "default_format", "user", "password", "query_id", "quota_key", "role",
    "session_id", "session_timeout", "session_check", "compress", "decompress", "buffer_size",
    "wait_end_of_query", "client_protocol_version", "enable_http_compression", "http_zlib_compression_level",
    "send_progress_in_http_headers", "http_headers_progress_interval_ms",
})

_CONTENT_TYPES = {"Native": "application/octet-stream", "RowBinary": "application/octet-stream",
                  "TabSeparated": "text/tab-separated-values; charset=UTF-8",
                  "JSON": "application/json; charset=UTF-8", "JSONEachRow": "application/x-ndjson; charset=UTF-8"}
INLINE_SCAN = 16 * 1024
"""Heads up to this long are scanned for an insert's split on the event loop (well under a millisecond)."""
SEND_STEP = 256 * 1024
"""An answer is handed to the connection this much at a time: uvicorn waits for its write buffer to drain before
the next step, so a client that does not read holds about one step of the connection's memory, not a copy of the
whole answer, and the send deadline can cut it off between steps."""
ABORT = "eventide.abort"
"""ASGI scope extension (set by ``connections.protocol``): closes the connection at once, dropping unsent data."""


class StoreApp:
    """The ASGI application: ClickHouse's HTTP interface over :class:`Engine`."""

    def __init__(self, engine: Engine, users: dict[str, tuple[str, str]], limits: Limits) -> None:
        self.engine, self.users, self.limits = engine, users, limits
        self.user_of = {role: user for user, (_, role) in users.items()}
        # A pool per user: one user's queries (and its statements' checks) never wait for a thread another holds.
        self.pools = {role: concurrent.futures.ThreadPoolExecutor(limits.max_concurrent_queries_for_user,
                                                                  f"chdb-{role}")
                      for role in (WRITER, READER)}
        self.running = 0
        self.running_for = dict.fromkeys((WRITER, READER), 0)
        self.unsent_for = dict.fromkeys((WRITER, READER), 0)
        """Bytes of each user's answers computed and not yet sent (:meth:`unsent`)."""
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

    def _check_slot(self, role: str) -> None:
        if self.running >= self.limits.max_concurrent_queries:
            raise StoreError.of(202, "TOO_MANY_SIMULTANEOUS_QUERIES", "Too many simultaneous queries. Maximum: "
                                f"{self.limits.max_concurrent_queries}")
        if self.running_for[role] >= self.limits.max_concurrent_queries_for_user:
            raise StoreError.of(202, "TOO_MANY_SIMULTANEOUS_QUERIES", f"Too many simultaneous queries for user "
                                f"{self.user_of.get(role, role)}. Maximum: "
                                f"{self.limits.max_concurrent_queries_for_user} (max_concurrent_queries_for_user)")
        limit = self.limits.max_unsent_answer_bytes_for_user
        if self.unsent_for[role] and self.unsent_for[role] >= limit:
            raise self._unsent_error(role)

    def _unsent_error(self, role: str) -> StoreError:
        return StoreError.of(241, "MEMORY_LIMIT_EXCEEDED", f"Answers of user {self.user_of.get(role, role)} not "
                             f"yet read by their clients hold {self.unsent_for[role]} bytes: at most "
                             f"{self.limits.max_unsent_answer_bytes_for_user} (max_unsent_answer_bytes_for_user)",
                             503)

    @contextlib.contextmanager
    def slot(self, role: str) -> Iterator[None]:
        """A query of ``role``'s user, counted against ``max_concurrent_queries`` and the user's
        ``max_concurrent_queries_for_user`` from its start until its answer is sent (the caller holds it that
        long). A client slow to send its body holds a connection (bounded, with a deadline), never a query slot."""
        self._check_slot(role)
        self.running += 1
        self.running_for[role] += 1
        try:
            yield
        finally:
            self.running -= 1
            self.running_for[role] -= 1

    @contextlib.contextmanager
    def unsent(self, role: str, size: int) -> Iterator[None]:
        """An answer of ``size`` bytes in memory until it is sent, counted against its user's
        ``max_unsent_answer_bytes_for_user``; one that would take the user over it is refused, unless the user
        holds no other (any answer ``max_result_bytes`` allows can be sent)."""
        held = self.unsent_for[role]
        if held and held + size > self.limits.max_unsent_answer_bytes_for_user:
            raise self._unsent_error(role)
        self.unsent_for[role] += size
        try:
            yield
        finally:
            self.unsent_for[role] -= size

    def drain(self, timeout_s: float) -> bool:
        """Wait for queries in progress; True when none is left."""
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout_s)

    async def blocking(self, role: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on a thread of ``role``'s user's pool."""
        return await asyncio.get_running_loop().run_in_executor(self.pools[role], self._run, fn, *args)

    def shutdown(self) -> None:
        """No more work on the pools; queued work is dropped (queries running go on until :meth:`drain`)."""
        for pool in self.pools.values():
            pool.shutdown(wait=False, cancel_futures=True)

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
            make = decompressor(headers.get("content-encoding", "").strip().lower())
            self._check_slot(role)    # chDB or this user's share saturated: refused before the body is read
        except StoreError as exc:     # refused on the head alone: the body is never read, the connection closed
            await self._fail(send, exc, query_id, close=True)
            return
        # What the request holds until its answer is sent: its query slot, then its answer's bytes.
        with contextlib.ExitStack() as held:
            try:
                answer, sql = await self._execute(scope, receive, params, headers, role, make, held)
                held.enter_context(self.unsent(role, len(answer.body)))
            except ClientGone as exc:
                log.info("client %s went away mid-request (%s)", scope.get("client"), exc)
                return
            except StoreError as exc:
                held.close()
                # An over-long statement: the rest of its body is read and dropped (uvicorn does), so the client
                # sees the answer; a body over its size or deadline: the connection is closed.
                await self._fail(send, exc, query_id, close=exc.status == 408 or exc.name == "LIMIT_EXCEEDED")
                return
            except Exception as exc:  # a bug of ours: answered like ClickHouse's std::exception, the server goes on
                held.close()
                log.exception("request failed")
                await self._fail(send, StoreError.of(1001, "STD_EXCEPTION", f"{type(exc).__name__}: {exc}"),
                                 query_id)
                return
            elapsed = time.perf_counter() - started
            if elapsed > LOG_SLOW_S:
                log.info("slow request (%.1f s): %.200s", elapsed, sql)
            out = {"Content-Type": _CONTENT_TYPES.get(answer.fmt or "", "text/plain; charset=UTF-8"),
                   "X-ClickHouse-Query-Id": query_id, "X-ClickHouse-Timezone": self.engine.timezone,
                   "X-ClickHouse-Summary": json.dumps(answer.summary, separators=(",", ":"))}
            if answer.fmt:
                out["X-ClickHouse-Format"] = answer.fmt
            await self._send(send, 200, answer.body, out, scope)

    def _refuse_browsers(self, headers: dict[str, str]) -> None:
        """A web page can make the browser POST here (a ``text/plain`` form needs no preflight); browsers mark
        such requests with ``Origin``/``Sec-Fetch-Site``, and a DNS-rebound name shows in ``Host``."""
        if "origin" in headers:
            raise refused(403, f"Requests from web pages are refused (Origin: {headers['origin'][:100]})")
        if headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site"):
            raise refused(403, f"Requests from web pages are refused (Sec-Fetch-Site: {headers['sec-fetch-site']})")
        host = headers.get("host")
        if host is not None and host.lower() not in self.limits.allowed_hosts:
            raise refused(403, f"Host {host[:100]!r} is not the address this store serves "
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
            if not SETTING_NAME.fullmatch(name):
                raise StoreError.of(115, "UNKNOWN_SETTING", f"Unknown setting '{name[:64]}'")
            if name == "result_overflow_mode" and value != "throw":
                raise StoreError.of(452, "SETTING_CONSTRAINT_VIOLATION",
                                    "Setting result_overflow_mode can only be 'throw' here", 403)
            try:     # the caps, readonly, and the settings that name files, URLs or dialects
                check_settings({name: value}, self.limits.caps)
            except Refused as exc:
                raise StoreError.of(exc.code, exc.name, exc.message, 403) from None
            settings[name] = value
        settings.update(ENFORCED_SETTINGS)     # after the client's: they cannot be undone
        database = checked_database(headers.get("x-clickhouse-database") or params.get("database", ""))
        if database.lower() in PROTECTED_DATABASES:
            if role == READER:   # the guard judges system tables by their qualified names (READER_SYSTEM_TABLES)
                raise StoreError.of(497, "ACCESS_DENIED", f"the reader's database may not be {database}: name a "
                                    "system table as system.<table>", 403)
            readonly = readonly or 1    # unqualified names there are the engine's own tables: read them only
        ordered = tuple(sorted(settings.items()))
        if readonly:     # applied last: once it is set, the handle cannot change it
            ordered += (("readonly", str(readonly)),)
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
            for out in (inflate(make, chunk, state) if make else (chunk,) if chunk else ()):
                size += len(out)
                if size > self.limits.max_insert_bytes:
                    raise StoreError.of(290, "LIMIT_EXCEEDED",
                                        f"The request body exceeds {self.limits.max_insert_bytes} bytes "
                                        "(max_insert_bytes, after decompression)", 413)
                yield out

    async def _execute(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                       params: dict[str, str], headers: dict[str, str], role: str,
                       make: Callable[[], Any] | None, held: contextlib.ExitStack) -> tuple[Answer, str]:
        """Reads the request, checks and runs its statement; the query slot it takes is left in ``held``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.receive_timeout_s
        read_only = scope["method"] == "GET"
        state = self._state(params, headers, role, read_only)
        default_format = params.get("default_format", "TabSeparated")
        try:
            check_format(default_format)
        except Refused as exc:
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
            split = await self._split(head, role)
        if not isinstance(split, InsertSplit):
            while not ended and len(head) <= limit:
                try:
                    chunk = await anext(body)      # type: ignore[arg-type]
                except StopAsyncIteration:
                    ended = True
                    break
                head += chunk
            split = await self._split(head[:limit + 1], role) if head else None
        if isinstance(split, InsertSplit):
            if split.statement_end > limit:
                raise _too_large(limit)
            statement = head[:split.statement_end].decode(errors="replace")
            verdict = (remembered(statement, role, read_only)
                       or await self.blocking(role, guard, statement, role, read_only, self.limits, self.engine))
            if verdict.kind != "insert" or not verdict.expects_data:
                raise StoreError.of(62, "SYNTAX_ERROR", "Data follows a statement that takes none", 400)
            with tempfile.NamedTemporaryFile(prefix="insert-", suffix=".data", dir=self.engine.staging) as staged:
                staged.write(head[split.data_start:])
                del head
                if not ended:
                    async for chunk in body:      # type: ignore[union-attr]
                        staged.write(chunk)
                staged.flush()
                held.enter_context(self.slot(role))
                return await self.blocking(role, self.engine.insert, split, staged.name, state), statement
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
        held.enter_context(self.slot(role))
        work = asyncio.ensure_future(self.blocking(role, self._guarded_query, text, role, read_only, state, bound,
                                                   default_format, _protocol_revision(params), cancel))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not gone.done():
                gone.cancel()
        if not work.done():   # the client left: cancel (Native reads, between blocks), else max_execution_time
            started = time.perf_counter()
            # Off the event loop: chDB's cancel can wait seconds on streams other queries are reading.
            await asyncio.to_thread(cancel.cancel)
            with contextlib.suppress(Exception):
                await work
            raise ClientGone(f"closed the connection while its query ran; the query ended "
                             f"{time.perf_counter() - started:.2f} s later")
        return work.result(), text

    async def _split(self, head: bytearray, role: str) -> InsertSplit | bool | None:
        """:func:`split_insert` of ``head``; a long one is scanned on a pool thread (linear, but not on the loop)."""
        if len(head) <= INLINE_SCAN:
            return split_insert(bytes(head))
        return await self.blocking(role, split_insert, bytes(head))

    def _guarded_query(self, text: str, role: str, read_only: bool, state: HandleState, bound: dict[str, str],
                       default_format: str, revision: int, cancel: Cancel) -> Answer:
        """The guard, then the query, on one pool thread (one hop off the event loop, not two); a Native answer in
        the layout of the client's protocol revision (``store.server.native``)."""
        verdict = guard(text, role, read_only, self.limits, self.engine)
        explicit = verdict.format if verdict.kind == "select" else None     # the parser's, never the text's
        answer = self.engine.query(text, state, bound, default_format, explicit,
                                   cancel if verdict.kind == "select" else None)
        if revision and answer.fmt == "Native":
            try:
                return dataclasses.replace(answer, body=native.for_revision(answer.body, revision))
            except native.UnsupportedNative as exc:
                raise StoreError.of(48, "NOT_IMPLEMENTED", str(exc), 400) from None
        return answer

    def _log_limited(self, message: str, *args: Any) -> None:
        """An info line, unless more than ``ERRORS_LOGGED_PER_S`` were logged this second (a flood of refusals
        must not flood the log)."""
        now = time.monotonic()
        if now - self._logged_at > 1.0:
            self._logged_at, self._logged = now, 0
        self._logged += 1
        if self._logged <= ERRORS_LOGGED_PER_S:
            log.info(message, *args)

    async def _fail(self, send: Callable[[dict[str, Any]], Awaitable[None]], exc: StoreError, query_id: str,
                    close: bool = False) -> None:
        body = f"{exc.message} (version {self.engine.version})\n".encode()
        self._log_limited("answered %d: %.300s", exc.status, exc.message.replace("\n", " "))
        headers = {"Content-Type": "text/plain; charset=UTF-8", "X-ClickHouse-Exception-Code": str(exc.code)}
        if query_id:
            headers["X-ClickHouse-Query-Id"] = query_id
        if close:
            headers["Connection"] = "close"
        await self._send(send, exc.status, body, headers)

    async def _send(self, send: Callable[[dict[str, Any]], Awaitable[None]], status: int, body: bytes,
                    headers: dict[str, str], scope: dict[str, Any] | None = None) -> None:
        """The answer, ``SEND_STEP`` bytes at a time, each step once the connection has taken the previous one; all
        of it within ``http_send_timeout_s``, else the connection is closed and the rest dropped."""
        raw = [(k.encode("latin-1"), v.encode("latin-1", "replace")) for k, v in headers.items()]
        raw.append((b"content-length", str(len(body)).encode()))
        view = memoryview(body)     # steps without copies (a client gone makes each send return at once)
        try:
            async with asyncio.timeout(self.limits.send_timeout_s):
                await send({"type": "http.response.start", "status": status, "headers": raw})
                for at in range(0, len(body), SEND_STEP):
                    await send({"type": "http.response.body", "body": view[at:at + SEND_STEP], "more_body": True})
                # The end only once the connection's buffer has drained (uvicorn waits for it): an answer is sent
                # when the client has taken all but the last low-water mark of it.
                await send({"type": "http.response.body", "body": b""})
        except TimeoutError:
            self._log_limited("answer not read within %g s (http_send_timeout_s): connection closed, %d bytes "
                              "dropped", self.limits.send_timeout_s, len(body))
            abort = ((scope or {}).get("extensions") or {}).get(ABORT)
            if abort is not None:
                abort()
                await asyncio.sleep(0)     # the connection is marked lost before this request ends
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


def _protocol_revision(params: dict[str, str]) -> int:
    """The client's ``client_protocol_version`` (0 when absent), which sets the layout of a Native answer."""
    text = params.get("client_protocol_version", "0")
    if not text.isdigit() or len(text) > 9:
        raise StoreError.of(36, "BAD_ARGUMENTS", f"client_protocol_version must be a number, not {text[:40]!r}", 400)
    return int(text)
