"""Tumbling windows end to end: SDK -> Kafka -> Spark (official connector) -> chDB, exact expected values."""

from __future__ import annotations

import random

import pytest
from datasketches import hll_sketch, kll_doubles_sketch

from tests.support.pipeline import Metric, minute_in_past, ms, produce, run_job, window_rows

SECOND = 1000


def test_counts_sums_min_max_and_rate_per_window(stack, spark):
    t0 = minute_in_past()
    produce(stack, [
        # window [t0, t0+10s)
        Metric(t0 + 2 * SECOND, 1.0, user="ann"),
        Metric(t0 + 4 * SECOND, 2.0, user="bob"),
        Metric(t0 + 6 * SECOND, 6.0, user="ann", device="device-2"),
        # window [t0+10s, t0+20s)
        Metric(t0 + 13 * SECOND, 10.0),
        Metric(t0 + 17 * SECOND, 20.0),
        # another series, same window as the first three
        Metric(t0 + 5 * SECOND, 100.0, name="cart_value"),
    ])
    run_job(spark, stack)

    ten = [(r["name"], ms(r["window_start"]) - t0, ms(r["window_end"]) - t0, r["event_count"], r["sum"],
            r["min"], r["max"], r["mean"], r["rate"], r["distinct_users"], r["distinct_devices"])
           for r in window_rows(stack, 10)]
    assert ten == [
        ("cart_value", 0, 10 * SECOND, 1, 100.0, 100.0, 100.0, 100.0, 0.1, 0, 1),
        ("latency_ms", 0, 10 * SECOND, 3, 9.0, 1.0, 6.0, 3.0, 0.3, 2, 2),
        ("latency_ms", 10 * SECOND, 20 * SECOND, 2, 30.0, 10.0, 20.0, 15.0, 0.2, 0, 1),
    ]
    minute = [(r["name"], ms(r["window_start"]) - t0, r["event_count"], r["sum"], r["min"], r["max"])
              for r in window_rows(stack, 60)]
    assert minute == [("cart_value", 0, 1, 100.0, 100.0, 100.0), ("latency_ms", 0, 5, 39.0, 1.0, 20.0)]


def test_quantiles_and_distinct_counts_within_sketch_error_bounds(stack, spark):
    rng = random.Random(7)
    t0 = minute_in_past()
    n = 20_000
    values = [rng.lognormvariate(3.0, 1.0) for _ in range(n)]
    users = [f"user-{rng.randrange(3_000)}" for _ in range(n)]
    devices = [f"device-{rng.randrange(40)}" for _ in range(n)]
    # All inside the minute [t0, t0+60s), away from its edges.
    produce(stack, [Metric(t0 + SECOND + i * 2, v, user=u, device=d)
                    for i, (v, u, d) in enumerate(zip(values, users, devices, strict=True))])
    run_job(spark, stack)

    [row] = window_rows(stack, 60)
    assert row["event_count"] == n
    assert row["sum"] == pytest.approx(sum(values), rel=1e-9)

    kll = kll_doubles_sketch.deserialize(row["value_sketch"])
    assert kll.n == n
    eps = kll_doubles_sketch.get_normalized_rank_error(kll.k, False)
    exact = sorted(values)
    for column, q in (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999)):
        estimate = row[column]
        rank_below = sum(1 for v in exact if v < estimate) / n
        rank_at_or_below = sum(1 for v in exact if v <= estimate) / n
        assert rank_below - eps <= q <= rank_at_or_below + eps, (column, estimate, rank_below, eps)
        # Spark (Java) answers with the INCLUSIVE criterion; python's get_quantile defaults to exclusive.
        assert estimate == kll.get_quantile(q, inclusive=True)

    for column, sketch_column, truth in (("distinct_users", "users_sketch", len(set(users))),
                                         ("distinct_devices", "devices_sketch", len(set(devices)))):
        hll = hll_sketch.deserialize(row[sketch_column])
        assert hll.get_lower_bound(3) <= truth <= hll.get_upper_bound(3), (column, truth)
        assert row[column] == round(hll.get_estimate())


def test_device_clock_one_hour_off_lands_in_the_right_window(stack, spark):
    hour = 3600 * SECOND
    t0 = minute_in_past(minutes=90)
    produce(stack, [
        Metric(t0 + 3 * SECOND, 1.0, device="fast-clock", clock_offset_ms=+hour),
        Metric(t0 + 5 * SECOND, 2.0, device="slow-clock", clock_offset_ms=-hour),
        Metric(t0 + 7 * SECOND, 4.0, device="true-clock"),
    ])
    run_job(spark, stack)

    rows = window_rows(stack, 10)
    assert [(ms(r["window_start"]) - t0, r["event_count"], r["sum"], r["distinct_devices"]) for r in rows] == [
        (0, 3, 7.0, 3)
    ]
