"""Small helpers that keep the integration tests readable as specifications."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from eventide.config import Config, to_environ
from eventide.envelope import encode, log_event, metric_event, now_ms, offset_clock
from ingest.sdk import Client
from store.client import connect
from store.range_query import SKETCH_FORMATS


def assert_connection_over_the_cap_is_closed(port: int, cap: int) -> None:
    """Given ``cap`` idle connections holding a server on ``port``, one more is closed at once, unanswered; the
    idle ones are closed afterwards (so the server can be asked whether it still serves others)."""
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(cap)]
    try:
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port)) as extra:
            extra.settimeout(2)
            with contextlib.suppress(ConnectionResetError):     # closed (or reset) at once, no answer
                assert extra.recv(1) == b""
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)


def minute_in_past(minutes: int = 30) -> int:
    """A window-aligned instant (ms) safely in the past: 10 s and 60 s windows both start there."""
    return (now_ms() // 60_000 - minutes) * 60_000


def ms(ts: datetime) -> int:
    return int(ts.replace(tzinfo=UTC).timestamp() * 1000) if ts.tzinfo is None else int(ts.timestamp() * 1000)


@dataclass(frozen=True)
class Metric:
    """One metric observation that really happened at ``at`` (true time, ms) on a device whose clock is
    ``clock_offset_ms`` ahead of true time."""

    at: int
    value: float
    app: str = "shop"
    name: str = "latency_ms"
    device: str = "device-1"
    user: str | None = None
    clock_offset_ms: int = 0


def produce(config: Config, events: list[Metric]) -> None:
    """Send through the real SDK: each device's clock reads true time + its offset."""
    clients: dict[tuple[str, str, int], Client] = {}
    for e in events:
        key = (e.app, e.device, e.clock_offset_ms)
        if key not in clients:
            clients[key] = Client(e.app, e.device, config=config, clock=offset_clock(e.clock_offset_ms))
        clients[key].metric(e.name, e.value, user=e.user, event_time=e.at + e.clock_offset_ms)
    for client in clients.values():
        assert client.flush(), "Kafka did not acknowledge every event"
        client.close()


def produce_raw(config: Config, values: list[bytes]) -> None:
    client = Client("raw", "raw-device", config=config)
    for value in values:
        client.send_raw(value)
    assert client.flush(), "Kafka did not acknowledge every record"
    client.close()


def run_job(spark: Any, config: Config) -> None:
    from analytics.job import run_until_idle

    run_until_idle(spark, config)


def window_rows(config: Config, length_s: int, where: str = "1") -> list[dict[str, Any]]:
    """Latest version of every tumbling window of the given length, oldest first."""
    with connect(config) as client:
        result = client.query(
            f"SELECT * FROM window_aggregates FINAL WHERE window_kind = 'tumbling' "
            f"AND window_length_ms = {length_s * 1000} AND {where} ORDER BY app, name, window_start",
            column_formats=SKETCH_FORMATS,
        )
        return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def wait_until(predicate: Any, timeout_s: float = 30.0, interval_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s}s")


@dataclass(frozen=True)
class Event:
    """An event that truly happened at ``at`` (ms) on a device whose clock is ``skew_ms`` off and which sent it
    ``offline_ms`` later. The envelope carries the gateway's ``received_time``, so the job's
    ``corrected_event_time`` is exactly ``at`` (no network jitter): tests can put events on exact edges."""

    at: int
    value: float | None = 1.0
    app: str = "shop"
    name: str = "latency_ms"
    device: str = "device-1"
    user: str | None = None
    level: str | None = None            # set for a log event
    skew_ms: int = 0
    offline_ms: int = 0

    def envelope(self) -> dict[str, Any]:
        event_time = self.at + self.skew_ms
        sent_time = self.at + self.offline_ms + self.skew_ms
        common = dict(app=self.app, device=self.device, name=self.name, event_time=event_time,
                      sent_time=sent_time, user=self.user)
        if self.level is not None:
            event = log_event(level=self.level, message="m", **common)
        else:
            event = metric_event(value=self.value, **common)
        event["received_time"] = self.at + self.offline_ms
        return event


def produce_events(config: Config, events: list[Event]) -> None:
    produce_raw(config, [encode(e.envelope()) for e in events])


def rows(config: Config, sql: str) -> list[dict[str, Any]]:
    with connect(config) as client:
        result = client.query(sql)
        return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def eventide_cli(config: Config, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    """``eventide <args>`` in a child process that loads ``config`` (through EVENTIDE_* variables)."""
    return subprocess.run([sys.executable, "-m", "stack.cli", *args], env={**os.environ, **to_environ(config)},
                          capture_output=True, text=True, timeout=timeout_s, cwd=Path(__file__).resolve().parents[2])
