"""The processor Spark runs, through PySpark's own harness for stateful processors (``TwsTester``, PySpark 4.2).

``test_keyed_callbacks.py`` drives the window logic over a stand-in of Spark's state API; here the processor itself
(``analytics.keyed.processor.KeyedWindowsProcessor``: ``init`` declares its state rows, rows and expired timers go
through it) runs over Spark's in-memory state, value states and event-time timers. ``TwsTester`` fires the timers a
new watermark makes due when it is set, before the rows of the batch that follows; every event of these batches is
after the watermark, so that order changes no window.
"""

from __future__ import annotations

import pandas as pd
from pyspark.sql.streaming.tws_tester import TwsTester

from analytics.keyed.processor import KeyedWindowsProcessor
from analytics.keyed.schema import SESSION, SLIDING
from tests.unit.analytics.keyed.test_keyed_callbacks import MEMORY, G, L, _key, _rows


def _harness() -> TwsTester:
    return TwsTester(KeyedWindowsProcessor(L, G, MEMORY), timeMode="EventTime",
                     eventTimeExtractor=lambda row: row["t"])


def _frames(*outputs: object) -> pd.DataFrame:
    frames = [o for o in outputs if isinstance(o, pd.DataFrame) and not o.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["row_type"])


def test_a_series_gets_each_trailing_window_once_through_the_processor_spark_runs():
    # Given a series with two events 10 s apart in every batch, the watermark 35 s behind each batch's last event,
    spark, series, outputs, times = _harness(), _key(SLIDING, "cpu"), [], []
    for b in range(1, 9):
        if b > 1:
            outputs.append(spark.setWatermark(b * 20_000 - 35_000))
        batch_times = [b * 20_000 - 10_000, b * 20_000]
        outputs.append(spark.testInPandas(series, _rows(batch_times, len(times))))
        times += batch_times
    outputs.append(spark.setWatermark(10**12))      # then the stream's end closes the rest

    # then every event's trailing window (t - 60 s, t] comes out exactly once, over every event in it,
    rows = _frames(*outputs)
    windows = rows[rows["row_type"] == "window"].sort_values("window_end_ms")
    assert windows["window_end_ms"].tolist() == times
    assert windows["event_count"].tolist() == [sum(1 for u in times if t - L < u <= t) for t in times]
    # and no timer is left waiting.
    assert not list(spark.handle._timers.getAllKeysWithTimers())


def test_each_session_of_a_bucket_closes_once_through_the_processor_spark_runs():
    # Given two users of one bucket, ann active in every batch and bob only at the start,
    spark, bucket, outputs, offset = _harness(), _key(SESSION, "7"), [], 0
    ann, bob = "user\x1eann", "user\x1ebob"
    for b in range(1, 7):
        # ann pauses 70 s (> G) after her third batch; bob is seen in the first batch only.
        t = b * 30_000 + (70_000 if b > 3 else 0)
        if b > 1:
            outputs.append(spark.setWatermark(t - 40_000))
        users = [ann, bob] if b == 1 else [ann]
        outputs.append(spark.testInPandas(bucket, _rows([t] * len(users), offset, users)))
        offset += len(users)
    outputs.append(spark.setWatermark(10**12))

    # then each session is emitted once: bob's [30 s, 90 s), ann's [30 s, 150 s) and [190 s, 310 s).
    rows = _frames(*outputs)
    sessions = rows[rows["row_type"] == "window"].sort_values(["name", "window_start_ms"])
    assert sessions[["name", "window_start_ms", "window_end_ms", "event_count"]].values.tolist() == [
        ["ann", 30_000, 150_000, 3], ["ann", 190_000, 310_000, 3], ["bob", 30_000, 90_000, 1]]
    assert not list(spark.handle._timers.getAllKeysWithTimers())
