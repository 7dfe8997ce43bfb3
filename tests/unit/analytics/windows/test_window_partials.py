"""Window partials: one row per (series, grain bucket) of an accept batch, standing for its events in the windows.

The ``windows`` query merges partials instead of events (``analytics.windows.partials``); the end-to-end window
tests check the results. These check the partials themselves against the events they stand for.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
from datasketches import hll_sketch, hll_union, kll_doubles_sketch

from analytics.vocabulary import ARROW_TIME, WindowSpec
from analytics.windows.partials import SCHEMA, grain_ms, partials
from eventide.config import load_config

T0_MS = int(datetime(2026, 11, 25, 12, 0, tzinfo=UTC).timestamp() * 1000)
CONFIG = load_config(environ={})   # windows of 10 s and 60 s, hopping 300 s every 60 s: grain 10 s


def events(*rows: tuple[str, int, float | None, str | None, str, str | None]) -> pa.Table:
    """(name, ms after T0, metric value, user, device, log level) per event, all of app "shop"."""
    names, offsets, values, users, devices, levels = zip(*rows, strict=True)
    n = len(rows)
    return pa.table({
        "app": ["shop"] * n, "kind": ["log" if lvl else "metric" for lvl in levels], "name": list(names),
        "series_tags": [""] * n,
        "corrected_event_time": pa.array([(T0_MS + o) * 1000 for o in offsets], pa.int64()).cast(ARROW_TIME),
        "metric_value": pa.array(values, pa.float64()), "user": list(users), "device": list(devices),
        "level": list(levels),
    })


def by_bucket(table: pa.Table) -> dict[tuple[str, int], dict]:
    return {(row["name"], row["bucket_start_ms"] - T0_MS): row for row in table.to_pylist()}


def test_the_grain_is_the_longest_step_every_window_bound_is_a_multiple_of() -> None:
    assert grain_ms([WindowSpec("tumbling", 10, 10), WindowSpec("tumbling", 60, 60),
                     WindowSpec("hopping", 300, 60)]) == 10_000
    assert grain_ms([WindowSpec("tumbling", 60, 60), WindowSpec("hopping", 90, 45)]) == 15_000
    assert grain_ms([WindowSpec("tumbling", 7, 7), WindowSpec("tumbling", 10, 10)]) == 1_000


def test_one_partial_per_series_and_bucket_with_its_events_counts_sum_min_max_and_levels() -> None:
    table = partials(events(
        ("latency", 0, 5.0, "u1", "d1", None),
        ("latency", 9_999, 1.5, "u2", "d1", None),      # same bucket [0, 10 s)
        ("latency", 10_000, 7.0, "u1", "d2", None),     # next bucket
        ("http", 3_000, None, "u1", "d1", "error"),
        ("http", 4_000, None, None, "d3", "error"),
        ("http", 5_000, None, "u3", "d3", "info"),
    ), CONFIG)

    assert table.schema == SCHEMA
    rows = by_bucket(table)
    assert set(rows) == {("latency", 0), ("latency", 10_000), ("http", 0)}
    first = rows[("latency", 0)]
    assert (first["event_count"], first["value_count"], first["sum"], first["min"], first["max"]) == (2, 2, 6.5,
                                                                                                      1.5, 5.0)
    assert first["corrected_event_time"] == datetime.fromtimestamp((T0_MS + 9_999) / 1000, UTC)
    logs = rows[("http", 0)]
    assert (logs["event_count"], logs["value_count"], logs["sum"], logs["min"], logs["max"]) == (3, 0, 0.0, None,
                                                                                                 None)
    assert (logs["level_error"], logs["level_info"], logs["level_warning"]) == (2, 1, 0)
    assert logs["value_sketch"] is None


def test_sketches_merge_into_what_the_events_themselves_would_give() -> None:
    rng = np.random.default_rng(7)
    rows = [("latency", int(ms), float(v), f"u{u}", f"d{u % 3}", None)
            for ms, v, u in zip(rng.integers(0, 60_000, 500), rng.lognormal(3, 1, 500), rng.integers(0, 40, 500),
                                strict=True)]
    table = partials(events(*rows), CONFIG)

    assert table.num_rows == 6   # six 10-s buckets of one series
    merged = kll_doubles_sketch(CONFIG.stream.kll_k)
    users = hll_union(CONFIG.stream.hll_lg_k)
    for row in table.to_pylist():
        merged.merge(kll_doubles_sketch.deserialize(row["value_sketch"]))
        users.update(hll_sketch.deserialize(row["users_sketch"]))
    values = sorted(v for _, _, v, _, _, _ in rows)
    assert merged.n == 500
    assert (merged.get_min_value(), merged.get_max_value()) == (values[0], values[-1])
    assert abs(merged.get_rank(values[250]) - 0.5) < 0.02
    assert round(users.get_estimate()) == len({u for _, _, _, u, _, _ in rows})


def test_no_events_no_partials() -> None:
    assert partials(events(("x", 0, 1.0, "u", "d", None)).slice(0, 0), CONFIG).num_rows == 0
