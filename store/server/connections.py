"""Connections: uvicorn's h11 protocol bounded for hostile local clients (how many, the head's size and deadline,
answers they do not read), its refusals answered in ClickHouse's error format, and uvicorn's server with our signal
handling."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from eventide.config import StoreConfig
from eventide.http_deadline import HeadDeadlineProtocol
from store.server.asgi import ABORT


def protocol(store: StoreConfig) -> type[H11Protocol]:
    """uvicorn's h11 protocol with what it lacks for a server facing hostile local clients: a cap on connections
    (one over it is closed at once), a bound on the size of a request head (431) and a deadline for it
    (:class:`HeadDeadlineProtocol`), all answered in ClickHouse's error format; and a way for the application to
    drop a connection whose client does not read its answer (the ``eventide.abort`` scope extension)."""

    class StoreProtocol(HeadDeadlineProtocol):
        head_timeout_s = store.http_headers_timeout_s
        max_connections = store.max_connections

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            app = self.app

            async def with_abort(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                                 send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
                scope.setdefault("extensions", {})[ABORT] = self._abort
                await app(scope, receive, send)

            self.app = with_abort

        def _abort(self) -> None:
            """Close at once, unsent data dropped (``close()`` would wait for a client that never reads)."""
            if self.transport is not None:
                self.transport.abort()

        def timeout_keep_alive_handler(self) -> None:
            # An answer's last bytes the client never read: ``close()`` would keep the connection for ever.
            if self.transport.get_write_buffer_size():
                self.transport.abort()
            else:
                super().timeout_keep_alive_handler()

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


class StoreServer(uvicorn.Server):
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
