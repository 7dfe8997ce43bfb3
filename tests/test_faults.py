"""Fault suite (issue 12): nothing lost, nothing counted twice, on the real broker, job and store.

- 10,000 fuzzed records mixed with good events: the job stays up, each bad record is dead-lettered with a
  reason, the good events count exactly;
- the stream job SIGKILLed (whole process group) at random moments, three times, during one run: every table the
  dashboard reads ends identical to an uninterrupted run of the same input;
- the store stopped while the job writes and started again 20 s later: the job waits, retries, loses nothing.

Longer runs with figures: ``bench/faults.py``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Producer

from eventide.config import Config, to_environ
from ingest.envelope import encode
from tests.conftest import fresh_stack
from tests.support import Event, rows, run_job, wait_until

pytestmark = pytest.mark.integration
S = 1000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000


def send(config: Config, records: list[tuple[str, bytes]]) -> None:
    """Produce (key, value) records as they are: the broker stamps them, the job sees raw bytes."""
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap, "acks": "all", "linger.ms": 20})
    for key, value in records:
        producer.produce(config.kafka.events_topic, value=value, key=key.encode())
        producer.poll(0)
    assert producer.flush(30) == 0


STRING_FIELDS, INTEGER_FIELDS = ("id", "kind", "app", "device", "name"), ("v", "event_time", "sent_time")


def fuzzed(rng: random.Random, good: dict[str, Any]) -> bytes:
    """One record that is not a valid envelope, of one of several kinds."""
    kind = rng.choices(range(7), weights=[20, 20, 30, 1, 5, 10, 14])[0]
    text = json.dumps(good)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 200))                          # random bytes
    if kind == 1:
        return text[: rng.randrange(1, len(text) - 1)].encode()              # truncated JSON
    if kind == 2:                                                            # a field of the wrong JSON type
        field = rng.choice([*STRING_FIELDS, *INTEGER_FIELDS, "value"])
        wrong: list[Any] = ([12, 1.5, True, [], {}] if field in STRING_FIELDS
                            else ["12", 1.5, True, []] if field in INTEGER_FIELDS else ["12", True, [], {}])
        return encode({**good, field: rng.choice(wrong)})
    if kind == 3:
        return encode({**good, "name": "x" * rng.randrange(70_000, 80_000)})  # huge field
    if kind == 4:
        depth = rng.randrange(2_000, 20_000)
        return b'{"v":1,"deep":' + b"[" * depth + b"]" * depth + b"}"          # deep nesting
    if kind == 5:
        return text.encode().replace(b'"shop"', b'"sh\xff\xfep"')             # not UTF-8
    return encode({**good, "tags": {"k": rng.choice([1, None, [], {"x": "y"}])}} if rng.random() < 0.5
                  else {**good, "event_time": good["sent_time"] + rng.randrange(1, 10_000)})


def test_ten_thousand_fuzzed_records_are_dead_lettered_and_good_events_count_exactly(stack, spark):
    rng = random.Random(12)
    good = [Event(T0 + (i % 50) * 100, float(i), device=f"d{i % 5}").envelope() for i in range(500)]
    records: list[tuple[str, bytes]] = [(e["device"], encode(e)) for e in good]
    bad = [fuzzed(rng, good[i % len(good)]) for i in range(10_000)]
    records += [(f"fuzz-{i % 7}", value) for i, value in enumerate(bad)]
    rng.shuffle(records)
    send(stack, records)
    run_job(spark, stack)

    [window] = rows(stack, "SELECT event_count, sum FROM window_aggregates FINAL WHERE window_kind = 'tumbling' "
                           "AND window_length_ms = 10000")
    assert window == {"event_count": 500, "sum": float(sum(range(500)))}
    [dead] = rows(stack, "SELECT count() AS n, countIf(reason = '') AS without_reason, uniqExact(reason) AS reasons "
                         "FROM dead_letters FINAL")
    assert (dead["n"], dead["without_reason"]) == (10_000, 0)
    assert dead["reasons"] >= 7
    assert rows(stack, "SELECT count() AS n FROM duplicates FINAL") == [{"n": 0}]


# Every table the dashboard reads, without what differs between two runs on two topics: when a row was written,
# the topic's name and the broker's timestamps (the events carry their own received_time, so every event time is
# the same in both), which micro-batch of a window query wrote a row (a restarted job may run a watermark-only
# batch the other did not: a row's version, not its values), and sketch bytes, whose layout depends on the order
# values arrived in (the quantiles and distinct counts derived from them are compared).
RESULT_QUERIES = {
    "window_aggregates": "SELECT * EXCEPT (written_at, version, value_sketch, users_sketch, devices_sketch) "
                         "FROM window_aggregates FINAL",
    "sliding_windows": "SELECT * EXCEPT (written_at, version) FROM sliding_windows FINAL",
    "sessions": "SELECT * EXCEPT (written_at, version) FROM sessions FINAL",
    "stragglers": "SELECT * EXCEPT (detected_at, batch_id) FROM stragglers FINAL",
    "corrections": "SELECT * EXCEPT (detected_at, batch_id) FROM corrections FINAL",
    "device_clocks": "SELECT * EXCEPT (recorded_at) FROM device_clocks FINAL",
    "dead_letters": "SELECT * EXCEPT (detected_at, source_topic, kafka_timestamp) FROM dead_letters FINAL",
    "duplicates": "SELECT * EXCEPT (detected_at, source_topic, kafka_timestamp) FROM duplicates FINAL",
}
# kll_k above any window's value count: KLL compaction flips coins, so only an uncompacted sketch gives the same
# quantiles in two runs.
SETTINGS = {"max_offsets_per_trigger": 60, "trigger_interval_s": 0.5, "sliding_window_s": 60, "session_gap_s": 60,
            "kll_k": 4000}


def results(config: Config) -> dict[str, list[tuple[Any, ...]]]:
    return {table: sorted(tuple(r.values()) for r in rows(config, sql)) for table, sql in RESULT_QUERIES.items()}


def workload(rng: random.Random) -> list[tuple[str, bytes]]:
    """Metrics and logs of 8 devices and 20 users over 5 minutes, with late events, re-sent copies and
    malformed records, in arrival order."""
    records: list[tuple[str, bytes]] = []
    for i in range(600):
        at = T0 + i * 500 - (rng.randrange(60_000, 200_000) if rng.random() < 0.05 else 0)
        event = Event(at, float(rng.randrange(100)), device=f"d{i % 8}", user=f"u{rng.randrange(20)}",
                      level="error" if rng.random() < 0.1 else None, name="db" if i % 10 == 0 else "latency_ms")
        value = encode(event.envelope())
        records.append((event.device, value))
        if rng.random() < 0.05:                                               # a re-sent copy, a little later
            records.append((event.device, value))
        if rng.random() < 0.01:
            records.append((event.device, value[:-3]))
    return records


@pytest.mark.timeout(1200)   # three job starts (a JVM each) and two full runs
def test_job_killed_three_times_at_random_moments_ends_identical_to_an_uninterrupted_run(kafka, spark):
    rng = random.Random(7)
    records = workload(rng)
    reference = fresh_stack(kafka, "kills_reference", **SETTINGS)
    faulted = fresh_stack(kafka, "kills_faulted", **SETTINGS)
    for config in (reference, faulted):
        send(config, records)
    run_job(spark, reference)

    commits = faulted.checkpoint_dir / "windows" / "commits"
    kills = 0
    for _ in range(3):
        before = len(list(commits.glob("[0-9]*")))
        job = subprocess.Popen([sys.executable, "-m", "analytics.job"], env={**os.environ, **to_environ(faulted)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_until(lambda b=before: len(list(commits.glob("[0-9]*"))) > b, timeout_s=180)
            time.sleep(rng.uniform(0.0, 3.0))                                 # a random moment mid-stream
        finally:
            os.killpg(job.pid, signal.SIGKILL)                                # no shutdown hooks, no final commit
            job.wait()
        kills += 1
    expected = results(reference)
    assert results(faulted) != expected, "the job finished before the last kill; nothing was tested"
    run_job(spark, faulted)                                                   # restart, run to the end

    assert kills == 3
    observed = results(faulted)
    for table in RESULT_QUERIES:
        assert observed[table] == expected[table], table
    assert len(expected["window_aggregates"]) > 50 and expected["duplicates"] and expected["stragglers"]


@pytest.mark.timeout(1200)   # two full runs and a 20 s outage
def test_store_away_mid_run_the_job_waits_retries_and_loses_nothing(kafka, spark, tmp_path, caplog):
    """The store process is stopped while the job writes, and started again (same port, same directory) 20 s
    later: the job logs that it waits, retries, and ends with exactly the results of an uninterrupted run."""
    from store import server
    from tests.conftest import served_store

    reference = fresh_stack(kafka, "outage_reference", **SETTINGS)
    with served_store(tmp_path / "store") as (store, first):
        own = kafka.model_copy(update={"store": kafka.store.model_copy(update={"url": store.store_url})})
        faulted = fresh_stack(own, "outage_faulted", **SETTINGS)
        records = workload(random.Random(3))
        for config in (reference, faulted):
            send(config, records)
        run_job(spark, reference)

        def stop_then_restart() -> None:
            wait_until(lambda: (faulted.checkpoint_dir / "windows" / "commits" / "1").exists(), timeout_s=300)
            first.send_signal(signal.SIGTERM)                                 # the store goes away mid-run
            first.wait(timeout=60)
            time.sleep(20)
            with server.child(store, log=tmp_path / "store" / "store-2.log"):   # same port, same directory
                done.wait(timeout=600)

        done = threading.Event()
        outage = threading.Thread(target=stop_then_restart)
        outage.start()
        try:
            with caplog.at_level("WARNING", logger="analytics.sinks"):
                run_job(spark, faulted)
        finally:
            done.set()
        outage.join(timeout=120)
        waits = [r.getMessage() for r in caplog.records if "store unreachable" in r.getMessage()]
        assert waits, "the job never met the store away: nothing was tested"
        assert "the micro-batch waits and retries" in waits[0]
        with server.child(store, log=tmp_path / "store" / "store-3.log"):
            observed = results(faulted)
        expected = results(reference)
        for table in RESULT_QUERIES:
            assert observed[table] == expected[table], table
