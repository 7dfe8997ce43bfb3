"""Tumbling and hopping window aggregates over accepted events (shared BRIEF §2), declared as one Spark query.

All windows use ``corrected_event_time`` under a watermark of ``stream.allowed_lateness_s``. Tumbling windows of
length L are ``[⌊t/L⌋·L, ⌊t/L⌋·L + L)`` aligned to the epoch; hopping windows of length L and hop H are every
``[kH, kH + L)`` containing t. A window is written whenever a micro-batch changes it (update mode), so late events
that arrive while the window is still open publish a correction; Spark drops contributions to windows the
watermark has already closed.
"""

from __future__ import annotations

import functools

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analytics.event_time import WATERMARK_DELAY_KEY, event_time_ms, watermark_delay_ms, with_watermark
from analytics.vocabulary import BUCKET_START, LEVEL_FIELDS, QUANTILES, SERIES, WindowSpec, window_specs
from eventide.config import Config


def _windows_of(spec: WindowSpec, t: Column) -> list[Column]:
    newest = F.floor(t / spec.hop_ms) * spec.hop_ms
    # One struct per k written out (k = 0 .. L/H - 1), not a sequence mapped by a lambda: Spark generates code
    # for literal arrays of structs, while higher-order functions (and the generator over them) run interpreted,
    # per event (docs/performance.md#spark-and-jvm-settings).
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


def aggregate(partials: DataFrame, config: Config) -> DataFrame:
    """Per (window, series) of every tumbling and hopping spec: count, sum, min, max, mean, rate, quantiles,
    distinct users/devices and log levels. The KLL and HLL sketch bytes are kept so any range can later be
    answered by merging them.

    Reads the window partials (``analytics.windows.partials``: each accept batch's events aggregated per series and
    grain bucket); each partial is expanded into its bucket's windows and one aggregation merges them all.
    ``window_end`` carries the event-time watermark marker (the column metadata ``window()`` itself would carry),
    so Spark applies its window rule to it: a window is evicted once the watermark reaches its end, and a
    contribution arriving after that is dropped (``analytics.windows.stragglers`` counts those).
    """
    expand, window_end, group, aggregates, result = _aggregation_columns(
        tuple(window_specs(config)), config.stream.kll_k, watermark_delay_ms(config))
    expanded = with_watermark(partials, config).select(F.col("*"), expand).select(F.col("*"), window_end)
    return expanded.groupBy(*group).agg(*aggregates).select(*result)


@functools.cache
def _aggregation_columns(specs: tuple[WindowSpec, ...], kll_k: int, watermark_delay: int) -> tuple[
        Column, Column, tuple[Column, ...], tuple[Column, ...], tuple[Column, ...]]:
    """The columns of :func:`aggregate`'s projections, grouping and aggregates, built once per process and settings:
    built anew they cost thousands of calls into Spark's JVM at every start of the query
    (docs/performance.md#query-columns-built-once-per-process).
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
