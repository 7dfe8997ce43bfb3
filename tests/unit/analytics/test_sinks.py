"""The driver's records for the benchmark stay bounded in a job that runs for months."""

from __future__ import annotations

from analytics import sinks
from analytics.sinks import Newest, timed


def test_a_record_of_recent_batches_keeps_the_newest_and_forgets_the_oldest():
    stored = Newest[int, str](kept=3)
    for batch in range(5):
        stored.note(batch, f"batch {batch}")
    assert stored == {2: "batch 2", 3: "batch 3", 4: "batch 4"}
    stored.note(3, "again")   # a batch noted again keeps its place
    stored.note(5, "batch 5")
    assert list(stored) == [3, 4, 5] and stored[3] == "again"


def test_each_stage_keeps_the_timings_of_its_newest_batches_only():
    key = ("test_query", "test_stage")
    try:
        for _ in range(sinks.TIMINGS_KEPT + 10):
            with timed(*key):
                pass
        assert len(sinks.sink_seconds[key]) == sinks.TIMINGS_KEPT
    finally:
        del sinks.sink_seconds[key]
