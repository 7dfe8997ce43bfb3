"""Event-time window aggregates over accepted events (shared BRIEF §2), declared as Spark queries.

All windows use ``corrected_event_time`` under a watermark of ``stream.allowed_lateness_s``. Tumbling windows of
length L are ``[⌊t/L⌋·L, ⌊t/L⌋·L + L)`` aligned to the epoch, which is exactly Spark's ``window(t, L)``.
A window is written whenever a micro-batch changes it (update mode), so late events that arrive while the window
is still open publish a correction; Spark drops contributions to windows the watermark has already closed.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from eventide.config import Config

QUANTILES: dict[str, float] = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p999": 0.999}
SERIES = ("app", "kind", "name", "series_tags")
LEVEL_COLUMNS = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True)
class WindowSpec:
    """One windowing of the event stream; each becomes one streaming query and its own checkpoint."""

    kind: str
    length_s: int

    @property
    def query_name(self) -> str:
        return f"{self.kind}_{self.length_s}s"


def window_specs(config: Config) -> list[WindowSpec]:
    return [WindowSpec("tumbling", n) for n in config.stream.tumbling_windows_s]


def with_watermark(events: DataFrame, config: Config) -> DataFrame:
    """watermark = max corrected_event_time of earlier micro-batches - allowed lateness (Spark semantics)."""
    return events.withWatermark("corrected_event_time", f"{int(config.stream.allowed_lateness_s * 1000)} milliseconds")


def aggregate(events: DataFrame, spec: WindowSpec, config: Config) -> DataFrame:
    """Per (window, series): count, sum, min, max, mean, rate, quantiles, distinct users/devices, log levels.

    The KLL and HLL sketch bytes are kept so any range can later be answered by merging them.
    """
    k, lg_k = config.stream.kll_k, config.stream.hll_lg_k
    value = F.col("metric_value")
    grouped = with_watermark(events, config).groupBy(
        F.window("corrected_event_time", f"{spec.length_s} seconds").alias("window"), *SERIES)
    aggregated = grouped.agg(
        F.count(F.lit(1)).alias("event_count"),
        F.count(value).alias("value_count"),
        F.coalesce(F.sum(value), F.lit(0.0)).alias("sum"),
        F.min(value).alias("min"),
        F.max(value).alias("max"),
        F.expr(f"kll_sketch_agg_double(metric_value, {k})").alias("value_sketch"),
        F.expr(f"hll_sketch_agg(user, {lg_k})").alias("users_sketch"),
        F.expr(f"hll_sketch_agg(device, {lg_k})").alias("devices_sketch"),
        *[F.count_if(F.col("level") == lvl).alias(f"level_{lvl}") for lvl in LEVEL_COLUMNS],
    )
    ranks = ", ".join(str(q) for q in QUANTILES.values())
    has_values = F.col("value_count") > 0
    quantiles = F.when(has_values, F.expr(f"kll_sketch_get_quantile_double(value_sketch, array({ranks}))"))
    return aggregated.select(
        F.lit(spec.kind).alias("window_kind"),
        F.lit(spec.length_s * 1000).cast("long").alias("window_length_ms"),
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        *SERIES,
        "event_count", "value_count", "sum", "min", "max",
        F.when(has_values, F.col("sum") / F.col("value_count")).alias("mean"),
        (F.col("event_count") / F.lit(float(spec.length_s))).alias("rate"),
        *[quantiles[i].alias(name) for i, name in enumerate(QUANTILES)],
        F.expr("hll_sketch_estimate(users_sketch)").alias("distinct_users"),
        F.expr("hll_sketch_estimate(devices_sketch)").alias("distinct_devices"),
        F.when(has_values, F.col("value_sketch")).alias("value_sketch"),
        "users_sketch", "devices_sketch",
        *[f"level_{lvl}" for lvl in LEVEL_COLUMNS],
    )
