"""A live job whose ``accept`` runs more often than the windows (``stream.accept_interval_s`` under
``stream.trigger_interval_s``): log lines are stored at accept's pace, the windows take accept's batches grouped into
reader batches, and the last batch before a pause still reaches them (``analytics.reader_batches``); meanwhile each
accept batch writes the rows of the windows it changed, which the windows query's rows then replace
(``analytics.windows.provisional``), and the sessions in progress it changed, which keyed_windows' rows then
replace (``analytics.keyed.provisional``)."""

from __future__ import annotations

import time

import pytest

from analytics import accepted_log
from analytics.job import start_queries
from analytics.rounds import covered, reader_version
from store.client import connect
from store.pipeline import PROVISIONAL_WINDOWS, last_batches
from tests.support.pipeline import Metric, minute_in_past, produce, rows, wait_until, window_rows
from tests.support.stack import fresh_stack

pytestmark = pytest.mark.integration

ACCEPT_S, TRIGGER_S = 0.5, 4.0
BURSTS = 6


def test_accept_batches_reach_the_windows_grouped_and_every_event_is_counted_once(kafka, spark):
    config = fresh_stack(kafka, "reader_batches", partitions=1, trigger_interval_s=TRIGGER_S,
                         accept_interval_s=ACCEPT_S, accepted_poll_interval_s=0.25)
    start = minute_in_past(5)
    queries = start_queries(spark, config)
    try:
        # Given six bursts of 10 on-time events, each in an accept batch of its own, ten per 10-s window,
        for burst in range(BURSTS):
            produce(config, [Metric(at=start + burst * 10_000 + i * 100, value=float(i)) for i in range(10)])
            wait_until(lambda n=burst + 1: len(accepted_log.metas(config)) == n, timeout_s=30, interval_s=0.05)
        # then every event is counted once, in its window, once the windows took the last reader batch (their rows,
        # not provisional ones, have the last word),
        expected = [(start + b * 10_000, 10, True) for b in range(BURSTS)]
        wait_until(lambda: [(int(r["window_start"].timestamp() * 1000), r["event_count"],
                             r["version"] == reader_version(covered(r["version"])))
                            for r in window_rows(config, 10)] == expected, timeout_s=90)
        # (the events after the last accept batch handed over by the idle timer, no new accept batch coming),
        accepted = [m.batch_id for m in accepted_log.metas(config)]
        handed = sorted(int(d.name) for d in config.reader_partials_dir.iterdir() if d.name.isdigit())
        assert handed[-1] == accepted[-1]
        # and the windows read fewer, larger batches than accept made: each of several accept batches,
        windows_batches = rows(config, "SELECT count() AS n FROM pipeline_progress FINAL "
                                       "WHERE query_name = 'windows' AND input_rows > 0")[0]["n"]
        assert len(accepted) >= 4 and windows_batches < len(accepted), (accepted, windows_batches)
    finally:
        for query in queries:
            query.stop()


def test_a_window_moves_at_each_accept_batch_and_the_windows_query_has_the_last_word(kafka, spark):
    # The windows query takes a reader batch only every 20 s; accept runs every 0.5 s.
    config = fresh_stack(kafka, "provisional_windows", partitions=1, trigger_interval_s=20.0,
                         accept_interval_s=ACCEPT_S, accepted_poll_interval_s=0.25)
    start = minute_in_past(5)
    queries = start_queries(spark, config)

    def window() -> tuple[int, float, bool] | None:
        found = rows(config, "SELECT event_count, max, version, is_final FROM window_results "
                             f"WHERE name = 'latency_ms' AND window_kind = 'tumbling' AND window_length_ms = 10000 "
                             f"AND toUnixTimestamp64Milli(window_start) = {start}")
        if not found:
            return None
        row = found[0]
        assert not row["is_final"] or row["version"] == reader_version(covered(row["version"])), row
        return row["event_count"], row["max"], row["version"] == reader_version(covered(row["version"]))

    try:
        # Given 10 events in one 10-s window, and one in each of 81 other series (hundreds of windows to look up, one
        # named to break out of a quoted SQL string),
        others = [f"other_{n}" for n in range(80)] + ["other_'); DROP TABLE logs; --\\"]
        produce(config, [Metric(at=start + i * 100, value=float(i)) for i in range(10)]
                + [Metric(at=start + 1_000, value=1.0, name=name) for name in others])
        sent = time.monotonic()
        # its row shows them within a few accept batches, long before the windows query takes them, as do the others,
        wait_until(lambda: window() == (10, 9.0, False), timeout_s=15)
        assert time.monotonic() - sent < 10
        moved = rows(config, "SELECT count() AS n FROM window_results WHERE name LIKE 'other_%' AND version % 2 = 0 "
                             "AND window_kind = 'tumbling' AND window_length_ms = 10000 AND event_count = 1")
        assert moved[0]["n"] == len(others)
        # and so do the hopping windows holding the 10 (300 s every 60 s: five),
        hopping = rows(config, "SELECT event_count FROM window_results WHERE name = 'latency_ms' "
                               "AND window_kind = 'hopping' AND version % 2 = 0")
        assert [r["event_count"] for r in hopping] == [10] * 5, hopping
        # (each round recorded beside the queries' batches, which the dashboard's window charts follow),
        with connect(config) as client:
            assert PROVISIONAL_WINDOWS in last_batches(client)
        # 5 more events in the same window move the same row (merged into the provisional one: none counted twice),
        produce(config, [Metric(at=start + 5_000 + i * 100, value=20.0 + i) for i in range(5)])
        wait_until(lambda: window() == (15, 24.0, False), timeout_s=15)
        # and once the windows query has taken them, its own row, with the same figures, replaces it.
        wait_until(lambda: window() == (15, 24.0, True), timeout_s=90)
    finally:
        for query in queries:
            query.stop()


def test_a_session_moves_at_each_accept_batch_and_the_keyed_query_has_the_last_word(kafka, spark):
    # keyed_windows takes a reader batch only every 30 s; accept runs every 0.5 s.
    config = fresh_stack(kafka, "provisional_sessions", partitions=1, trigger_interval_s=30.0,
                         accept_interval_s=ACCEPT_S, accepted_poll_interval_s=0.25)
    start = minute_in_past(5)
    queries = start_queries(spark, config)

    def sessions(user: str) -> list[tuple[int, int]]:
        """The user's open sessions: (events, provisional), each checked to start at her first event (within the
        device clock correction)."""
        found = rows(config, "SELECT toUnixTimestamp64Milli(session_start) AS start, event_count, provisional "
                             f"FROM open_sessions_now WHERE key_kind = 'user' AND session_key = '{user}' "
                             "ORDER BY session_start")
        assert all(abs(r["start"] - start) < 2_000 for r in found), (start, found)
        return [(r["event_count"], r["provisional"]) for r in found]

    try:
        # Given ann's 10 events a second apart, bob's 3, and 2 of a user named to break out of a quoted SQL string
        # (session keys are looked up in the store by name),
        hostile = "eve'); DROP TABLE logs; --\\"
        produce(config, [Metric(at=start + i * 1_000, value=1.0, user="ann") for i in range(10)]
                + [Metric(at=start + i * 1_000, value=1.0, user="bob", device="device-2") for i in range(3)]
                + [Metric(at=start + i * 1_000, value=1.0, user=hostile, device="device-3") for i in range(2)])
        # her session in progress holds them within a few accept batches, before keyed_windows takes them,
        wait_until(lambda: sessions("ann") == [(10, 1)], timeout_s=20)
        assert sessions("bob") == [(3, 1)]
        with connect(config) as client:
            assert client.query("SELECT event_count, provisional FROM open_sessions_now WHERE session_key = "
                                "{user:String}", parameters={"user": hostile}).result_rows == [(2, 1)]
        # 5 more a minute later (less than G after her last) extend that session (none counted twice),
        produce(config, [Metric(at=start + 60_000 + i * 1_000, value=1.0, user="ann") for i in range(5)])
        wait_until(lambda: sessions("ann") == [(15, 1)], timeout_s=20)
        # and once keyed_windows has taken them, its own row, with the same figures, stands instead: one session.
        wait_until(lambda: sessions("ann") == [(15, 0)], timeout_s=90)
        assert sessions("bob") == [(3, 0)]
    finally:
        for query in queries:
            query.stop()
