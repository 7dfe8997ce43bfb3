"""The ingest SDK against the real broker: what a call puts on the wire, overflow policies, logging, fork."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections import Counter as Tally
from pathlib import Path

import pytest

from eventide.config import Config
from eventide.envelope import now_ms
from ingest.sdk import Client
from tests.support.sdk import consume_all, fresh_topic


@pytest.fixture
def topic(kafka: Config, request: pytest.FixtureRequest, tmp_path) -> Config:
    return fresh_topic(kafka, request.node.name, tmp_path, partitions=1)


def test_instruments_write_v1_envelopes_with_uuid7_ids_and_send_time_at_handoff(topic: Config) -> None:
    before = now_ms()
    with Client("shop", "phone-1", config=topic) as events:
        events.counter("orders").inc(user="u-42", region="eu")
        events.counter("orders", tags={"region": "us"}).inc(2)
        events.gauge("queue_len").set(7)
        events.histogram("latency_ms").observe(12.5, user="u-1")
        with events.timer("block_ms"):
            pass

        @events.timer("handler_ms")
        def handler(x: int) -> int:
            return x * 2

        assert handler(21) == 42
        events.log("error", 'payment "declined"\nretrying', user="u-42", order="17")
        assert events.flush()
    after = now_ms()

    records = consume_all(topic)
    by_name = {r["name"]: r for r in records}
    assert [r["name"] for r in records] == ["orders", "orders", "queue_len", "latency_ms", "block_ms",
                                            "handler_ms", "app"]
    assert records[0]["value"] == 1.0 and records[0]["user"] == "u-42" and records[0]["tags"] == {"region": "eu"}
    assert records[1]["value"] == 2.0 and records[1]["tags"] == {"region": "us"} and "user" not in records[1]
    assert by_name["block_ms"]["value"] >= 0 and by_name["handler_ms"]["value"] >= 0
    assert by_name["app"] | {"id": None, "event_time": None, "sent_time": None} == {
        "v": 1, "id": None, "kind": "log", "app": "shop", "device": "phone-1", "name": "app", "level": "error",
        "message": 'payment "declined"\nretrying', "user": "u-42", "tags": {"order": "17"},
        "event_time": None, "sent_time": None}
    for r in records:
        assert before <= r["event_time"] <= r["sent_time"] <= after
        assert r["id"][14] == "7" and r["id"][19] in "89ab"                 # UUIDv7, RFC 9562 variant
        assert int(r["id"].replace("-", "")[:12], 16) == r["event_time"]    # its time is the event's ms
    assert len({r["id"] for r in records}) == len(records)


def test_bad_calls_fail_loudly_in_the_caller(topic: Config) -> None:
    with Client("shop", config=topic) as events:
        with pytest.raises(ValueError, match="finite"):
            events.histogram("x").observe(float("nan"))
        with pytest.raises(ValueError, match="only goes up"):
            events.counter("x").inc(-1)
        with pytest.raises(ValueError, match="level must be one of"):
            events.log("fatal", "x")
        assert events.stats().enqueued == 0


def test_logging_handler_turns_records_into_log_events(topic: Config) -> None:
    with Client("shop", "host-1", config=topic) as events:
        logger = logging.getLogger("shop.payments")
        logger.addHandler(events.logging_handler())
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        logger.info("charged %s", "u-1")
        logger.warning("slow", extra={"user": "u-2"})
        logger.log(logging.WARNING + 5, "custom level")
        logger.debug("details")
        try:
            raise RuntimeError("card expired")
        except RuntimeError:
            logger.exception("failed")
        logger.handlers.clear()
        assert events.flush()
    records = consume_all(topic)
    assert [(r["name"], r["level"]) for r in records] == [
        ("shop.payments", "info"), ("shop.payments", "warning"), ("shop.payments", "warning"),
        ("shop.payments", "debug"), ("shop.payments", "error")]
    assert records[0]["message"] == "charged u-1" and records[1]["user"] == "u-2"
    assert "RuntimeError: card expired" in records[4]["message"]


@pytest.mark.parametrize("policy", ["drop_newest", "drop_oldest", "block"])
def test_overflow_policy_counts_every_drop_exactly_under_many_threads(kafka: Config, tmp_path, policy: str) -> None:
    """8 threads hammer a 50-event buffer drained 10 events at a time: what arrives in Kafka, what the
    stats say and what the SDK's own health metrics say must add up exactly."""
    config = fresh_topic(kafka, f"overflow-{policy}", tmp_path, partitions=1,
                         sdk={"buffer_capacity": 50, "batch_size": 10, "overflow_policy": policy,
                              "health_interval_s": 0.2})
    threads, per_thread = 8, 4000
    with Client("load", "box-1", config=config) as events:
        gauge = events.gauge("seq")

        def hammer(thread: int) -> None:
            for i in range(per_thread):
                gauge.set(thread * 1_000_000 + i)

        workers = [threading.Thread(target=hammer, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert events.flush(60)
    stats = events.stats()

    records = consume_all(config)
    values = [r["value"] for r in records if r["name"] == "seq"]
    health = Tally()
    for r in records:
        if r["name"] == "eventide.sdk.dropped":
            health[r["tags"]["reason"]] += r["value"]

    calls = threads * per_thread
    assert stats.enqueued + stats.dropped_newest == calls
    assert len(values) == len(set(values)) == stats.enqueued - stats.dropped_oldest
    assert health["overflow"] == stats.dropped_oldest + stats.dropped_newest
    assert stats.acknowledged == len(records) and stats.queue_depth == 0
    for t in range(threads):      # what survives of each thread arrives in the order it was recorded
        mine = [v for v in values if v // 1_000_000 == t]
        assert mine == sorted(mine)
    if policy == "block":
        assert stats.dropped == 0 and len(values) == calls and stats.blocked_puts > 0
    elif policy == "drop_newest":
        assert stats.dropped_newest > 0 and stats.dropped_oldest == 0
    else:
        assert stats.dropped_oldest > 0 and stats.dropped_newest == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_forked_child_sends_its_own_events_and_never_the_parents(topic: Config) -> None:
    events = Client("web", "worker-host", config=topic)
    requests = events.counter("requests")
    for _ in range(50):
        requests.inc(who="parent-before")
    pid = os.fork()
    if pid == 0:                     # the child: its own buffer, sender and producer
        code = 1
        try:
            for _ in range(30):
                requests.inc(who="child")
            code = 0 if events.flush(30) else 2
        finally:
            os._exit(code)
    for _ in range(20):
        requests.inc(who="parent-after")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert events.flush(30)
    events.close()
    tally = Tally(r["tags"]["who"] for r in consume_all(topic))
    assert tally == {"parent-before": 50, "child": 30, "parent-after": 20}


def test_the_readme_three_line_example_runs_as_written(topic: Config, tmp_path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme[readme.index("## Instrument your app"):]
    example = section[section.index("```python\n") + len("```python\n"):section.index("```\n", 20)]
    assert len(example.strip().splitlines()) == 3, example
    env = {**os.environ, "EVENTIDE_KAFKA__PORT": str(topic.kafka.port),
           "EVENTIDE_KAFKA__EVENTS_TOPIC": topic.kafka.events_topic,
           "EVENTIDE_SDK__SPOOL_DIR": str(tmp_path / "readme-spool")}
    subprocess.run([sys.executable, "-c", example], cwd=tmp_path, env=env, check=True, timeout=60,
                   stdout=subprocess.DEVNULL)
    [record] = [r for r in consume_all(topic) if not r["name"].startswith("eventide.sdk.")]
    assert (record["app"], record["name"], record["value"], record["user"]) == ("checkout", "orders", 1.0, "u-42")
