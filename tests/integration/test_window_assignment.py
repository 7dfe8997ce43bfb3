"""The driver assigns a late event the windows Spark's aggregation assigns it (``windows.assign_windows`` against
``windows.window_assignments``), for every event time."""

from __future__ import annotations

import numpy as np
from pyspark.sql import functions as F

from analytics.vocabulary import assign_windows
from analytics.windows.query import window_assignments
from tests.unit.analytics.windows.test_windows_of_an_event import SPECS, T0_MS


def test_the_driver_assigns_the_same_windows_as_the_aggregation(spark) -> None:
    """Edges of every window length, before and after the epoch, and odd milliseconds."""
    edges = [T0_MS + d for d in (-300_001, -60_000, -1, 0, 1, 9_999, 10_000, 59_999, 60_000, 299_999, 300_000)]
    times = [*edges, 0, -1, 1, -10_000, 1_795_572_047_397, 4_102_444_800_123]
    frame = spark.createDataFrame([(t,) for t in times], "t long").select(
        "t", F.timestamp_millis("t").alias("corrected_event_time"))
    from_spark = sorted(
        (r.t, r.window_kind, r.window_start_ms, r.window_end_ms)
        for r in frame.select("t", F.inline(window_assignments(SPECS))).collect())

    table = assign_windows(SPECS, np.array(times))
    from_driver = sorted(zip([times[i] for i in table["event"].to_pylist()], table["window_kind"].to_pylist(),
                             table["window_start_ms"].to_pylist(), table["window_end_ms"].to_pylist(), strict=True))

    assert from_driver == from_spark
