"""The keyed query's callbacks in Spark's order, over an in-memory state and timer table (no Spark:
``tests/support/keyed_state.py``).

Spark's ``transformWithStateInPandas`` calls a processor per key and micro-batch: first ``handleInputRows`` for
every key with rows, then ``handleExpiredTimer`` once per registered timer the watermark has reached (and deletes
that timer). These tests drive ``KeyedWindowsLogic`` the same way and check that every window comes out exactly
once, and that a key's timer fires only when it has windows to emit (each firing costs the key state calls, round
trips to Spark's JVM). The Spark integration tests (tests/integration/test_sliding_and_sessions.py) check
windows through the real operator.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from analytics.keyed.logic import KeyedWindowsLogic
from analytics.keyed.schema import RUN_EVENTS, RUN_LAST, RUN_LEVELS, SESSION, SLIDING
from tests.support.keyed_state import InMemoryKeyedState

L = 60_000     # sliding window length
G = 60_000     # session gap
MEMORY = 3_600_000


def _logic(spark: InMemoryKeyedState) -> KeyedWindowsLogic:
    return KeyedWindowsLogic(spark, spark.value_state("sliding"), spark.value_state("session"), L, G, MEMORY)


def _key(family: str, name: str) -> str:
    return json.dumps([family, "shop", "metric", name, ""])


def _rows(times: list[int], first_offset: int, sessions: list[str] | None = None) -> pd.DataFrame:
    """The processor's input: one row per event (sliding) or per run of one event (sessions)."""
    n = len(times)
    frame = pd.DataFrame({
        "t": np.array(times, np.int64), "level_code": np.full(n, -1, np.int8),
        "metric_value": np.ones(n), "partition": np.zeros(n, np.int32),
        "offset": np.arange(first_offset, first_offset + n, dtype=np.int64),
        "id": [f"e{first_offset + i}" for i in range(n)], "device": ["d"] * n,
        RUN_LAST: np.array(times, np.int64), RUN_EVENTS: np.ones(n, np.int64),
        "session": sessions or [""] * n,
    })
    for column in RUN_LEVELS:
        frame[column] = 0
    return frame


def _windows(frames: list[pd.DataFrame]) -> pd.DataFrame:
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["row_type"])
    return out[out["row_type"] == "window"]


def test_a_series_gets_each_window_once_and_its_timer_fires_only_when_a_window_is_due():
    # Given a series with two events 10 s apart in every batch, the watermark 35 s behind each batch's last event,
    spark, batches = InMemoryKeyedState(), []
    logic = _logic(spark)
    series = _key(SLIDING, "cpu")
    times: list[int] = []
    for b in range(1, 9):
        batch_times = [b * 20_000 - 10_000, b * 20_000]
        batches += spark.batch(logic, {series: _rows(batch_times, len(times))}, watermark=b * 20_000 - 35_000)
        times += batch_times
    batches += spark.batch(logic, {}, watermark=10**12)   # then the stream's end closes the rest

    # then every event's trailing window (t - 60 s, t] comes out exactly once, over every event in it,
    windows = _windows(batches).sort_values("window_end_ms")
    assert windows["window_end_ms"].tolist() == times
    expected = [sum(1 for u in times if t - L < u <= t) for t in times]
    assert windows["event_count"].tolist() == expected
    # and a timer fires only when a window is due: the key's one timer is always its next window's time.
    assert spark.calls["deleteTimer (by Spark)"] == len(spark.fired_with_windows) == 7
    assert spark.calls["get"] == 8 + 7 and not spark.timers


def test_each_session_of_a_bucket_closes_once_on_the_bucket_s_timer():
    # Given two users of one bucket, ann active in every batch and bob only at the start,
    spark, out = InMemoryKeyedState(), []
    logic = _logic(spark)
    bucket = _key(SESSION, "7")
    ann, bob = "user\x1eann", "user\x1ebob"
    offset = 0
    for b in range(1, 7):
        # ann pauses 70 s (> G) after her third batch; bob is seen in the first batch only.
        t = b * 30_000 + (70_000 if b > 3 else 0)
        users = [ann, bob] if b == 1 else [ann]
        out += spark.batch(logic, {bucket: _rows([t] * len(users), offset, users)}, watermark=t - 40_000)
        offset += len(users)
    out += spark.batch(logic, {}, watermark=10**12)

    # then each session is emitted once: bob's [30 s, 90 s), ann's [30 s, 150 s) and [190 s, 310 s).
    sessions = _windows(out).sort_values(["name", "window_start_ms"])
    assert sessions[["name", "window_start_ms", "window_end_ms", "event_count"]].values.tolist() == [
        ["ann", 30_000, 150_000, 3], ["ann", 190_000, 310_000, 3], ["bob", 30_000, 90_000, 1]]


def test_a_shared_bucket_holds_sessions_of_several_apps_and_each_session_keeps_its_app():
    # Given a bucket of the shared layout (no app in the operator key; each session key is [app, kind, key]),
    # where the same user name is active in two apps, and a run of the shop's ann that arrives too late,
    spark, out = InMemoryKeyedState(), []
    logic = _logic(spark)
    bucket = json.dumps([SESSION, "", "", "3", ""])
    shop_ann, blog_ann = json.dumps(["shop", "user", "ann"]), json.dumps(["blog", "user", "ann"])
    out += spark.batch(logic, {bucket: _rows([30_000, 40_000], 0, [shop_ann, blog_ann])}, watermark=0)
    out += spark.batch(logic, {bucket: _rows([1_000], 2, [shop_ann])}, watermark=200_000)

    # then the two apps' sessions close apart, each under its own app,
    sessions = _windows(out).sort_values("app")
    assert sessions[["app", "kind", "name", "window_start_ms", "event_count"]].values.tolist() == [
        ["blog", "user", "ann", 40_000, 1], ["shop", "user", "ann", 30_000, 1]]
    # and the late run is dropped, attributed to the shop's ann.
    out = pd.concat(out, ignore_index=True)
    dropped = out[out["row_type"] == "dropped_run"]
    assert dropped[["app", "kind", "name"]].values.tolist() == [["shop", "user", "ann"]]


def test_open_sessions_are_published_as_they_grow_and_each_is_retired_once_when_merged_or_closed():
    # Given a bucket with ann and bob (G = 60 s), where a late run of ann's lands before her open session,
    spark = InMemoryKeyedState()
    logic = _logic(spark)
    bucket = _key(SESSION, "7")
    ann, bob = "user\x1eann", "user\x1ebob"
    batches = [({bucket: _rows([100_000, 100_000], 0, [ann, bob])}, 0),
               ({bucket: _rows([130_000], 2, [ann])}, 50_000),
               ({bucket: _rows([50_000], 3, [ann])}, 60_000),    # 50 s: less than G before 100 s, after W
               ({}, 200_000)]                                     # the watermark passes both sessions' ends

    # when each batch's rows are applied to a table keyed by (session key, start), a newer batch replacing a row,
    table: dict[tuple[str, int], tuple[int, int]] = {}
    provisional_per_batch, open_per_batch, closed = [], [], []
    for rows, watermark in batches:
        out = pd.concat(spark.batch(logic, rows, watermark), ignore_index=True)
        provisional = out[out["row_type"].isin(["open_session", "open_session_gone"])]
        provisional_per_batch.append(sorted(zip(provisional["name"], provisional["row_type"], strict=True)))
        for row in out.itertuples():
            if row.row_type == "open_session":
                table[(row.name, row.window_start_ms)] = (1, row.event_count)
            elif row.row_type in ("open_session_gone", "window"):
                table[(row.name, row.window_start_ms)] = (0, 0)
            if row.row_type == "window":
                closed.append((row.name, row.window_start_ms, row.event_time_ms, row.event_count))
        open_per_batch.append(sorted((k, n) for k, (is_open, n) in table.items() if is_open))

    # then the open sessions after each batch are the sessions as they stand, ann's moved to its earlier start,
    assert open_per_batch == [
        [(("ann", 100_000), 1), (("bob", 100_000), 1)],
        [(("ann", 100_000), 2), (("bob", 100_000), 1)],
        [(("ann", 50_000), 3), (("bob", 100_000), 1)],
        [],
    ]
    # a batch publishes only the keys it changed (bob's row stands untouched in batches 2 and 3),
    assert provisional_per_batch == [
        [("ann", "open_session"), ("bob", "open_session")],
        [("ann", "open_session")],
        [("ann", "open_session"), ("ann", "open_session_gone")],
        [],
    ]
    # and every open session ends as exactly one final session with the events it showed last.
    assert sorted(closed) == [("ann", 50_000, 130_000, 3), ("bob", 100_000, 100_000, 1)]
