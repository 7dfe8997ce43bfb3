"""Fault suite (issue 12): nothing lost, nothing counted twice, on the real broker, job and store.

- 10,000 fuzzed records mixed with good events: the job stays up, each bad record is dead-lettered with a
  reason, the good events count exactly;
- the stream job SIGKILLed (whole process group) at random moments, three times, during one run: every table the
  dashboard reads ends identical to an uninterrupted run of the same input;
- one of those moments made exact: a reader of the accepted-events log stopped after its file source chose the
  next file and before the batch reading it was planned (the rare kill that once made the results differ);
- the broker SIGKILLed and restarted while the SDK and the gateway produce: every acknowledged event is stored
  exactly once (counted by id), however many copies the clients' retries and replays wrote;
- the store stopped while the job writes and started again 60 s later: the job waits, retries, loses nothing;
- an alert webhook that answers 400, hangs or resets for one notification each: every later notification is
  delivered within the deadline, the three are recorded as failed deliveries (issue 36).

The scenarios live in tests/support/fault_injection.py; ``bench/faults.py`` runs them longer and prints figures.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest

from analytics.job import run_until_idle
from tests.support import fault_injection as faults
from tests.support.pipeline import run_job


def test_ten_thousand_fuzzed_records_are_dead_lettered_and_good_events_count_exactly(stack, spark):
    outcome = faults.fuzz(stack, spark, bad=10_000, good=500)

    assert (outcome.counted, outcome.counted_sum) == (500, outcome.expected_sum)
    assert (outcome.dead_letters, outcome.without_reason) == (10_000, 0)
    assert outcome.reasons >= 7
    assert outcome.duplicates == 0


@pytest.mark.timeout(1200)   # three job starts (a JVM each) and two full runs
def test_job_killed_three_times_at_random_moments_ends_identical_to_an_uninterrupted_run(kafka, spark):
    outcome = faults.kill_the_job(kafka, spark, kills=3)

    assert outcome.extra["unfinished_before_the_last_restart"], "the job finished before the last kill"
    assert outcome.faults == 3, "a kill met a job that had already ended: not a fault"
    assert outcome.differing == dict.fromkeys(faults.RESULT_QUERIES, 0), outcome.explain()
    assert outcome.rows["window_aggregates"] > 50 and outcome.rows["duplicates"] and outcome.rows["stragglers"]


@pytest.mark.timeout(900)
def test_a_reader_stopped_between_choosing_its_next_file_and_planning_it_still_reads_one_accept_batch_per_batch(
        kafka, spark, tmp_path):
    """Spark's file source logs the file it chose for the next micro-batch (``sources/0/<n>``) before the batch
    is planned (``offsets/<N>``). A kill in between once left an entry no batch covered, and the restarted reader
    planned one batch over it and the next file: two accept batches under one watermark, so some late events
    were judged against another watermark than in a run never killed. Here the windows query stops exactly there."""
    records = faults.workload(random.Random(11))
    reference, faulted = faults.two_runs(kafka, "unplanned", records)
    run_job(spark, reference)

    run_until_idle(spark, faulted, only=("accept",))
    # The batches the windows query reads: a directory of partials files each (each accept batch a reader batch).
    published = sorted(p for p in faulted.reader_partials_dir.iterdir() if p.name.isdigit())
    aside = tmp_path / "aside"
    aside.mkdir()
    for batch in published[3:]:
        batch.rename(aside / batch.name)
    run_until_idle(spark, faulted, only=("windows",))                 # the first three accept batches
    for batch in published[3:]:
        (aside / batch.name).rename(batch)                             # rename keeps the files' order in time
    log = faulted.checkpoint_dir / "windows" / "sources" / "0"
    chosen = max(int(p.name) for p in log.iterdir() if p.name.isdigit()) + 1
    entries = [{"path": file.as_uri(), "timestamp": int(file.stat().st_mtime * 1000), "batchId": chosen}
               for file in sorted(published[3].glob("*.parquet"))]
    (log / str(chosen)).write_text("v1\n" + "\n".join(json.dumps(e) for e in entries))   # as Spark writes it, just
    # before planning

    run_job(spark, faulted)                                            # restart: every query to the end

    outcome = faults.compare(reference, faulted, faults=1, events_sent=len(records))
    offsets = faulted.checkpoint_dir / "windows" / "offsets"
    ends = [json.loads((offsets / n).read_text().splitlines()[2])["logOffset"]
            for n in sorted((p.name for p in offsets.glob("[0-9]*")), key=int)]
    assert outcome.differing == dict.fromkeys(faults.RESULT_QUERIES, 0), (
        f"log batches read: {ends}\n{outcome.explain()}")
    assert all(b - a <= 1 for a, b in itertools.pairwise(ends)), f"a batch read two accept batches: {ends}"
    assert outcome.rows["stragglers"] and outcome.rows["corrections"]


@pytest.mark.timeout(900)
def test_broker_killed_while_the_sdk_and_the_gateway_produce_every_acknowledged_event_counts_once(
        kafka, spark, tmp_path):
    """The broker is SIGKILLed mid-stream and restarted 3 s later. The SDK spools and replays; a gateway client
    retries every batch until it is answered 200 (an answer lost with the broker, ``"written": "unknown"``,
    may mean it was written). Each event the SDK took and each event of a batch answered 200 counts once."""
    from tests.support.stack import fresh_stack

    with faults.killable_broker(kafka, tmp_path) as own:
        config = fresh_stack(own, "broker_kill", partitions=2)
        outcome = faults.kill_the_broker(config, spark, sdk_events=4_000, gateway_batches=100)

    assert outcome.sdk_spooled > 0, "the SDK never met the broker away: nothing was tested"
    assert set(outcome.gateway_answers) != {200}, "the gateway never met the broker away"
    assert outcome.sdk_dropped == 0
    assert len(outcome.gateway_acknowledged) == 100 * 20, outcome.gateway_answers
    acknowledged = outcome.gateway_acknowledged
    assert outcome.stored == {"sdk_seq": (4_000, float(sum(range(4_000)))),
                              "gateway_seq": (len(acknowledged), float(sum(acknowledged)))}, outcome
    # Counted by id: the accepted-events log holds each id once; every other copy on the topic is a duplicate.
    assert len(outcome.accepted_ids) == len(set(outcome.accepted_ids)) == 4_000 + len(acknowledged)
    assert outcome.stored_duplicates == outcome.records_on_topic - len(outcome.accepted_ids)
    assert (outcome.lost, outcome.double_counted) == (0, 0)


@pytest.mark.timeout(1200)   # two full runs and a 60 s outage
def test_store_away_for_a_minute_the_job_waits_retries_and_loses_nothing(kafka, spark, tmp_path):
    """The store process is stopped while the job writes, and started again (same port, same directory) 60 s
    later: the job logs that it waits, retries, and ends with exactly the results of an uninterrupted run."""
    from tests.support.stack import served_store

    with served_store(tmp_path / "store") as (store, process):
        outcome = faults.store_away(kafka, spark, store, process, outage_s=60, log_dir=tmp_path / "store")

    assert outcome.extra["waits"], "the job never met the store away: nothing was tested"
    assert "the micro-batch waits and retries" in outcome.extra["waits"][0]
    assert outcome.differing == dict.fromkeys(faults.RESULT_QUERIES, 0), outcome.explain()
    assert outcome.window_events[0] == outcome.window_events[1] > 0


@pytest.mark.timeout(600)
def test_sdk_spool_on_a_full_file_system_counts_every_drop_tears_no_line_and_replays_what_it_kept_once(
        kafka, tmp_path):
    """Given an SDK app with no broker reachable whose spool lies on a 256 KiB file system (a tmpfs; a file-size
    limit where mounting is refused), when it records far more events than fit, then every event is either in the
    spool as a whole line or counted as dropped (``enqueued == spooled + dropped``), no segment holds a torn line,
    and once a broker is reachable every spooled event reaches Kafka exactly once, in the order it was spooled."""
    from tests.support.sdk import fresh_topic

    config = fresh_topic(kafka, "spool-full-disk", tmp_path / "unused", partitions=1)
    outcome = faults.spool_on_a_full_disk(config, tmp_path, events=6_000)
    recorded = outcome.stats

    assert recorded["enqueued"] == 6_000 and recorded["flushed"] is False
    assert recorded["dropped_spool_full"] > 0, f"the disk never filled ({outcome.how}): nothing was tested"
    assert recorded["enqueued"] == recorded["spooled"] + recorded["dropped"]
    assert recorded["dropped"] == recorded["dropped_spool_full"] + recorded["dropped_spool_error"]
    assert (outcome.torn_segments, outcome.unparsable_lines) == (0, 0)
    assert len(outcome.spooled_values) == recorded["spooled"] > 0
    assert outcome.replay_stats["replayed"] == recorded["spooled"] and outcome.replay_stats["spool_torn_lines"] == 0
    assert outcome.delivered_values == outcome.spooled_values     # each once, in order
    assert outcome.segments_left == 0


@pytest.mark.serial   # deadlines on the wall clock: run alone (./run test)
def test_a_webhook_that_refuses_hangs_or_resets_one_notification_delivers_every_later_one_on_time(stack):
    """Given the alert delivery threads and a webhook that answers 400 to one notification, hangs on another and
    resets the connection of a third (each the oldest of its series), when six later notifications of other series
    are due, then each arrives within the deadline (1.5 s, +0.5 s), once, and the three are recorded as failed
    deliveries (the refused one after one attempt) by their deadline."""
    outcome = faults.webhook_faults(stack, later=6, deadline_s=1.5, timeout_s=0.5, attempts=3, concurrency=2)
    assert sorted(outcome.delivered_after_s) == [f"later-{i}" for i in range(6)]
    assert max(outcome.delivered_after_s.values()) <= outcome.deadline_s + 0.5, outcome.delivered_after_s
    assert all(outcome.requests[f"later-{i}"] == 1 for i in range(6))
    assert sorted(outcome.failures) == ["hung", "refused", "reset"]
    assert outcome.failures["refused"][:3] == ("webhook answered 400 Bad Request", 1, 400)
    assert all(at <= outcome.deadline_s + 1.0 for _, _, _, at in outcome.failures.values()), outcome.failures
