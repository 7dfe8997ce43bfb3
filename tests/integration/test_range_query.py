"""Range queries over stored tumbling windows: exact counts, merged sketches, buckets, snapping and finality.

Pure SQL layer: windows are built here from known (seeded) events, with sketches made by python datasketches the
way Spark's ``kll_sketch_agg_double`` / ``hll_sketch_agg`` make them, and inserted into a migrated chDB store.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from datasketches import hll_sketch, hll_union, kll_doubles_sketch

from eventide.config import Config, load_config
from store.client import connect
from store.migrations import apply_migrations
from store.range_query import (
    SeriesKey,
    fetch_series_windows,
    merge_hll,
    merge_kll,
    range_buckets,
    range_summary,
)
from tests.support.stack import PAST_EVENTS_RETENTION, own_database
from tests.support.window_rows import Event, insert, window_row

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
SECOND, MINUTE, HOUR = timedelta(seconds=1), timedelta(minutes=1), timedelta(hours=1)
WATERMARK = T0 + 30 * MINUTE

LATENCY = SeriesKey("shop", "metric", "latency_ms")  # an hour of random traffic, 60 s and 10 s windows
BUSY = SeriesKey("shop", "metric", "checkout_ms")  # one busy, slow minute among 59 quiet, fast ones
ERRORS = SeriesKey("shop", "log", "payments")  # log events: levels, no values
ODD = SeriesKey("shop's", "metric", "{weird} 'name'", "region=eu")  # few values; quoting


@dataclass(frozen=True)
class Store:
    config: Config
    events: dict[SeriesKey, list[Event]]


def dyadic(x: float) -> float:
    """Round to a multiple of 1/1024, so sums of these values are exact in floating point."""
    return round(x * 1024) / 1024


def tumbling(config: Config, series: SeriesKey, events: list[Event], length: timedelta) -> list[dict[str, Any]]:
    """Tumbling windows of ``length`` (epoch-aligned) over the events, one row per non-empty window."""
    by_start: dict[datetime, list[Event]] = {}
    for e in events:
        by_start.setdefault(T0 + (e.at - T0) // length * length, []).append(e)
    return [window_row(config, series, start, length, evs) for start, evs in sorted(by_start.items())]


def random_hour(rng: random.Random) -> list[Event]:
    """60 minutes of 200..2000 events each: lognormal latencies, 80% with one of 20k users, 40 devices."""
    events = []
    for minute in range(60):
        for _ in range(rng.randint(200, 2000)):
            at = T0 + minute * MINUTE + timedelta(milliseconds=rng.randrange(60_000))
            user = f"user-{rng.randrange(20_000)}" if rng.random() < 0.8 else None
            events.append(Event(at, dyadic(rng.lognormvariate(3.0, 0.8)), user, f"device-{rng.randrange(40)}"))
    return events


def busy_hour(rng: random.Random) -> list[Event]:
    """59 minutes with 100 fast values (10..20 ms) each; minute 30 has 20,000 slow ones (1..2 s)."""
    events = []
    for minute in range(60):
        busy = minute == 30
        for i in range(20_000 if busy else 100):
            value = rng.uniform(1000, 2000) if busy else rng.uniform(10, 20)
            events.append(Event(T0 + minute * MINUTE + i * timedelta(milliseconds=2), dyadic(value)))
    return events


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, store_url: str) -> Store:
    config = load_config(environ={}, root=str(tmp_path_factory.mktemp("range-query")),
                         store={"url": store_url, "database": own_database("range_query")},
                         retention=PAST_EVENTS_RETENTION)
    apply_migrations(config)
    rng = random.Random(20240501)
    events = {
        LATENCY: random_hour(rng),
        BUSY: busy_hour(rng),
        ERRORS: [Event(T0 + i * SECOND, user=f"user-{i % 7}", level=("info", "error", "critical")[i % 3])
                 for i in range(0, 180, 2)],
        ODD: [Event(T0 + m * MINUTE + i * SECOND, float(rng.randint(1, 1000))) for m in range(5) for i in range(30)],
    }
    rows = [row for series, evs in events.items() for row in tumbling(config, series, evs, MINUTE)]
    rows += tumbling(config, LATENCY, events[LATENCY], 10 * SECOND)
    # Noise that a query for the hour of LATENCY must not see:
    huge = [Event(T0, 1e6, "intruder", "device-x")] * 5
    rows += [
        window_row(config, LATENCY, T0 - MINUTE, MINUTE, huge),  # the minute before the hour
        window_row(config, LATENCY, T0 + HOUR, MINUTE, huge),  # the minute after it
        window_row(config, LATENCY, T0, 5 * MINUTE, huge, kind="hopping", hop=MINUTE),  # overlapping windows
        window_row(config, SeriesKey("shop", "metric", "latency_ms", "region=eu"), T0, MINUTE, huge),  # other tags
        window_row(config, LATENCY, T0, MINUTE, huge, version=1),  # an older version of minute 0, replaced
    ]
    insert(config, rows)
    with connect(config) as client:
        client.insert("pipeline_progress", [["windows", "q-1", "run-1", 7, WATERMARK, WATERMARK, WATERMARK]],
                      column_names=["query_name", "query_id", "run_id", "batch_id", "batch_timestamp", "watermark",
                                    "recorded_at"])
    return Store(config, events)


def between(events: Iterable[Event], start: datetime, end: datetime) -> list[Event]:
    return [e for e in events if start <= e.at < end]


def exact_rank(sorted_values: list[float], value: float) -> float:
    """Fraction of the values <= value (the inclusive rank KLL approximates)."""
    return bisect.bisect_right(sorted_values, value) / len(sorted_values)


def stored(config: Config, series: SeriesKey, column: str) -> list[Any]:
    """``column`` of the series' stored 60 s windows in the hour [T0, T0 + 1 h), oldest first."""
    with connect(config) as client:
        result = client.query(
            f"SELECT {column} FROM window_aggregates FINAL WHERE window_kind = 'tumbling' "
            "AND window_length_ms = 60000 AND name = {name:String} AND series_tags = '' "
            "AND window_start >= {start:DateTime64(3, 'UTC')} AND window_end <= {end:DateTime64(3, 'UTC')} "
            "ORDER BY window_start",
            parameters={"name": series.name, "start": T0, "end": T0 + HOUR},
            column_formats={column: "bytes"} if column.endswith("_sketch") else None)
    return [value for (value,) in result.result_rows]


def summary(store: Store, series: SeriesKey, start: datetime, end: datetime, **kwargs: Any):
    with connect(store.config) as client:
        return range_summary(client, series, start, end, **kwargs)


def buckets(store: Store, series: SeriesKey, start: datetime, end: datetime, resolution_s: float, **kwargs: Any):
    with connect(store.config) as client:
        return range_buckets(client, series, start, end, resolution_s, **kwargs)


# Exact aggregates ------------------------------------------------------------------------------------------------

def test_hour_count_sum_min_max_mean_and_rate_are_exact(store):
    events = store.events[LATENCY]
    values = [e.value for e in events]

    stats = summary(store, LATENCY, T0, T0 + HOUR)

    assert (stats.start, stats.end, stats.source_length_s, stats.windows) == (T0, T0 + HOUR, 60.0, 60)
    assert stats.count == stats.value_count == len(events)
    assert stats.sum == sum(values)
    assert (stats.min, stats.max) == (min(values), max(values))
    assert stats.mean == sum(values) / len(values)
    assert stats.rate == len(events) / 3600
    # The minutes around the hour, the hopping window, other tags and the replaced version are not counted.
    assert stats.max < 1e6


def test_a_sub_range_counts_only_the_windows_inside_it(store):
    inside = between(store.events[LATENCY], T0 + 10 * MINUTE, T0 + 20 * MINUTE)

    stats = summary(store, LATENCY, T0 + 10 * MINUTE, T0 + 20 * MINUTE)

    assert (stats.windows, stats.count) == (10, len(inside))
    assert stats.sum == sum(e.value for e in inside)


def test_log_series_adds_level_counts_and_has_no_values(store):
    events = store.events[ERRORS]

    stats = summary(store, ERRORS, T0, T0 + 5 * MINUTE)

    assert (stats.count, stats.value_count, stats.sum) == (len(events), 0, 0.0)
    assert stats.levels == {"debug": 0, "info": 30, "warning": 0, "error": 30, "critical": 30}
    assert (stats.min, stats.max, stats.mean) == (None, None, None)
    assert set(stats.quantiles.values()) == {None} and stats.value_sketch is None
    assert stats.distinct_users == 7 and stats.distinct_devices == 1


# Quantiles and distinct counts from merged sketches ---------------------------------------------------------------

def test_hour_p99_comes_from_the_merged_kll_sketch_within_its_rank_error(store):
    values = sorted(e.value for e in store.events[LATENCY])

    stats = summary(store, LATENCY, T0, T0 + HOUR)

    first, *rest = stored(store.config, LATENCY, "value_sketch")
    direct = kll_doubles_sketch.deserialize(first)
    for blob in rest:
        direct.merge(kll_doubles_sketch.deserialize(blob))
    assert stats.value_sketch.n == direct.n == len(values)
    eps = direct.normalized_rank_error(False)
    assert stats.quantile_rank_error == eps
    for q in (0.5, 0.99, 0.999):
        answer = stats.quantiles[q]
        assert abs(exact_rank(values, answer) - q) <= eps, q
        # KLL compaction flips coins, so two merges of the same sketches agree up to the rank error, not bit for bit.
        assert abs(exact_rank(values, answer) - exact_rank(values, direct.get_quantile(q, inclusive=True))) <= 2 * eps
    assert abs(stats.rank(stats.quantiles[0.99]) - 0.99) <= eps


def test_below_k_values_the_merged_quantiles_are_the_exact_inclusive_quantiles(store):
    values = sorted(e.value for e in store.events[ODD])  # 150 values: fewer than k, nothing is compacted

    stats = summary(store, ODD, T0, T0 + 5 * MINUTE)

    assert stats.windows == 5 and not stats.value_sketch.is_estimation_mode()
    # Inclusive criterion (Spark's): the smallest value whose rank reaches q.
    assert stats.quantiles == {q: values[math.ceil(q * len(values)) - 1] for q in (0.5, 0.9, 0.95, 0.99, 0.999)}


def test_hour_distinct_users_is_the_hll_union_within_three_standard_deviations(store):
    events = store.events[LATENCY]
    exact_users = len({e.user for e in events if e.user is not None})
    exact_devices = len({e.device for e in events})

    stats = summary(store, LATENCY, T0, T0 + HOUR)

    union = hll_union(store.config.stream.hll_lg_k)
    for blob in stored(store.config, LATENCY, "users_sketch"):
        union.update(hll_sketch.deserialize(blob))
    assert stats.distinct_users == round(union.get_result().get_estimate())
    low, high = stats.distinct_users_bounds(3)
    assert low <= exact_users <= high
    low, high = stats.distinct_devices_bounds(3)
    assert low <= exact_devices <= high
    # Adding the per-minute distinct counts would count every returning user again.
    assert sum(stored(store.config, LATENCY, "distinct_users")) > 2 * high


def test_averaging_per_minute_p99s_is_wrong_where_merging_sketches_is_right(store):
    values = sorted(e.value for e in store.events[BUSY])
    p99s = stored(store.config, BUSY, "p99")

    stats = summary(store, BUSY, T0, T0 + HOUR)

    eps = stats.quantile_rank_error
    averaged = sum(p99s) / len(p99s)
    # Every minute counts the same in the average, but 20,000 of the hour's 25,900 values are in the busy minute.
    assert len(p99s) == 60 and exact_rank(values, averaged) < 0.99 - 30 * eps
    assert abs(exact_rank(values, stats.quantiles[0.99]) - 0.99) <= eps
    assert averaged < 100 and stats.quantiles[0.99] > 1000


# Buckets, snapping, source windows, finality ---------------------------------------------------------------------

def test_five_minute_buckets_have_exact_counts_and_finality_follows_the_watermark(store):
    events = store.events[LATENCY]

    result = buckets(store, LATENCY, T0, T0 + HOUR, 300)

    assert [b.start for b in result] == [T0 + 5 * k * MINUTE for k in range(12)]
    assert all(b.end - b.start == 5 * MINUTE and b.windows == 5 and b.source_length_s == 60.0 for b in result)
    assert [b.count for b in result] == [len(between(events, b.start, b.end)) for b in result]
    assert [b.rate for b in result] == [b.count / 300 for b in result]
    # The watermark is at T0 + 30 min: buckets ending by then are final, later ones can still change.
    assert [b.final for b in result] == [True] * 6 + [False] * 6
    assert summary(store, LATENCY, T0, WATERMARK).final and not summary(store, LATENCY, T0, T0 + HOUR).final


def test_buckets_without_devices_skip_only_the_distinct_devices(store):
    everything = buckets(store, LATENCY, T0, T0 + HOUR, 300, quantiles=(0.5, 0.99))
    lean = buckets(store, LATENCY, T0, T0 + HOUR, 300, quantiles=(0.5, 0.99), devices=False)

    assert all(b.distinct_devices > 0 for b in everything)
    assert [(b.distinct_devices, b.devices_sketch) for b in lean] == [(0, None)] * len(everything)
    # Everything else is the same answer (KLL merges are randomized: quantiles agree within the rank error).
    same = ("start", "end", "windows", "count", "sum", "min", "max", "distinct_users", "levels", "final")
    assert [[getattr(b, f) for f in same] for b in lean] == [[getattr(b, f) for f in same] for b in everything]
    assert all(abs(x.rank(y.quantiles[0.99]) - 0.99) <= x.quantile_rank_error for x, y in zip(everything, lean,
                                                                                          strict=True))


def test_ten_second_buckets_read_the_ten_second_windows(store):
    events = store.events[LATENCY]

    result = buckets(store, LATENCY, T0 + 2 * MINUTE, T0 + 3 * MINUTE, 10)

    assert [(b.source_length_s, b.windows) for b in result] == [(10.0, 1)] * 6
    assert [b.count for b in result] == [len(between(events, b.start, b.end)) for b in result]


def test_a_range_off_the_window_grid_is_snapped_inwards(store):
    events = store.events[LATENCY]

    # Ends on whole 5 s only: no 60 s window fits the grid, so the 10 s windows inside the range answer.
    stats = summary(store, LATENCY, T0 + 5 * SECOND, T0 + HOUR - 5 * SECOND)

    assert (stats.start, stats.end, stats.source_length_s) == (T0 + 10 * SECOND, T0 + HOUR - 10 * SECOND, 10.0)
    assert stats.count == len(between(events, stats.start, stats.end))


def test_buckets_straddling_the_edges_of_the_range_are_clipped(store):
    events = store.events[LATENCY]

    result = buckets(store, LATENCY, T0 + 3 * MINUTE, T0 + 12 * MINUTE, 300)

    assert [(b.start, b.end, b.windows) for b in result] == [
        (T0 + 3 * MINUTE, T0 + 5 * MINUTE, 2), (T0 + 5 * MINUTE, T0 + 10 * MINUTE, 5),
        (T0 + 10 * MINUTE, T0 + 12 * MINUTE, 2)]
    assert [b.count for b in result] == [len(between(events, b.start, b.end)) for b in result]
    assert result[0].rate == result[0].count / 120


def test_a_resolution_no_stored_window_length_divides_is_refused(store):
    with pytest.raises(ValueError, match="divides the resolution"):
        buckets(store, LATENCY, T0, T0 + HOUR, 15)


def test_the_source_window_length_can_be_chosen(store):
    stats = summary(store, LATENCY, T0, T0 + HOUR, source_length_s=10)

    assert (stats.windows, stats.count) == (360, len(store.events[LATENCY]))


# Empty answers ----------------------------------------------------------------------------------------------------

def test_a_range_without_windows_answers_zero_and_no_quantiles(store):
    later = T0 + 5 * HOUR

    stats = summary(store, LATENCY, later, later + HOUR)

    assert (stats.windows, stats.count, stats.sum, stats.rate, stats.source_length_s) == (0, 0, 0.0, 0.0, None)
    assert (stats.min, stats.max, stats.mean, stats.quantile_rank_error) == (None, None, None, None)
    assert stats.quantiles == {0.5: None, 0.9: None, 0.95: None, 0.99: None, 0.999: None}
    assert (stats.distinct_users, stats.distinct_devices, stats.final) == (0, 0, False)
    assert stats.distinct_users_bounds() == (0.0, 0.0)
    assert [b.count for b in buckets(store, LATENCY, later, later + HOUR, 300)] == [0] * 12
    assert summary(store, SeriesKey("nope", "metric", "nothing"), T0, T0 + HOUR).count == 0


def test_an_empty_or_reversed_range_answers_zero(store):
    assert summary(store, LATENCY, T0, T0).count == 0
    assert summary(store, LATENCY, T0 + HOUR, T0).count == 0
    assert buckets(store, LATENCY, T0 + HOUR, T0, 60) == []


# Sketch helpers ---------------------------------------------------------------------------------------------------

def test_merge_helpers_skip_empty_sketches_and_return_none_for_nothing(store):
    kll = kll_doubles_sketch(store.config.stream.kll_k)
    kll.update(3.0)
    hll = hll_sketch(store.config.stream.hll_lg_k)
    hll.update("ann")

    assert merge_kll([]) is None and merge_kll([b"", None]) is None
    assert merge_kll([b"", kll.serialize(), b""]).n == 1
    assert merge_hll([b""], store.config.stream.hll_lg_k) is None
    assert merge_hll([b"", hll.serialize_compact(), hll.serialize_compact()]).get_estimate() == pytest.approx(1.0)


def test_the_windows_of_many_series_from_one_query_are_each_series_buckets_at_its_window_length(store):
    # Given the hour's series of one name (two tag sets) and one with no windows at all, over a range that starts
    # and ends mid-minute and includes the noisy minutes around the hour,
    eu = SeriesKey("shop", "metric", "latency_ms", "region=eu")
    absent = SeriesKey("closed-shop", "metric", "latency_ms")
    start, end = T0 - 2 * MINUTE + 7 * SECOND, T0 + HOUR + 2 * MINUTE - 3 * SECOND
    with connect(store.config) as client:
        fetched = fetch_series_windows(client, "metric", "latency_ms", ["shop", "closed-shop"], 60, start, end)
        together = fetched.windows([LATENCY, eu, absent], quantiles=[0.5, 0.99])
        sketched = fetch_series_windows(client, "metric", "latency_ms", ["shop"], 60, start, end,
                                        value_sketches=True).windows([LATENCY], quantiles=[0.75])
    # each series gets exactly the buckets a query of its own gives, empty minutes (count 0) included;
    for series in (LATENCY, eu, absent):
        alone = buckets(store, series, start, end, 60, source_length_s=60, quantiles=[0.5, 0.99])
        assert [(w.end_ms, w.count, w.value_count, w.sum, w.min, w.max, w.quantiles, w.distinct_users,
                 w.distinct_devices, w.levels) for w in together[series]] == [
            (int(b.end.timestamp() * 1000), b.count, b.value_count, b.sum, b.min, b.max, b.quantiles, b.distinct_users,
             b.distinct_devices, b.levels) for b in alone], series
    assert len(together[absent]) == 62 and {b.count for b in together[absent]} == {0}   # the whole minutes in range
    # A rank the job does not store comes from each window's sketch, which must then be fetched.
    assert [b.quantiles for b in sketched[LATENCY]] == [
        b.quantiles for b in buckets(store, LATENCY, start, end, 60, source_length_s=60, quantiles=[0.75])]
    assert any(b.quantiles[0.75] is not None for b in sketched[LATENCY])
    with pytest.raises(ValueError, match="value sketches"):
        fetched.windows([LATENCY], quantiles=[0.75])
