"""Which windows an event belongs to, and which of a late event's contributions Spark drops.

The aggregation assigns windows in Spark (``windows.window_assignments``); the straggler pass assigns the late
events' windows in the driver (``windows.assign_windows``). Both must give the same windows for every event time.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest

from analytics.spark.checkpoint import BatchInfo
from analytics.vocabulary import WindowSpec, assign_windows, window_specs
from analytics.windows.stragglers import late_contributions
from eventide.config import load_config

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
SPECS = [WindowSpec("tumbling", 10, 10), WindowSpec("tumbling", 60, 60), WindowSpec("hopping", 300, 60)]


def windows_of(event_ms: int) -> list[tuple[str, int, int]]:
    table = assign_windows(SPECS, np.array([event_ms]))
    return list(zip(table["window_kind"].to_pylist(), table["window_start_ms"].to_pylist(),
                    table["window_end_ms"].to_pylist(), strict=True))


def test_an_event_lies_in_one_window_per_tumbling_length_and_length_over_hop_hopping_windows() -> None:
    t = T0_MS + 61_500   # 12:01:01.5

    assert windows_of(t) == [
        ("tumbling", T0_MS + 60_000, T0_MS + 70_000),
        ("tumbling", T0_MS + 60_000, T0_MS + 120_000),
        ("hopping", T0_MS + 60_000, T0_MS + 360_000),
        ("hopping", T0_MS, T0_MS + 300_000),
        ("hopping", T0_MS - 60_000, T0_MS + 240_000),
        ("hopping", T0_MS - 120_000, T0_MS + 180_000),
        ("hopping", T0_MS - 180_000, T0_MS + 120_000),
    ]


def test_a_window_holds_its_start_and_not_its_end() -> None:
    assert windows_of(T0_MS + 10_000)[0] == ("tumbling", T0_MS + 10_000, T0_MS + 20_000)
    assert windows_of(T0_MS + 9_999)[0] == ("tumbling", T0_MS, T0_MS + 10_000)


def test_rows_come_per_event_in_event_order() -> None:
    table = assign_windows(SPECS, np.array([T0_MS, T0_MS + 1, T0_MS + 2]))

    assert table["event"].to_pylist() == [0] * 7 + [1] * 7 + [2] * 7
    assert assign_windows(SPECS, np.array([], dtype=np.int64)).num_rows == 0


def accepted(*seconds_after_t0: float) -> pa.Table:
    """Accepted events (the columns the late pass reads) at these corrected times, one per Kafka offset."""
    n = len(seconds_after_t0)
    return pa.table({
        "app": ["shop"] * n, "kind": ["metric"] * n, "name": ["latency_ms"] * n, "series_tags": [""] * n,
        "partition": pa.array([0] * n, pa.int32()), "offset": list(range(n)), "id": [f"e{i}" for i in range(n)],
        "device": ["d1"] * n,
        "corrected_event_time": pa.array([T0 + timedelta(seconds=s) for s in seconds_after_t0],
                                         pa.timestamp("us", tz="UTC")),
    })


@pytest.fixture
def tumbling_60s():
    return load_config(environ={}, stream={"tumbling_windows_s": [60], "hopping_windows": []})


def test_only_events_behind_the_watermark_contribute_and_closed_windows_drop_them(tumbling_60s) -> None:
    watermark_ms = T0_MS + 70_000   # closes [12:00, 12:01); [12:01, 12:02) still open
    events = accepted(10, 65, 69.9995, 70, 75)

    late = late_contributions(events, tumbling_60s, BatchInfo(3, watermark_ms, {}, {}))

    assert late["event_id"].to_pylist() == ["e0", "e1", "e2"]
    assert late["dropped"].to_pylist() == [True, False, False]
    assert late["lateness_ms"].to_pylist() == [60_000, 5_000, 1]   # Spark's unix_millis: 69.9995 s -> 69,999 ms
    assert late["window_end"].to_pylist() == [T0 + timedelta(seconds=60)] + [T0 + timedelta(seconds=120)] * 2
    assert set(late["watermark"].to_pylist()) == {T0 + timedelta(seconds=70)}


def test_a_late_event_contributes_to_each_of_its_windows_and_only_the_closed_ones_drop_it() -> None:
    config = load_config(environ={})   # the default windows: tumbling 10 s and 60 s, hopping 300 s every 60 s
    assert window_specs(config) == SPECS

    late = late_contributions(accepted(61.5), config, BatchInfo(3, T0_MS + 200_000, {}, {}))

    ends = [int(e.timestamp()) - int(T0.timestamp()) for e in late["window_end"].to_pylist()]
    assert sorted(zip(ends, late["dropped"].to_pylist(), strict=True)) == [
        (70, True), (120, True), (120, True), (180, True), (240, False), (300, False), (360, False)]
