"""Fault suite (issue 12): nothing lost, nothing counted twice, on the real broker, job and store.

- 10,000 fuzzed records mixed with good events: the job stays up, each bad record is dead-lettered with a
  reason, the good events count exactly;
- the stream job SIGKILLed (whole process group) at random moments, three times, during one run: every table the
  dashboard reads ends identical to an uninterrupted run of the same input;
- the broker SIGKILLed and restarted while the SDK and the gateway produce: every acknowledged event is stored
  exactly once (counted by id), however many copies the clients' retries and replays wrote;
- the store stopped while the job writes and started again 60 s later: the job waits, retries, loses nothing.

The scenarios live in tests/fault_injection.py; ``bench/faults.py`` runs them longer and prints figures.
"""

from __future__ import annotations

import pytest

from tests import fault_injection as faults

pytestmark = pytest.mark.integration


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
    assert outcome.faults == 3
    assert outcome.differing == dict.fromkeys(faults.RESULT_QUERIES, 0), outcome.explain()
    assert outcome.rows["window_aggregates"] > 50 and outcome.rows["duplicates"] and outcome.rows["stragglers"]


@pytest.mark.timeout(900)
def test_broker_killed_while_the_sdk_and_the_gateway_produce_every_acknowledged_event_counts_once(
        kafka, spark, tmp_path):
    """The broker is SIGKILLed mid-stream and restarted 3 s later. The SDK spools and replays; a gateway client
    retries every batch until it is answered 200 (an answer lost with the broker, ``"written": "unknown"``,
    may mean it was written). Each event the SDK took and each event of a batch answered 200 counts once."""
    from tests.conftest import fresh_stack

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
    from tests.conftest import served_store

    with served_store(tmp_path / "store") as (store, process):
        outcome = faults.store_away(kafka, spark, store, process, outage_s=60, log_dir=tmp_path / "store")

    assert outcome.extra["waits"], "the job never met the store away: nothing was tested"
    assert "the micro-batch waits and retries" in outcome.extra["waits"][0]
    assert outcome.differing == dict.fromkeys(faults.RESULT_QUERIES, 0), outcome.explain()
    assert outcome.window_events[0] == outcome.window_events[1] > 0
