"""A live ``accept`` takes its batches every ``stream.accept_busy_interval_s`` while the stream carries
``stream.accept_busy_rate`` events a second or more, and every ``stream.accept_interval_s`` again once it is light
(``analytics.accept.pacing``); what it counts is the same either way."""

from __future__ import annotations

import time
from datetime import datetime
from itertools import pairwise

import pytest

from analytics.job import start_queries
from eventide.config import Config
from tests.support.pipeline import Metric, minute_in_past, produce, rows, wait_until, window_rows
from tests.support.stack import fresh_stack

pytestmark = pytest.mark.integration

ACCEPT_S, BUSY_S, BUSY_RATE = 0.5, 2.0, 50


def accept_batch_starts(config: Config) -> list[datetime]:
    found = rows(config, "SELECT batch_timestamp FROM pipeline_progress FINAL "
                         "WHERE query_name = 'accept' AND input_rows > 0 ORDER BY batch_id")
    return [r["batch_timestamp"] for r in found]


def gaps_s(starts: list[datetime]) -> list[float]:
    return [(b - a).total_seconds() for a, b in pairwise(starts)]


def test_a_busy_stream_is_accepted_every_busy_interval_and_a_light_one_every_accept_interval(kafka, spark):
    config = fresh_stack(kafka, "accept_pacing", partitions=1, trigger_interval_s=5.0, accept_interval_s=ACCEPT_S,
                         accept_busy_interval_s=BUSY_S, accept_busy_rate=BUSY_RATE, accepted_poll_interval_s=0.25)
    start = minute_in_past(5)
    queries = start_queries(spark, config)
    sent = 0

    def send(count: int) -> None:
        nonlocal sent
        produce(config, [Metric(at=start + (sent + i) * 10, value=1.0) for i in range(count)])
        sent += count

    try:
        # Given a stream of 100 events every 0.2 s or so (hundreds a second, over the busy rate of 50) for 10 s,
        busy_until = time.monotonic() + 10
        while time.monotonic() < busy_until:
            send(100)
            time.sleep(0.2)
        wait_until(lambda: sum(r["event_count"] for r in window_rows(config, 10)) == sent, timeout_s=60)
        busy = accept_batch_starts(config)
        # then, past the first batches (the first has no rate to judge by), accept's batches begin the busy interval
        # apart, not every 0.5 s,
        assert len(busy) >= 4, busy
        assert min(gaps_s(busy[2:])) >= BUSY_S - 0.1, gaps_s(busy)
        # and once the stream is light (a few events a second), every accept interval again;
        light_until = time.monotonic() + 6
        while time.monotonic() < light_until:
            send(2)
            time.sleep(0.5)
        wait_until(lambda: sum(r["event_count"] for r in window_rows(config, 10)) == sent, timeout_s=60)
        light = accept_batch_starts(config)[len(busy) + 1:]
        assert light and min(gaps_s(light)) < BUSY_S - 0.5, gaps_s(light)
        # every event counted once in either case.
        assert sum(r["event_count"] for r in window_rows(config, 10)) == sent
    finally:
        for query in queries:
            query.stop()
