"""The embedded store under hostile input (issue 36): does everyone else still get served, and what does it cost?

Each phase serves a fresh store (``python -m store.server`` over its own chDB directory on a free port, via
``store.server.child``) and runs, for the whole phase:

- a probe: ``SELECT 1`` in a loop over one clickhouse-connect client (sequential requests, 10 ms apart), every
  request timed; p50/p99/max over the requests started during the attack and the 2 s after it, a window at least
  as long as the idle phase (a request still waiting when the window ends counts with the time it has waited so
  far, marked ``>=``);
- a writer, standing for every other component: one row inserted through clickhouse-connect every 100 ms; inserts
  acknowledged vs expected, errors, and the rows read back at the end;
- the store's memory from ``/proc/<pid>/status`` (VmRSS every 50 ms, VmHWM) of the server and its children: peak
  growth over the median VmRSS of the idle lead-in before the attack.

Phases (the attack, after a few seconds of idle lead-in):

- ``idle``: nothing (the baseline);
- ``query_4mb``: ``SELECT`` + 4 MiB of spaces + ``1`` and ``INSERT INTO t`` + 4 MiB of spaces + ``x``, each sent
  several times, with the right password;
- ``slow_500``: 500 connections held open ~10 s: half send a request line and headers a byte at a time, half send
  complete headers (right password, ``Content-Length`` 1 MB) and then trickle the body a byte at a time;
- ``body_1g_wrong_password``: a 1 GiB body (``Content-Length``) with a wrong password, sent until the server
  answers or closes;
- ``body_1g_no_password``: the same with no credentials, ``Transfer-Encoding: chunked``;
- ``reader_holds_slots`` (issue 49): the read-only user keeps twice ``max_concurrent_queries`` slow queries
  (``sleepEachRow``) asked for, each refused one asked again 200 ms later, for the hold time: it gets its
  ``max_concurrent_queries_for_user`` share and no more;
- ``reader_unread_answers`` (issue 49): the read-only user asks one 8 MiB answer after another on connections with
  a 4 KiB receive buffer and never reads them, keeping up to 32 such connections for the hold time (a refused one
  asked again 100 ms later). The answers are asked one at a time, so what the phase measures is the answers held,
  not chDB building many at once (that is bounded by the user's slots and ``max_memory_usage``, not here).

Goals (issue 36): probe p99 <= 50 ms in every phase, RSS growth <= 64 MiB, the writer never failing. Every socket
has a timeout and every phase a deadline; a store that no longer answers ``/ping`` after its phase is killed (and
reported as stuck), so the bench finishes even against a server that does not.

    .venv/bin/python -m bench.store_abuse                  # ~3 min
    .venv/bin/python -m bench.store_abuse --quick          # shorter holds, 128 MiB bodies, fewer sends
    .venv/bin/python -m bench.store_abuse --phases idle,slow_500 --out /tmp/abuse.json
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import importlib
import json
import os
import resource
import secrets
import select
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import store.client as store_client
from eventide.config import Config, load_config
from stack.services import free_port
from store.client import connect
from store.server import child as served_store

REPO = Path(__file__).resolve().parent.parent
MIB = 2**20
GOAL_P99_MS = 50.0
GOAL_RSS_MIB = 64.0
PROBE_GAP_S = 0.010
WRITE_EVERY_S = 0.100
RSS_EVERY_S = 0.050
TAIL_S = 2.0
"""Measured on after the attack ends (what it leaves behind is part of its cost); the whole window is at least
as long as the idle phase."""
PHASES = ("idle", "query_4mb", "slow_500", "body_1g_wrong_password", "body_1g_no_password", "reader_holds_slots",
          "reader_unread_answers")


@dataclass(frozen=True)
class Plan:
    """How long and how big (``--quick`` shrinks everything but the 4 MiB query and the 500 connections)."""

    lead_in_s: float = 3.0
    idle_s: float = 10.0
    query_sends: int = 3                 # of each kind
    query_budget_s: float = 60.0
    slow_connections: int = 500
    slow_hold_s: float = 10.0
    body_bytes: int = 1024 * MIB
    body_budget_s: float = 120.0
    reader_hold_s: float = 10.0
    reader_slow_queries: int = 64        # twice the default max_concurrent_queries
    reader_answer_mib: int = 8
    reader_unread_connections: int = 32

    @classmethod
    def quick(cls) -> Plan:
        return cls(lead_in_s=2.0, idle_s=4.0, query_sends=1, query_budget_s=20.0, slow_hold_s=4.0,
                   body_bytes=128 * MIB, body_budget_s=30.0, reader_hold_s=4.0)


def store_password(config: Config) -> str:
    """The writer's password as local components read it: ``store/credentials.py``'s (the configured password, else
    the one generated on first start) where that module exists, else the configured one. The bench sets a password
    in the config, which both honour."""
    # Only the module beside the store.client in use (an editable install may map store.* to another checkout).
    if not Path(store_client.__file__).with_name("credentials.py").exists():
        return config.store.password
    return importlib.import_module("store.credentials").load(config).writer_password


def reader_user(config: Config) -> tuple[str, str]:
    """The read-only user and its password (generated on first start); the writer where a checkout has none."""
    if not Path(store_client.__file__).with_name("credentials.py").exists():
        return "default", config.store.password
    creds = importlib.import_module("store.credentials").load(config)
    return creds.reader_user, creds.reader_password


# ---------------------------------------------------------------------------------------------------------------
# What runs beside every attack: the probe, the writer, the RSS sampler


@dataclass
class Sample:
    started: float
    seconds: float
    ok: bool


@dataclass
class Loop:
    """A background loop's samples; ``in_flight`` is the start of a request not answered yet."""

    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    in_flight: float | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def run(self, step: Callable[[Any], None], config: Config, every_s: float) -> None:
        """Call ``step(client)`` every ``every_s`` (no catching up after a slow call) until stopped."""
        due = time.perf_counter()
        while not self.stop.is_set():
            started = None
            try:
                with connect(config) as client:
                    while not self.stop.is_set():
                        self.stop.wait(max(0.0, due - time.perf_counter()))
                        if self.stop.is_set():
                            return
                        started = self.in_flight = time.perf_counter()
                        step(client)
                        self.in_flight = None
                        self.samples.append(Sample(started, time.perf_counter() - started, True))
                        started = None
                        due = max(due + every_s, time.perf_counter())
            except Exception as exc:  # every failure is a figure here
                self.in_flight = None
                if self.stop.is_set():
                    return
                if started is not None:
                    self.samples.append(Sample(started, time.perf_counter() - started, False))
                self.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                self.stop.wait(0.05)
                due = time.perf_counter()

    def start(self, step: Callable[[Any], None], config: Config, every_s: float) -> None:
        self.thread = threading.Thread(target=self.run, args=(step, config, every_s), daemon=True)
        self.thread.start()

    def window(self, start: float, end: float) -> tuple[list[float], bool]:
        """Times (s) of the requests started in [start, end]; a request still waiting at ``end`` counts with what
        it has waited so far (the second value is True when that is the longest: then the figures are lower
        bounds)."""
        times = [s.seconds for s in self.samples if start <= s.started <= end]
        pending = self.in_flight
        if pending is None or pending > end:
            return times, False
        waited = end - max(pending, start)
        times.append(waited)
        return times, waited >= max(times)


class RssSampler:
    """VmRSS of the store and its children every 50 ms, and the server's VmHWM."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self._tree = [pid]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def hwm(self) -> int:
        return _status(self.pid).get("VmHWM", 0)

    def _run(self) -> None:
        last_scan = 0.0
        while not self.stop.is_set():
            now = time.perf_counter()
            if now - last_scan > 2.0:
                self._tree, last_scan = _descendants(self.pid), now
            total = sum(_status(p).get("VmRSS", 0) for p in self._tree)
            if total:
                self.samples.append((now, total))
            self.stop.wait(RSS_EVERY_S)

    def between(self, start: float, end: float) -> list[int]:
        return [kb for t, kb in self.samples if start <= t <= end]


def _status(pid: int) -> dict[str, int]:
    """``/proc/<pid>/status`` memory lines in KiB (empty when the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            name, value = line.split(":", 1)
            out[name] = int(value.split()[0])
    return out


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat[stat.rfind(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, ppid in parents.items() if ppid in frontier]
        tree += frontier
    return tree


# ---------------------------------------------------------------------------------------------------------------
# Raw HTTP


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _status_line(data: bytes) -> str:
    line = data.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    return line.split(" ", 2)[1] if line.startswith("HTTP/") and " " in line else (line[:40] or "closed")


def _read_answer(sock: socket.socket, timeout_s: float) -> str:
    """The status code of the server's answer on ``sock`` ('timeout', 'closed', 'reset' otherwise)."""
    sock.settimeout(max(0.1, timeout_s))
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        return "timeout" if not data else _status_line(data)
    except OSError:
        return "reset" if not data else _status_line(data)
    return _status_line(data)


def _readable(sock: socket.socket) -> bool:
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(0))


# ---------------------------------------------------------------------------------------------------------------
# The attacks: each returns what it saw, and never runs past its deadline


def attack_idle(config: Config, plan: Plan, deadline: float) -> dict[str, Any]:
    time.sleep(max(0.0, min(plan.idle_s, deadline - time.perf_counter())))
    return {"held_s": plan.idle_s}


def attack_query_4mb(config: Config, plan: Plan, deadline: float) -> dict[str, Any]:
    pad = b" " * (4 * MIB)
    bodies = {"select": b"SELECT" + pad + b"1", "insert": b"INSERT INTO t" + pad + b"x"}
    auth = _basic("default", store_password(config))
    sent: list[dict[str, Any]] = []
    for _ in range(plan.query_sends):
        for kind, body in bodies.items():
            left = deadline - time.perf_counter()
            if left < 1:
                return {"sends": sent, "stopped": "phase deadline"}
            t = time.perf_counter()
            conn = http.client.HTTPConnection(config.store.host, config.store.port, timeout=left)
            try:
                conn.request("POST", "/", body=body, headers={"Authorization": auth, "Content-Type": "text/plain"})
                resp = conn.getresponse()
                answer = resp.read(300)
                outcome = {"status": resp.status, "answer": answer.decode("utf-8", "replace")[:120]}
            except TimeoutError:
                outcome = {"status": "timeout"}
            except OSError as exc:
                outcome = {"status": f"{type(exc).__name__}"}
            finally:
                conn.close()
            sent.append({"kind": kind, "seconds": round(time.perf_counter() - t, 3), **outcome})
            print(f"    {kind} 4 MiB: {sent[-1]['status']} in {sent[-1]['seconds']:.2f} s", flush=True)
    return {"sends": sent}


def attack_slow_500(config: Config, plan: Plan, deadline: float) -> dict[str, Any]:
    host, port = config.store.host, config.store.port
    auth = _basic("default", store_password(config))
    # Headers that never end (a long padding header), and a body that never ends: both sent one byte per second.
    slow_headers = (f"POST /?query={quote('SELECT 1')} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: {auth}\r\n"
                    f"X-Pad: {'a' * 4000}").encode()
    body_headers = (f"POST /?query={quote('INSERT INTO abuse_sink FORMAT LineAsString')} HTTP/1.1\r\n"
                    f"Host: {host}:{port}\r\nAuthorization: {auth}\r\nContent-Type: text/plain\r\n"
                    f"Content-Length: {MIB}\r\n\r\n").encode()
    # All connects at once, non-blocking: the kernel retries SYNs a server's full accept queue dropped, and the
    # connections already open keep being fed while the others wait.
    connecting: dict[int, tuple[socket.socket, str]] = {}
    for i in range(plan.slow_connections):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.connect_ex((host, port))
        connecting[sock.fileno()] = (sock, "headers" if i % 2 == 0 else "body")
    open_: dict[int, tuple[socket.socket, str, int]] = {}      # fd -> (socket, kind, bytes of headers sent)
    failed, answers = 0, {}
    closed_by_server = {"headers": 0, "body": 0}
    started = time.perf_counter()
    connect_until = min(deadline, started + 30)
    held_until = min(deadline, started + plan.slow_hold_s)       # moved on once every connect has ended
    next_round = started

    def drop(fd: int, status: str) -> None:
        sock, kind, _ = open_.pop(fd)
        closed_by_server[kind] += 1
        answers[status] = answers.get(status, 0) + 1
        sock.close()

    while open_ or connecting:
        now = time.perf_counter()
        if now >= (held_until if not connecting else connect_until):
            break
        poller = select.poll()
        for fd in connecting:
            poller.register(fd, select.POLLOUT | select.POLLERR | select.POLLHUP)
        for fd in open_:
            poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        for fd, _ in poller.poll(max(0, int((next_round - now) * 1000))):
            if fd in connecting:
                sock, kind = connecting.pop(fd)
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    failed += 1
                    sock.close()
                    continue
                sock.settimeout(1)
                try:
                    sock.sendall(slow_headers[:1] if kind == "headers" else body_headers + b"a")
                    open_[fd] = (sock, kind, 1)
                except OSError:
                    failed += 1
                    sock.close()
                if not connecting:
                    held_until = min(deadline, time.perf_counter() + plan.slow_hold_s)
            elif fd in open_:
                drop(fd, _read_answer(open_[fd][0], 0.2))
        if time.perf_counter() >= next_round:
            next_round += 1.0
            for fd in list(open_):
                sock, kind, n = open_[fd]
                try:
                    sock.send((slow_headers[n:n + 1] or b"a") if kind == "headers" else b"a")
                    open_[fd] = (sock, kind, n + 1)
                except OSError as exc:
                    drop(fd, type(exc).__name__)
    not_connected = len(connecting) + failed
    for sock, *_ in [*connecting.values(), *open_.values()]:
        sock.close()
    out = {"opened": plan.slow_connections - not_connected, "not_opened": not_connected,
           "closed_by_server": closed_by_server, "answers": answers, "open_at_end": len(open_),
           "held_s": round(time.perf_counter() - started, 1)}
    print(f"    slow connections: {out}", flush=True)
    return out


def _send_body(config: Config, plan: Plan, deadline: float, auth: str | None, chunked: bool) -> dict[str, Any]:
    host, port = config.store.host, config.store.port
    query = quote("INSERT INTO abuse_sink FORMAT LineAsString")
    head = f"POST /?query={query} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: text/plain\r\n"
    if auth:
        head += f"Authorization: {auth}\r\n"
    head += "Transfer-Encoding: chunked\r\n\r\n" if chunked else f"Content-Length: {plan.body_bytes}\r\n\r\n"
    block = (b"a" * 1023 + b"\n") * 1024
    frame = (f"{len(block):x}\r\n".encode() + block + b"\r\n") if chunked else block
    t = time.perf_counter()
    sent, ended = 0, "sent all"
    try:
        sock = socket.create_connection((host, port), timeout=5)
    except OSError as exc:
        return {"status": f"connect {type(exc).__name__}", "sent_mib": 0, "seconds": 0.0}
    with sock:
        sock.settimeout(10)      # a server that stops reading without closing: give up after 10 s
        try:
            sock.sendall(head.encode())
            while sent < plan.body_bytes:
                if time.perf_counter() > deadline:
                    ended = "phase deadline"
                    break
                if _readable(sock):
                    ended = "server answered or closed"
                    break
                sock.sendall(frame)
                sent += len(block)
            else:
                if chunked:
                    sock.sendall(b"0\r\n\r\n")
        except TimeoutError:
            ended = "server stopped reading"
        except OSError as exc:
            ended = f"{type(exc).__name__}"
        status = _read_answer(sock, min(30.0, max(0.5, deadline - time.perf_counter())))
    out = {"status": status, "ended": ended, "sent_mib": round(sent / MIB, 1),
           "seconds": round(time.perf_counter() - t, 2)}
    print(f"    {plan.body_bytes // MIB} MiB body: {out}", flush=True)
    return out


def attack_body_wrong_password(config: Config, plan: Plan, deadline: float) -> dict[str, Any]:
    return _send_body(config, plan, deadline, _basic("default", "wrong-" + secrets.token_hex(8)), chunked=False)


def attack_body_no_password(config: Config, plan: Plan, deadline: float) -> dict[str, Any]:
    return _send_body(config, plan, deadline, None, chunked=True)


def _reader_request(config: Config, statement: bytes, rcvbuf: int | None = None) -> socket.socket:
    """A connection that has sent ``statement`` as the read-only user (its answer not read yet)."""
    user, password = reader_user(config)
    host, port = config.store.host, config.store.port
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect((host, port))
    sock.sendall(f"POST / HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: {_basic(user, password)}\r\n"
                 f"Content-Length: {len(statement)}\r\n\r\n".encode() + statement)
    return sock


def _answer_head(sock: socket.socket, timeout_s: float) -> tuple[str, str]:
    """(status, X-ClickHouse-Exception-Code) of the answer on ``sock``, reading no more than its head."""
    sock.settimeout(max(0.1, timeout_s))
    data = b""
    try:
        while b"\r\n\r\n" not in data and len(data) < 8192:
            chunk = sock.recv(1)     # a byte at a time: nothing of the body is taken
            if not chunk:
                break
            data += chunk
    except TimeoutError:
        return ("timeout" if not data else _status_line(data)), ""
    except OSError:
        return ("reset" if not data else _status_line(data)), ""
    code = ""
    for line in data.split(b"\r\n"):
        if line.lower().startswith(b"x-clickhouse-exception-code:"):
            code = line.split(b":", 1)[1].strip().decode()
    return _status_line(data), code


def attack_reader_holds_slots(config: Config, plan: Plan, deadline: float) -> dict[str, Any]:
    # Native: a connection closed at the end cancels its query between blocks, as a leaving client's would be.
    statement = (b"SELECT sleepEachRow(0.5) FROM numbers(" + str(int(plan.reader_hold_s * 2) + 8).encode()
                 + b") SETTINGS max_block_size = 1 FORMAT Native")
    until = min(deadline, time.perf_counter() + plan.reader_hold_s)
    # One thread, non-blocking: the bench's own probe and writer threads must not wait for the attack's GIL.
    waiting: dict[int, tuple[socket.socket, float]] = {}   # fd -> a request not answered yet, sent at
    retry_at: list[float] = [time.perf_counter()] * plan.reader_slow_queries
    tally: dict[str, int] = {}
    most_running = 0
    while time.perf_counter() < until:
        now = time.perf_counter()
        for i, at in enumerate(retry_at):
            if at <= now:
                try:
                    sock = _reader_request(config, statement)
                    sock.setblocking(False)
                    waiting[sock.fileno()] = (sock, now)
                    retry_at[i] = float("inf")
                except OSError as exc:
                    tally[f"connect {type(exc).__name__}"] = tally.get(f"connect {type(exc).__name__}", 0) + 1
                    retry_at[i] = now + 0.2
        poller = select.poll()
        for fd in waiting:
            poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        for fd, _ in poller.poll(50):
            sock, _ = waiting.pop(fd)
            try:
                status = _status_line(sock.recv(4096))
            except OSError as exc:
                status = type(exc).__name__
            sock.close()
            tally[status] = tally.get(status, 0) + 1
            retry_at[retry_at.index(float("inf"))] = time.perf_counter() + 0.2   # asked again 200 ms later
        # a request unanswered for 300 ms is running (a refusal comes at once)
        most_running = max(most_running, sum(1 for _, sent in waiting.values() if now - sent > 0.3))
    for sock, _ in waiting.values():
        sock.close()
    out = {"connections": plan.reader_slow_queries, "most_running_at_once": most_running,
           "answers": tally}
    print(f"    reader holding slots: {out}", flush=True)
    return out


def attack_reader_unread_answers(config: Config, plan: Plan, deadline: float) -> dict[str, Any]:
    rows = plan.reader_answer_mib * 1024
    statement = f"SELECT repeat('x', 1023) FROM numbers({rows}) FORMAT TSV".encode()
    until = min(deadline, time.perf_counter() + plan.reader_hold_s)
    held: list[socket.socket] = []
    tally: dict[str, int] = {}
    # One request at a time, each once the previous one is answered: answers pile up as fast as the store
    # computes them, while the bench's probe and writer threads keep the GIL of this process.
    while time.perf_counter() < until:
        if len(held) >= plan.reader_unread_connections:
            time.sleep(0.1)
            continue
        try:
            sock = _reader_request(config, statement, rcvbuf=4096)
        except OSError as exc:
            tally[f"connect {type(exc).__name__}"] = tally.get(f"connect {type(exc).__name__}", 0) + 1
            time.sleep(0.1)
            continue
        status, code = _answer_head(sock, max(0.1, until - time.perf_counter()))
        tally[f"{status} {code}".strip()] = tally.get(f"{status} {code}".strip(), 0) + 1
        if status == "200":
            held.append(sock)      # never read
        else:
            sock.close()
            time.sleep(0.1)
    closed_by_server = sum(1 for sock in held if _readable(sock) and _closed(sock))
    for sock in held:
        sock.close()
    out = {"answer_mib": plan.reader_answer_mib, "answers": tally, "held_unread_at_end": len(held),
           "of_those_closed_by_server": closed_by_server}
    print(f"    reader unread answers: {out}", flush=True)
    return out


def _closed(sock: socket.socket) -> bool:
    """True when the server has closed ``sock`` (what is left to read of an answer is dropped)."""
    sock.setblocking(False)
    try:
        while chunk := sock.recv(MIB):
            del chunk
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


ATTACKS: dict[str, tuple[Callable[[Config, Plan, float], dict[str, Any]], Callable[[Plan], float]]] = {
    "idle": (attack_idle, lambda p: p.idle_s + 5),
    "query_4mb": (attack_query_4mb, lambda p: p.query_budget_s),
    "slow_500": (attack_slow_500, lambda p: p.slow_hold_s + 40),
    "body_1g_wrong_password": (attack_body_wrong_password, lambda p: p.body_budget_s),
    "body_1g_no_password": (attack_body_no_password, lambda p: p.body_budget_s),
    "reader_holds_slots": (attack_reader_holds_slots, lambda p: p.reader_hold_s + 20),
    "reader_unread_answers": (attack_reader_unread_answers, lambda p: p.reader_hold_s + 40),
}


# ---------------------------------------------------------------------------------------------------------------
# One phase on a store of its own


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def _answers_ping(config: Config, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(f"http://{config.store.host}:{config.store.port}/ping", timeout=timeout_s) as r:
            return r.status == 200
    except OSError:
        return False


def _prepare(config: Config) -> None:
    with connect(config, database=None) as client:
        client.command(f"CREATE DATABASE IF NOT EXISTS {config.store.database}")
    with connect(config) as client:
        client.command("CREATE TABLE IF NOT EXISTS abuse_writes (ts DateTime64(3), seq UInt32) "
                       "ENGINE = MergeTree ORDER BY ts")
        client.command("CREATE TABLE IF NOT EXISTS abuse_sink (line String) ENGINE = MergeTree ORDER BY tuple()")


def run_phase(name: str, root: Path, plan: Plan, password: str) -> dict[str, Any]:
    data = root / name
    config = load_config(environ={}, root=str(REPO), paths={"data_dir": str(data)},
                         store={"database": "bench", "port": free_port(), "password": password})
    attack, budget = ATTACKS[name]
    print(f"[{name}] store at {config.store_url}", flush=True)
    with served_store(config) as proc:
        _prepare(config)
        rss = RssSampler(proc.pid)
        probe, writer = Loop(), Loop()
        seq = iter(range(1, 10**9))
        probe.start(lambda c: c.command("SELECT 1"), config, PROBE_GAP_S)
        writer.start(lambda c: c.insert("abuse_writes", [[datetime.now(UTC), next(seq)]], column_names=["ts", "seq"],
                                        column_type_names=["DateTime64(3)", "UInt32"]), config, WRITE_EVERY_S)
        time.sleep(plan.lead_in_s)
        hwm_before = rss.hwm()
        start = time.perf_counter()
        try:
            details = attack(config, plan, start + budget(plan))
        except Exception as exc:  # reported; the other phases still run
            details = {"bench_error": f"{type(exc).__name__}: {exc}"}
        attack_end = time.perf_counter()
        # At least as long a window as the idle phase's: an attack refused in milliseconds is still watched for
        # what it leaves behind, over as many probe requests as the baseline.
        time.sleep(max(TAIL_S, start + plan.idle_s - attack_end))
        end = time.perf_counter()
        hwm_after = rss.hwm()
        probe_times, probe_censored = probe.window(start, end)
        write_times, _ = writer.window(start, end)
        writes_ok = sum(1 for s in writer.samples if start <= s.started <= end and s.ok
                        and s.started + s.seconds <= end)
        probe.stop.set()
        writer.stop.set()
        stuck = not _answers_ping(config, 3.0)
        if stuck:       # e.g. a thread holding the GIL for hours: nothing else will get an answer from it
            print(f"[{name}] store not answering /ping after the phase: killed", flush=True)
            proc.kill()
            proc.wait(timeout=10)
        for loop in (probe, writer):
            if loop.thread:
                loop.thread.join(timeout=5)
        rss.stop.set()
        stored = None
        if not stuck:
            with contextlib.suppress(Exception), connect(config) as client:
                stored = int(client.command("SELECT count() FROM abuse_writes"))
        lead = rss.between(start - plan.lead_in_s, start)
        during = rss.between(start, end)
        base_kb = statistics.median(lead) if lead else 0
        peak_kb = max(during or [0])
        if hwm_after > hwm_before:     # a spike between two samples still shows in the high-water mark
            peak_kb = max(peak_kb, hwm_after)
    window_s = end - start
    result = {
        "attack_s": round(attack_end - start, 2),
        "probe": {"requests": len(probe_times), "p50_ms": round(_pct(probe_times, 0.5) * 1000, 1),
                  "p99_ms": round(_pct(probe_times, 0.99) * 1000, 1),
                  "max_ms": round(max(probe_times or [float("nan")]) * 1000, 1), "lower_bound": probe_censored,
                  "errors": len(probe.errors), "first_error": probe.errors[0] if probe.errors else None},
        "writer": {"expected": int(window_s / WRITE_EVERY_S), "acknowledged": writes_ok,
                   "max_ms": round(max(write_times or [0]) * 1000, 1), "errors": len(writer.errors),
                   "first_error": writer.errors[0] if writer.errors else None,
                   "rows_stored_whole_phase": stored,
                   "acknowledged_whole_phase": sum(1 for s in writer.samples if s.ok)},
        "rss": {"baseline_mib": round(base_kb / 1024, 1), "peak_mib": round(peak_kb / 1024, 1),
                "growth_mib": round(max(0, peak_kb - base_kb) / 1024, 1), "vmhwm_mib": round(hwm_after / 1024, 1)},
        "store_stuck_after": stuck,
        "load_avg_1m": round(os.getloadavg()[0], 1),
        "attack": details,
    }
    p, w, r = result["probe"], result["writer"], result["rss"]
    lb = ">=" if p["lower_bound"] else ""
    print(f"[{name}] probe p50 {lb}{p['p50_ms']} ms, p99 {lb}{p['p99_ms']} ms, max {lb}{p['max_ms']} ms "
          f"({p['requests']} requests, {p['errors']} errors); RSS {r['baseline_mib']} -> {r['peak_mib']} MiB "
          f"(+{r['growth_mib']}); writer {w['acknowledged']}/{w['expected']} acknowledged, {w['errors']} errors"
          f"{'; STORE STUCK' if stuck else ''}", flush=True)
    return result


def verdict(result: dict[str, Any]) -> dict[str, bool]:
    p, w, r = result["probe"], result["writer"], result["rss"]
    return {"p99": p["p99_ms"] <= GOAL_P99_MS and not p["errors"],
            "rss": r["growth_mib"] <= GOAL_RSS_MIB,
            "writer": not w["errors"] and w["acknowledged"] >= 0.9 * w["expected"] and not result["store_stuck_after"]}


def _raise_nofile(wanted: int) -> None:
    """Enough descriptors for the slow connections, here and in the store (a child inherits the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard),
                                                    hard))


def _git_head() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=5).stdout.strip()
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short holds, 128 MiB bodies, one send of each query")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {', '.join(PHASES)}")
    parser.add_argument("--out", type=Path, help="also write the JSON summary here")
    args = parser.parse_args()
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in ATTACKS]
    if unknown:
        parser.error(f"unknown phase(s) {unknown}; known: {', '.join(PHASES)}")
    plan = Plan.quick() if args.quick else Plan()
    _raise_nofile(4 * plan.slow_connections + 1024)
    summary: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": _git_head(),
                               "cores": os.cpu_count(), "quick": args.quick, "load_avg_1m": os.getloadavg()[0],
                               "goals": {"p99_ms": GOAL_P99_MS, "rss_growth_mib": GOAL_RSS_MIB,
                                         "writer": "no error, >= 90 % of inserts acknowledged on time"},
                               "phases": {}}
    password = secrets.token_urlsafe(18)
    with tempfile.TemporaryDirectory(prefix="eventide-bench-abuse-") as tmp:
        for name in phases:
            result = run_phase(name, Path(tmp), plan, password)
            result["meets"] = verdict(result)
            summary["phases"][name] = result
    print(f"\n{'phase':<24} {'probe p50':>10} {'p99 (<=50)':>11} {'max':>10} {'RSS +MiB (<=64)':>16} "
          f"{'writes ok/expected':>19} {'writer errors':>14}  goals met")
    for name, r in summary["phases"].items():
        p, w, m, lb = r["probe"], r["writer"], r["meets"], (">=" if r["probe"]["lower_bound"] else "")
        met = ", ".join(k for k, v in m.items() if v) or "none"
        print(f"{name:<24} {lb + str(p['p50_ms']):>10} {lb + str(p['p99_ms']):>11} {lb + str(p['max_ms']):>10} "
              f"{r['rss']['growth_mib']:>16} {str(w['acknowledged']) + '/' + str(w['expected']):>19} "
              f"{w['errors']:>14}  {met}{' (store stuck, killed)' if r['store_stuck_after'] else ''}")
    text = json.dumps(summary, indent=1, default=str)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
