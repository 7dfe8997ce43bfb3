"""A live ``accept`` takes a batch every ``accept_interval_s`` on a light stream and every
``accept_busy_interval_s`` on a busy one: given batches (when each writer started, the records it read), the wait
at the end of each."""

from __future__ import annotations

import pytest

from analytics.accept.pacing import AcceptPacing
from eventide.config import load_config


def pacing(interval_s: float = 1.0, busy_interval_s: float = 2.0, busy_rate: float = 5000) -> AcceptPacing:
    return AcceptPacing(interval_s, busy_interval_s, busy_rate)


def test_a_jobs_first_batch_never_waits_whatever_it_read():
    assert pacing().hold_s(started=100.0, records=1_000_000, now=100.2) == 0.0


def test_a_light_stream_takes_a_batch_every_interval():
    paced = pacing()
    paced.hold_s(100.0, 300, 100.3)
    assert paced.hold_s(101.0, 300, 101.3) == 0.0       # 300 events/s
    assert paced.hold_s(102.0, 4_999, 102.3) == 0.0     # just under the busy rate


def test_a_busy_stream_waits_until_the_busy_interval_has_passed_since_the_batch_began():
    paced = pacing()
    paced.hold_s(100.0, 10_000, 100.4)
    # 10,000 events/s: the batch began at 101 and its work ended at 101.4; it returns at 103, and Spark, past the
    # trigger's tick, starts the next at once.
    assert paced.hold_s(101.0, 10_000, 101.4) == pytest.approx(1.6)


def test_the_rate_is_the_records_over_the_time_since_the_previous_batch_began():
    paced = pacing()
    paced.hold_s(100.0, 0, 100.1)
    # 10,000 records after 2 s: 5,000 a second, busy.
    assert paced.hold_s(102.0, 10_000, 102.5) == pytest.approx(1.5)
    # 10,000 records after 4 s (a pause): 2,500 a second, light.
    assert paced.hold_s(106.0, 10_000, 106.5) == 0.0


def test_a_busy_batch_that_ran_past_the_busy_interval_does_not_wait():
    paced = pacing()
    paced.hold_s(100.0, 10_000, 100.5)
    assert paced.hold_s(101.0, 50_000, 103.2) == 0.0


def test_a_busy_interval_equal_to_the_interval_never_waits():
    paced = pacing(busy_interval_s=1.0)
    paced.hold_s(100.0, 10_000, 100.5)
    assert paced.hold_s(101.0, 100_000, 101.2) == 0.0


def test_a_longer_busy_interval_waits_longer():
    paced = pacing(busy_interval_s=4.0)
    paced.hold_s(100.0, 10_000, 100.5)
    assert paced.hold_s(101.0, 10_000, 101.2) == pytest.approx(3.8)


def test_the_busy_interval_is_at_least_the_accept_interval_and_at_most_the_trigger(tmp_path):
    def busy(**stream: object) -> float:
        return load_config(environ={}, root=str(tmp_path), stream=stream).stream.accept_busy_interval

    assert busy(trigger_interval_s=5, accept_interval_s=1, accept_busy_interval_s=2) == 2
    assert busy(trigger_interval_s=5, accept_interval_s=1, accept_busy_interval_s=9) == 5
    assert busy(trigger_interval_s=5, accept_interval_s=3, accept_busy_interval_s=2) == 3
    # accept every trigger (the default when accept_interval_s is unset): nothing to pace
    assert busy(trigger_interval_s=5, accept_interval_s=None, accept_busy_interval_s=2) == 5
