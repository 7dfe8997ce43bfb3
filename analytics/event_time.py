"""Event time under the watermark, as the stateful queries declare it in Spark (BRIEF §3)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from eventide.config import Config

# Column metadata key Spark's withWatermark/window() put on event-time columns (EventTimeWatermark.delayKey).
WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"


def with_watermark(events: DataFrame, config: Config) -> DataFrame:
    """watermark = max corrected_event_time of earlier micro-batches - allowed lateness (Spark semantics)."""
    return events.withWatermark("corrected_event_time", f"{watermark_delay_ms(config)} milliseconds")


def watermark_delay_ms(config: Config) -> int:
    return int(config.stream.allowed_lateness_s * 1000)


def event_time_ms() -> Column:
    return F.unix_millis("corrected_event_time")
