"""Tumbling and hopping window aggregates over accepted events (shared BRIEF §2), declared as one Spark query.

All windows use ``corrected_event_time`` under a watermark of ``stream.allowed_lateness_s``. Tumbling windows of
length L are ``[⌊t/L⌋·L, ⌊t/L⌋·L + L)`` aligned to the epoch; hopping windows of length L and hop H are every
``[kH, kH + L)`` containing t. A window is written whenever a micro-batch changes it (update mode), so late events
that arrive while the window is still open publish a correction; Spark drops contributions to windows the
watermark has already closed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from eventide.config import Config
from ingest.envelope import LEVELS

QUANTILES: dict[str, float] = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p999": 0.999}
SERIES = ("app", "kind", "name", "series_tags")
LEVEL_COLUMNS = LEVELS   # one count column per log level
LEVEL_FIELDS = tuple(f"level_{lvl}" for lvl in LEVEL_COLUMNS)
# Column metadata key Spark's withWatermark/window() put on event-time columns (EventTimeWatermark.delayKey).
WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"
WINDOWS_QUERY = "windows"
BUCKET_START = "bucket_start_ms"   # a window partial's bucket (analytics.window_partials)


@dataclass(frozen=True)
class WindowSpec:
    """One epoch-aligned windowing: windows ``[kH, kH + L)``; tumbling when the hop H equals the length L."""

    kind: str
    length_s: int
    hop_s: int

    @property
    def length_ms(self) -> int:
        return self.length_s * 1000

    @property
    def hop_ms(self) -> int:
        return self.hop_s * 1000


def window_specs(config: Config) -> list[WindowSpec]:
    """Every tumbling and hopping windowing the job computes (all in one query, ``windows``)."""
    return ([WindowSpec("tumbling", n, n) for n in config.stream.tumbling_windows_s]
            + [WindowSpec("hopping", w.length_s, w.hop_s) for w in config.stream.hopping_windows])


def with_watermark(events: DataFrame, config: Config) -> DataFrame:
    """watermark = max corrected_event_time of earlier micro-batches - allowed lateness (Spark semantics)."""
    return events.withWatermark("corrected_event_time", f"{watermark_delay_ms(config)} milliseconds")


def watermark_delay_ms(config: Config) -> int:
    return int(config.stream.allowed_lateness_s * 1000)


def event_time_ms() -> Column:
    return F.unix_millis("corrected_event_time")


def _windows_of(spec: WindowSpec, t: Column) -> list[Column]:
    newest = F.floor(t / spec.hop_ms) * spec.hop_ms
    # One struct per k written out (k = 0 .. L/H - 1), not a sequence mapped by a lambda: Spark generates code
    # for literal arrays of structs, while higher-order functions (and the generator over them) run interpreted,
    # which cost about a quarter of the aggregation's executor time (docs/benchmarks.md).
    return [F.struct(
        F.lit(spec.kind).alias("window_kind"),
        F.lit(spec.length_ms).cast("long").alias("window_length_ms"),
        F.lit(spec.hop_ms).cast("long").alias("window_hop_ms"),
        (newest - k * spec.hop_ms).cast("long").alias("window_start_ms"),
        (newest - k * spec.hop_ms + spec.length_ms).cast("long").alias("window_end_ms"),
    ) for k in range(spec.length_s // spec.hop_s)]


def window_assignments(specs: list[WindowSpec], t: Column | None = None) -> Column:
    """An array with one (window_kind, window_length_ms, window_hop_ms, window_start_ms, window_end_ms) struct
    per window of every spec that contains time ``t`` (epoch ms; default the event's corrected time):
    ``kH <= t < kH + L``, i.e. L/H windows per hopping spec.

    The aggregation assigns each window partial's bucket start (whose windows are its events'), and the straggler
    count assigns late events in the driver by the same rule (``assign_windows``).
    """
    t = event_time_ms() if t is None else t
    return F.array(*[window for spec in specs for window in _windows_of(spec, t)])


ARROW_TIME = pa.timestamp("us", tz="UTC")
"""Spark's timestamps as they reach the driver in Arrow."""


def epoch_ms(times: pa.ChunkedArray | pa.Array, null_ms: int | None = None) -> np.ndarray:
    """Timestamps as integer ms since the epoch, floored as Spark's ``unix_millis`` (``null_ms`` for nulls)."""
    micros = times.cast(ARROW_TIME).cast(pa.int64())
    if null_ms is not None:
        micros = micros.fill_null(null_ms * 1000)
    return np.floor_divide(np.asarray(micros, dtype=np.int64), 1000)


def assign_windows(specs: list[WindowSpec], event_ms: np.ndarray) -> pa.Table:
    """:func:`window_assignments` for events already in the driver (epoch ms): one row per (event, window), in
    the same order, with ``event`` the index of the event in ``event_ms``.

    The late pass of the ``windows`` query needs the windows of a few late events per micro-batch; a Spark job for
    them costs more than the whole computation here. Spark floors ``t / H`` in double precision, numpy floors in
    integers: the same window for any epoch-ms time (tests/test_window_assignment.py checks both agree).
    """
    t = np.asarray(event_ms, dtype=np.int64)
    windows = [(spec, k) for spec in specs for k in range(spec.length_s // spec.hop_s)]
    newest = {spec: np.floor_divide(t, spec.hop_ms) * spec.hop_ms for spec in specs}
    starts = (np.column_stack([newest[spec] - k * spec.hop_ms for spec, k in windows]).ravel()
              if len(t) and windows else np.empty(0, dtype=np.int64))
    lengths = np.tile(np.array([spec.length_ms for spec, _ in windows], dtype=np.int64), len(t))
    return pa.table({
        "event": np.repeat(np.arange(len(t), dtype=np.int64), len(windows)),
        "window_kind": pa.array(np.tile(np.array([spec.kind for spec, _ in windows], dtype=object), len(t)),
                                pa.string()),
        "window_length_ms": lengths,
        "window_hop_ms": np.tile(np.array([spec.hop_ms for spec, _ in windows], dtype=np.int64), len(t)),
        "window_start_ms": starts,
        "window_end_ms": starts + lengths,
    })


def aggregate(partials: DataFrame, config: Config) -> DataFrame:
    """Per (window, series) of every tumbling and hopping spec: count, sum, min, max, mean, rate, quantiles,
    distinct users/devices and log levels. The KLL and HLL sketch bytes are kept so any range can later be
    answered by merging them.

    Reads the window partials (``analytics.window_partials``: each accept batch's events aggregated per series and
    grain bucket); each partial is expanded into its bucket's windows and one aggregation merges them all.
    ``window_end`` carries the event-time watermark marker (the column metadata ``window()`` itself would carry),
    so Spark applies its window rule to it: a window is evicted once the watermark reaches its end, and a
    contribution arriving after that is dropped (``analytics.stragglers`` counts those).
    """
    expand, window_end, group, aggregates, result = _aggregation_columns(
        tuple(window_specs(config)), config.stream.kll_k, watermark_delay_ms(config))
    expanded = with_watermark(partials, config).select(F.col("*"), expand).select(F.col("*"), window_end)
    return expanded.groupBy(*group).agg(*aggregates).select(*result)


@functools.cache
def _aggregation_columns(specs: tuple[WindowSpec, ...], kll_k: int, watermark_delay: int) -> tuple[
        Column, Column, tuple[Column, ...], tuple[Column, ...], tuple[Column, ...]]:
    """The columns of :func:`aggregate`'s projections, grouping and aggregates, built once per process and settings:
    built anew they took ~0.2-0.3 s of calls into Spark's JVM at every start of the query (docs/benchmarks.md).
    Columns are unresolved expressions, valid for any DataFrame and session of the JVM."""
    expand = F.inline(window_assignments(list(specs), F.col(BUCKET_START)))
    marker = {WATERMARK_DELAY_KEY: watermark_delay}
    window_end = F.timestamp_millis("window_end_ms").alias("window_end", metadata=marker)
    group = tuple(F.col(c) for c in ("window_kind", "window_length_ms", "window_hop_ms", "window_start_ms",
                                      "window_end", *SERIES))
    aggregates = (
        F.sum("event_count").alias("event_count"),
        F.sum("value_count").alias("value_count"),
        F.coalesce(F.sum("sum"), F.lit(0.0)).alias("sum"),
        F.min("min").alias("min"),
        F.max("max").alias("max"),
        F.expr(f"kll_merge_agg_double(value_sketch, {kll_k})").alias("value_sketch"),
        F.expr("hll_union_agg(users_sketch)").alias("users_sketch"),
        F.expr("hll_union_agg(devices_sketch)").alias("devices_sketch"),
        *[F.sum(field).alias(field) for field in LEVEL_FIELDS],
    )
    ranks = ", ".join(str(q) for q in QUANTILES.values())
    has_values = F.col("value_count") > 0
    quantiles = F.when(has_values, F.expr(f"kll_sketch_get_quantile_double(value_sketch, array({ranks}))"))
    result = tuple(F.col(c) if isinstance(c, str) else c for c in (
        "window_kind", "window_length_ms", "window_hop_ms",
        F.timestamp_millis("window_start_ms").alias("window_start"),
        "window_end",
        *SERIES,
        "event_count", "value_count", "sum", "min", "max",
        F.when(has_values, F.col("sum") / F.col("value_count")).alias("mean"),
        (F.col("event_count") * 1000.0 / F.col("window_length_ms")).alias("rate"),
        *[quantiles[i].alias(name) for i, name in enumerate(QUANTILES)],
        F.expr("hll_sketch_estimate(users_sketch)").alias("distinct_users"),
        F.expr("hll_sketch_estimate(devices_sketch)").alias("distinct_devices"),
        F.when(has_values, F.col("value_sketch")).alias("value_sketch"),
        "users_sketch", "devices_sketch",
        *LEVEL_FIELDS,
    ))
    return expand, window_end, group, aggregates, result
