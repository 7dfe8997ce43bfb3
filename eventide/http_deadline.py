"""A deadline on a request's head, and a cap on connections, for uvicorn's h11 protocol, shared by the gateway and
the store.

uvicorn arms no timer while a request's head (request line and headers) is arriving: its keep-alive timeout only
runs between requests, and stops at the first byte of the next one. A client that connects and sends nothing, or
sends its headers a byte at a time, would hold its connection (and a slot of the server) for ever.
:class:`HeadDeadlineProtocol` closes that gap; each server subclasses it for the answer it sends when the head is
late, in its own format. uvicorn's own ``limit_concurrency`` answers 503 beyond its limit, which a client retries;
the cap here closes a connection over it at once instead, so a flood of idle connections costs nothing but itself.

A connection closed while its client is still sending (a late head, a body refused or cut off by its deadline) is
closed by lingering, as HTTP servers do: the answer is followed by a FIN, what the client still sends is read and
dropped for up to :data:`LINGER_S` and :data:`LINGER_MAX_BYTES`, then the socket is closed. Closed at once with the
client's bytes unread, the socket would send a reset, and a reset makes the client's system drop the answer it has
not read yet: the client saw "connection reset" instead of its 408.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

LINGER_S = 2.0
"""Longest time a connection closed mid-request keeps reading (and dropping) what its client still sends."""
LINGER_MAX_BYTES = 256 * 1024
"""Most bytes it drops so: a client still pushing a large body is cut off at once (it gets its reset, and its
answer may be lost, but it was not waiting for one)."""


class _LingeringTransport:
    """The connection's transport as uvicorn sees it: its ``close`` lingers when the client is still sending."""

    def __init__(self, transport: asyncio.Transport, protocol: HeadDeadlineProtocol) -> None:
        self._transport = transport
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._protocol.close_connection()

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on a request's head.

    The deadline runs while the connection waits for a request's head: from the connection, or from the first byte
    of a keep-alive connection's next request (between requests uvicorn's keep-alive timeout governs). Once the head
    is in, the body has its server's own deadline. When the head is late, the client gets :meth:`late_response`
    (if nothing was sent on this request yet) and the connection is closed.

    Subclasses set :attr:`head_timeout_s` and :attr:`max_connections`, and implement :meth:`late_response`; they may
    override :meth:`head_pending` to refuse a head that grows too large."""

    head_timeout_s: float = 10.0
    max_connections: int | None = None
    """Open connections at most; one over it is closed at once, unanswered. None: no cap."""
    _refused = False
    lingering = False
    """The answer is sent and followed by a FIN; what the client still sends is dropped until the socket closes."""
    _lingered_bytes = 0
    _head_deadline: asyncio.TimerHandle | None = None
    _socket: asyncio.Transport
    _head_bytes = 0
    """Bytes received since the connection started waiting for this head (the store bounds it)."""

    def late_response(self) -> bytes:
        """The whole HTTP response (head and body) sent when the head is late, before the connection closes."""
        raise NotImplementedError

    def head_pending(self) -> bool:
        """Called after data that leaves the head incomplete; False when the subclass has refused the request (it
        answered and closed the connection), so no deadline is armed."""
        return True

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self.max_connections is not None and len(self.server_state.connections) >= self.max_connections:
            self.transport, self._refused = transport, True
            transport.abort()
            return
        super().connection_made(transport)
        self._socket = transport   # the transport itself; uvicorn gets the lingering view of it
        self.transport = _LingeringTransport(transport, self)  # type: ignore[assignment]
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return    # never registered with uvicorn, and no deadline was armed
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def close_connection(self) -> None:
        """Close the connection; by lingering when the client may still be sending (module docstring)."""
        transport = self._socket
        if self.lingering or transport.is_closing():
            return
        sending = self.conn.their_state is h11.SEND_BODY or (self.conn.their_state is h11.IDLE and self._head_bytes)
        if not sending or not transport.can_write_eof():
            transport.close()
            return
        self.lingering = True
        self._disarm_head_deadline()
        transport.write_eof()
        self.loop.call_later(LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        if self.lingering:   # the answer is sent; the client's late bytes are dropped, up to a bound
            self._lingered_bytes += len(data)
            if self._lingered_bytes > LINGER_MAX_BYTES:
                self._socket.close()
            return
        waiting = self.conn.their_state is h11.IDLE
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            # the (next) request's head is incomplete
            self._head_bytes = self._head_bytes + len(data) if waiting else len(data)
            if self.head_pending():
                self._arm_head_deadline()
        else:
            # head in (the body has its own deadline), or closing
            self._head_bytes = 0
            self._disarm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE:     # keep-alive: uvicorn's idle timer runs until the next byte
            self._disarm_head_deadline()

    def _arm_head_deadline(self) -> None:
        if self._head_deadline is None:
            self._head_deadline = self.loop.call_later(self.head_timeout_s, self._head_late)

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_late(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return   # a response is still being written; its end restarts the wait (keep-alive timeout)
        if self.conn.our_state is h11.IDLE:   # nothing sent on this request: answer before closing
            self.transport.write(self.late_response())
            self._head_bytes = max(self._head_bytes, 1)   # the client may still be sending its head: linger
        self.close_connection()
