"""Serving an ASGI app with a real uvicorn server inside the test process: for clients that speak HTTP over sockets
(SDK exporters, raw-socket tests of slow or lying clients), where starlette's in-process TestClient would not do."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn


@contextmanager
def uvicorn_in_thread(config: uvicorn.Config, start_timeout_s: float = 15.0) -> Iterator[uvicorn.Server]:
    """``config``'s app served by uvicorn in a thread of this process, once it has started, until the block ends."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout_s
        while not server.started:
            assert time.monotonic() < deadline, f"uvicorn did not start within {start_timeout_s:g} s"
            time.sleep(0.02)
        yield server
    finally:
        server.should_exit = True
        thread.join(10)


def answer_and_close(sock: socket.socket, timeout_s: float) -> tuple[bytes, float]:
    """Everything the server sends on ``sock`` until it closes the connection, and when it closed (s after the
    call)."""
    started = time.monotonic()
    sock.settimeout(timeout_s)
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data, time.monotonic() - started
