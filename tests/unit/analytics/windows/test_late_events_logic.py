"""The split of a micro-batch's late contributions into dropped stragglers and corrections (pure Arrow; the
end-to-end rules are in test_time_semantics.py and test_stragglers*.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa

from analytics.windows.stragglers import CORRECTION_COLUMNS, STRAGGLER_COLUMNS, corrections, stragglers

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
WATERMARK = T0 + timedelta(seconds=70)


def contribution(offset: int, window_start_s: int, event_s: int, name: str = "latency_ms") -> dict[str, object]:
    """Event at ``event_s`` contributing to the 60-s tumbling window starting at ``window_start_s``."""
    start, end = T0 + timedelta(seconds=window_start_s), T0 + timedelta(seconds=window_start_s + 60)
    return {"window_kind": "tumbling", "window_length_ms": 60_000, "window_hop_ms": 60_000, "app": "shop",
            "kind": "metric", "name": name, "series_tags": "", "window_start": start, "window_end": end,
            "source_partition": 0, "source_offset": offset, "event_id": f"e{offset}", "device": "d1",
            "corrected_event_time": T0 + timedelta(seconds=event_s), "watermark": WATERMARK,
            "lateness_ms": int((WATERMARK - T0 - timedelta(seconds=event_s)).total_seconds() * 1000),
            "dropped": end <= WATERMARK}


def late(*rows: dict[str, object]) -> pa.Table:
    return pa.Table.from_pylist(list(rows))


def test_a_contribution_to_a_closed_window_is_a_straggler_with_its_lateness() -> None:
    batch = late(contribution(1, 0, 10), contribution(2, 60, 65))

    dropped = stragglers(batch)

    assert dropped.column_names == list(STRAGGLER_COLUMNS)
    assert dropped.to_pylist() == [{c: contribution(1, 0, 10)[c] for c in STRAGGLER_COLUMNS}]
    assert dropped["lateness_ms"].to_pylist() == [60_000]


def test_late_events_of_an_open_window_are_counted_once_per_window_with_the_latest() -> None:
    batch = late(contribution(1, 0, 10), contribution(2, 60, 65), contribution(3, 60, 61),
                 contribution(4, 60, 69, name="db"))

    corrected = corrections(batch)

    assert corrected.column_names == list(CORRECTION_COLUMNS)
    per_window = {(r["name"], r["window_start"]): (r["late_events"], r["max_lateness_ms"])
                  for r in corrected.to_pylist()}
    assert per_window == {("latency_ms", T0 + timedelta(seconds=60)): (2, 9_000),
                          ("db", T0 + timedelta(seconds=60)): (1, 1_000)}


def test_a_batch_without_late_events_has_neither() -> None:
    empty = late(contribution(1, 0, 10)).slice(0, 0)

    assert stragglers(empty).num_rows == corrections(empty).num_rows == 0
    assert corrections(empty).column_names == list(CORRECTION_COLUMNS)
