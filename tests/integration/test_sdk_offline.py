"""The SDK keeps its promises while Kafka is away: spool, survive a kill, replay in order, keep times right.

These tests stop and start a broker of their own (the session broker keeps serving the other tests).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from eventide.config import Config, load_config
from eventide.envelope import now_ms, offset_clock
from ingest.sdk import Client
from stack import broker
from stack.services import free_port
from tests.support.pipeline import minute_in_past, rows, run_job, wait_until, window_rows
from tests.support.sdk import consume_all, fresh_topic

REPO = Path(__file__).resolve().parents[2]
HOUR_MS = 3_600_000

_KILLED_APP = """
import json, sys, time
from eventide.config import load_config
from ingest.sdk import Client
overrides, n = json.loads(sys.argv[1]), int(sys.argv[2])
events = Client("killed-app", "phone-7", config=load_config(environ={}, **overrides))
seq = events.gauge("seq")
for i in range(n):
    seq.set(i)
while events.stats().spooled < n:
    time.sleep(0.05)
print("spooled", events.stats().spool_bytes, flush=True)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Config]:
    data = tmp_path_factory.mktemp("own-broker")
    config = load_config(
        environ={}, root=str(REPO),
        paths={"data_dir": str(data), "cache_dir": str(REPO / ".cache")},
        kafka={"port": free_port(), "controller_port": free_port(), "events_topic": "sdk.offline"},
        sdk={"reconnect_probe_s": 0.3, "health_interval_s": 0, "spool_dir": str(data / "spool")},
    )
    broker.start(config)
    broker.ensure_topics(config)
    yield config
    broker.stop(config)


def _overrides(config: Config) -> dict[str, object]:
    return {"root": str(config.root), "paths": {"data_dir": str(config.data_dir), "cache_dir": str(config.cache_dir)},
            "kafka": {"port": config.kafka.port, "controller_port": config.kafka.controller_port,
                      "events_topic": config.kafka.events_topic},
            "sdk": {"reconnect_probe_s": 0.3, "health_interval_s": 0, "spool_dir": str(config.spool_dir)}}


def _seq_of(config: Config, app: str) -> list[float]:
    return [r["value"] for r in consume_all(config) if r["app"] == app]


def test_broker_stopped_mid_stream_every_event_arrives_in_order_and_only_unanswered_ones_twice(
        own_broker: Config) -> None:
    n = 20_000
    events = Client("stream-app", "phone-1", config=own_broker)
    seq = events.gauge("seq")
    recorded = threading.Event()
    next_seq = [0]

    def record() -> None:
        for i in range(n):
            seq.set(i)
            next_seq[0] = i + 1
            if i % 200 == 0:
                time.sleep(0.01)       # ~20k events/s for about a second
        recorded.set()

    assert events.flush(30)              # the topic's leader is up before the stream starts
    writer = threading.Thread(target=record)
    writer.start()
    time.sleep(0.3)
    broker.stop(own_broker)
    recorded_before_the_stop_ended = next_seq[0]
    wait_until(lambda: not events.stats().online and events.stats().spool_bytes > 0, timeout_s=30)
    time.sleep(0.5)
    broker.start(own_broker)
    writer.join()
    assert events.flush(120)
    stats = events.stats()
    events.close()

    assert stats.spooled > 0 and stats.replayed == stats.spooled and stats.dropped == 0
    first_copy: dict[str, float] = {}
    second_copies: list[float] = []
    placed: list[tuple[float, int]] = []
    for message in broker.read_committed(own_broker):
        stored = json.loads(message.value())
        if stored["app"] == "stream-app":
            placed.append((stored["value"], message.offset()))
            if stored["id"] in first_copy:
                assert first_copy[stored["id"]] == stored["value"]
                second_copies.append(stored["value"])
            else:
                first_copy[stored["id"]] = stored["value"]
    # every event, in the order recorded
    assert list(first_copy.values()) == list(range(n)), (stats, _runs(placed))
    # A second copy can only be of an event in a request that the stopping broker wrote but never answered
    # (docs/ingest.md), never of one recorded once the broker was down; it has its id, so the job counts it once.
    assert len(set(second_copies)) == len(second_copies)
    assert all(value < recorded_before_the_stop_ended for value in second_copies), second_copies[:3]


def _runs(placed: list[tuple[float, int]]) -> list[str]:
    """Where each run of consecutive values sits in the partition, to tell a reordering from a loss."""
    runs: list[list[float | int]] = []
    for value, offset in placed:
        if runs and value == runs[-1][1] + 1 and offset == runs[-1][3] + 1:
            runs[-1][1], runs[-1][3] = value, offset
        else:
            runs.append([value, value, offset, offset])
    return [f"values {a:.0f}-{b:.0f} at offsets {c}-{d}" for a, b, c, d in runs[:40]]


def test_process_killed_with_a_full_spool_is_replayed_after_restart(own_broker: Config) -> None:
    n = 5_000
    broker.stop(own_broker)
    app = subprocess.Popen([sys.executable, "-c", _KILLED_APP, json.dumps(_overrides(own_broker)), str(n)],
                           cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line = app.stdout.readline() if app.stdout else ""
        assert line.startswith("spooled"), line
    finally:
        app.send_signal(signal.SIGKILL)
        app.wait()
    killed_at = now_ms()
    broker.start(own_broker)

    restarted = Client("killed-app", "phone-7", config=own_broker)
    assert restarted.flush(60)
    assert restarted.stats().replayed == n
    restarted.close()
    records = [r for r in consume_all(own_broker) if r["app"] == "killed-app"]
    assert [r["value"] for r in records] == list(range(n))
    assert all(r["event_time"] < killed_at <= r["sent_time"] for r in records)   # sent when really sent
    assert not list((own_broker.spool_dir / "killed-app").rglob("*.spool"))


def test_skewed_clock_and_hours_offline_still_give_the_true_event_time(spark, kafka: Config, tmp_path) -> None:
    """A phone whose clock is 2 h slow recorded events 3 h ago, kept them offline, and sends them now."""
    from tests.support.stack import fresh_stack

    config = fresh_topic(fresh_stack(kafka, "skew-offline"), "skew-offline", tmp_path, partitions=1)
    offline = config.model_copy(update={"kafka": config.kafka.model_copy(
        update={"bootstrap_servers": f"127.0.0.1:{free_port()}"})})     # nothing listens there
    slow_clock = offset_clock(-2 * HOUR_MS)
    minute = minute_in_past(180)
    truly_at = minute + 10_000

    phone = Client("mobile", "phone-9", config=offline, clock=slow_clock)
    for i in range(5):
        phone.metric("latency_ms", 10.0 * (i + 1), event_time=truly_at - 2 * HOUR_MS + 1000 * i)
    assert phone.flush(30) is False and phone.stats().spooled == 5
    phone.close()

    back_online = Client("mobile", "phone-9", config=config, clock=slow_clock)
    assert back_online.flush(30)
    back_online.close()
    run_job(spark, config)

    # The job also records the phone's clock offset: received - sent = +2 h (its clock is 2 h slow).
    [clock] = rows(config, "SELECT sum(events) AS events, avg(offset_avg_ms) AS offset_ms FROM device_clocks "
                           "WHERE app = 'mobile' AND device = 'phone-9'")
    assert clock["events"] == 5 and abs(clock["offset_ms"] - 2 * HOUR_MS) < 5_000

    windows = window_rows(config, 60, "app = 'mobile'")
    assert [(w["window_start"].replace(tzinfo=UTC), w["event_count"], w["sum"]) for w in windows] == [
        (datetime.fromtimestamp(minute / 1000, UTC), 5, 150.0)]


def test_a_torn_spool_line_left_by_a_crash_is_skipped_counted_and_the_lines_before_it_reach_kafka(
        own_broker: Config) -> None:
    """Given a spool segment whose writer died mid-line (no newline at its end), then the next client of that app
    and device sends every whole line, skips the torn one and says so in ``stats().spool_torn_lines``."""
    from ingest.sdk.sender import envelope_head
    from ingest.sdk.spool import spool_directory

    at = now_ms() - 60_000
    bodies = [b'{"v":1,"id":"%s",%s,"value":%d.0,"event_time":%d' % (
        f"0190a1b2-c3d4-7e5f-8a9b-{i:012d}".encode(), envelope_head("metric", "torn-app", "phone-5", "seq").encode(),
        i, at + i) for i in range(4)]
    directory = spool_directory(own_broker.spool_dir, "torn-app", "phone-5")
    directory.mkdir(parents=True)
    (directory / f"{at:013d}-1-000001.spool").write_bytes(b"".join(b + b"\n" for b in bodies[:3]) + bodies[3][:50])

    restarted = Client("torn-app", "phone-5", config=own_broker)
    assert restarted.flush(60)
    stats = restarted.stats()
    restarted.close()

    assert (stats.replayed, stats.spool_torn_lines, stats.dropped) == (3, 1, 0)
    assert _seq_of(own_broker, "torn-app") == [0.0, 1.0, 2.0]
    assert not list(directory.glob("*.spool"))
