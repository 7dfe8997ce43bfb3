"""The embedded store shared fairly between its users (issue 49, item 4): the reader, holding query slots with slow
queries or holding answers it never reads, cannot keep the writer from working nor make the server hold memory
without bound.

A real ``python -m store.server`` child with small limits: 8 queries at once, 4 per user, 8 MiB of a user's
answers unsent, a 3 s send deadline.
"""

from __future__ import annotations

import base64
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from store import credentials
from tests.support.stack import served_store

# Deadlines and latencies measured on the wall clock: run alone (./run test), not beside other tests.
pytestmark = pytest.mark.serial

MIB = 2**20
LIMITS = {"max_concurrent_queries": 8, "max_concurrent_queries_for_user": 4,
          "max_unsent_answer_bytes_for_user": 8 * MIB, "http_send_timeout_s": 3, "max_execution_time": 20}
SLOW = b"SELECT sleepEachRow(0.5) FROM numbers(8) SETTINGS max_block_size = 1"          # ~4 s, no CPU
BIG = b"SELECT repeat('x', 1023) FROM numbers(8192) FORMAT TSV"                           # an 8 MiB answer


class Store:
    """The store, its users, and raw HTTP to it."""

    def __init__(self, port: int, pid: int, writer: tuple[str, str], reader: tuple[str, str]) -> None:
        self.port, self.pid, self.writer, self.reader = port, pid, writer, reader

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def sql(self, statement: bytes, user: tuple[str, str], timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
        """One statement on a fresh connection, its answer read whole: (status, headers, body)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", "/", statement, {"Authorization": _basic(user)})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def unread(self, statement: bytes, user: tuple[str, str]) -> socket.socket:
        """A connection that sends ``statement`` and will not read its answer (a tiny receive buffer, so the
        kernel takes little of it either)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", self.port))
        sock.sendall(f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nAuthorization: {_basic(user)}\r\n"
                     f"Content-Length: {len(statement)}\r\n\r\n".encode() + statement)
        return sock


def _basic(user: tuple[str, str]) -> str:
    return "Basic " + base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()


def _status(sock: socket.socket) -> int:
    """The status of the answer on ``sock`` (its first bytes only: the rest stays unread)."""
    head = b""
    while len(head) < 12:
        chunk = sock.recv(12 - len(head))
        if not chunk:
            raise AssertionError(f"closed before an answer: {head!r}")
        head += chunk
    return int(head[9:12])


def _read_until_closed(sock: socket.socket, timeout_s: float) -> tuple[int, bool]:
    """Reads everything left on ``sock``: (bytes read, True when the server closed it within ``timeout_s``)."""
    sock.settimeout(timeout_s)
    size = 0
    try:
        while chunk := sock.recv(MIB):
            size += len(chunk)
    except ConnectionResetError:
        return size, True
    except TimeoutError:
        return size, False
    return size, True


def _probe(store: Store, seconds: float) -> list[float]:
    """The writer's ``SELECT 1``, one after another for ``seconds``: each one's latency (it must succeed)."""
    latencies = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        started = time.monotonic()
        status, _, body = store.sql(b"SELECT 1", store.writer)
        assert (status, body) == (200, b"1\n"), (status, body[:300])
        latencies.append(time.monotonic() - started)
        time.sleep(0.02)
    return latencies


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with served_store(tmp_path_factory.mktemp("fair-share"), **LIMITS) as (config, proc):
        creds = credentials.load(config)
        yield Store(config.store.port, proc.pid, ("default", creds.writer_password),
                    (creds.reader_user, creds.reader_password))


def test_the_reader_holding_slots_leaves_the_writer_its_share(store: Store) -> None:
    """Twice as many slow reader queries as the store runs at once: the reader gets its share (4), the rest are
    answered 503 TOO_MANY_SIMULTANEOUS_QUERIES at once, and the writer's queries all run, quickly, meanwhile."""
    answers: list[tuple[int, str]] = []

    def slow() -> None:
        status, headers, body = store.sql(SLOW, store.reader)
        answers.append((status, headers.get("x-clickhouse-exception-code", "")))
        if status != 200:
            assert b"for user reader" in body and b"max_concurrent_queries_for_user" in body, body

    threads = [threading.Thread(target=slow) for _ in range(2 * LIMITS["max_concurrent_queries"])]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    latencies = _probe(store, 2.0)
    status, _, _ = store.sql(b"CREATE TABLE IF NOT EXISTS fair (x UInt8) ENGINE = Memory", store.writer)
    assert status == 200
    assert store.sql(b"INSERT INTO fair VALUES (1)", store.writer)[0] == 200
    for thread in threads:
        thread.join(30)
    assert sorted(answers) == [(200, "")] * 4 + [(503, "202")] * 12
    assert max(latencies) < 0.5 and sorted(latencies)[len(latencies) // 2] < 0.05, max(latencies)


def test_unread_answers_are_bounded_and_dropped_at_the_send_deadline(store: Store) -> None:
    """The reader asks for 8 MiB answers on 24 connections, one after another, and never reads them: the store
    holds no more than its bound (the rest are answered 503 at once), the writer's queries and its own big answer
    go through meanwhile, and the connection left unread is closed at the send deadline, its answer dropped.
    Then the reader is served again, and an answer read slowly but within the deadline arrives whole."""
    before = store.rss_mib()
    socks: list[socket.socket] = []
    statuses, ready = [], []
    try:
        for _ in range(24):
            sock = store.unread(BIG, store.reader)
            socks.append(sock)
            statuses.append(_status(sock))
            ready.append(time.monotonic())
        grown = store.rss_mib() - before
        held = [i for i, status in enumerate(statuses) if status == 200]
        assert len(held) == 1 and statuses.count(503) == 23, statuses
        assert grown < 128, f"RSS grew {grown:.0f} MiB"         # 24 answers held: ~250 MiB
        status, headers, body = store.sql(BIG, store.reader)
        assert status == 503 and headers["x-clickhouse-exception-code"] == "241", body[:300]
        assert b"max_unsent_answer_bytes_for_user" in body
        assert max(_probe(store, 1.0)) < 0.5
        status, _, body = store.sql(BIG, store.writer)             # the writer's answers are its own share
        assert status == 200 and len(body) == 8 * MIB

        time.sleep(max(0.0, ready[held[0]] + LIMITS["http_send_timeout_s"] + 0.5 - time.monotonic()))
        size, closed = _read_until_closed(socks[held[0]], 5)
        assert closed and size < 8 * MIB, (size, closed)

        conn = http.client.HTTPConnection("127.0.0.1", store.port, timeout=10)
        try:
            conn.request("POST", "/", BIG, {"Authorization": _basic(store.reader)})
            resp = conn.getresponse()
            assert resp.status == 200
            size = 0
            while chunk := resp.read(512 * 1024):    # 16 reads 50 ms apart: about a second, under the deadline
                size += len(chunk)
                time.sleep(0.05)
            assert size == 8 * MIB
        finally:
            conn.close()
    finally:
        for sock in socks:
            sock.close()


def test_the_reader_leaving_its_running_queries_does_not_stall_the_writer(store: Store) -> None:
    """Streamed (Native) reads are cancelled when their clients leave; the reader leaving its share of them at once
    must not stop the store answering the writer while chDB cancels them."""
    streamed = SLOW + b" FORMAT Native"
    socks = [store.unread(streamed, store.reader) for _ in range(LIMITS["max_concurrent_queries_for_user"])]
    time.sleep(1.2)
    latencies: list[float] = []
    probe = threading.Thread(target=lambda: latencies.extend(_probe(store, 2.0)))
    probe.start()
    time.sleep(0.2)
    for sock in socks:
        sock.close()
    probe.join(30)
    # chDB's cancel waits up to a block or more per query (~2.6 s for these four when it ran on the event loop)
    assert max(latencies) < 1.0, sorted(latencies)[-5:]
