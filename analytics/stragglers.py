"""Exact count of tumbling and hopping stragglers (BRIEF §3), done in the job beside the aggregation.

Spark drops a contribution whose window the watermark already closed without saying which events it dropped
(``numRowsDroppedByWatermark`` counts partially aggregated rows). So for every micro-batch of the ``windows``
query, its ``foreachBatch`` reads the batch's own Kafka offset range again (official connector, batch mode) and
applies the same rule Spark applied, with the same watermark: an accepted event's contribution to a window is
dropped iff ``window_end <= watermark``. The window assignment is the aggregation's own
(``windows.window_assignments``), so both agree by construction.

The late events whose window was still open are the **corrections**: the same pass counts them per window.

Only events older than the watermark can be late, so records are first screened on three fields
(``json_tuple``, cheap); only those candidates go through full validation.
"""

from __future__ import annotations

import json

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analytics import envelope
from analytics.progress import BatchInfo
from analytics.windows import SERIES, event_time_ms, window_assignments, window_specs
from eventide.config import Config

STRAGGLER_COLUMNS = (
    "window_kind", "window_length_ms", "window_hop_ms", "app", "kind", "name", "series_tags", "window_start",
    "window_end", "source_partition", "source_offset", "event_id", "device", "corrected_event_time", "watermark",
    "lateness_ms",
)


CORRECTION_KEY = ("window_kind", "window_length_ms", "window_hop_ms", *SERIES, "window_start", "window_end")
CORRECTION_COLUMNS = (*CORRECTION_KEY, "late_events", "max_lateness_ms")


def batch_records(spark: SparkSession, config: Config, info: BatchInfo) -> DataFrame:
    """The Kafka records of one micro-batch, read again in batch mode."""
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", config.kafka.bootstrap)
        .option("subscribe", config.kafka.events_topic)
        .option("startingOffsets", json.dumps(info.start_offsets))
        .option("endingOffsets", json.dumps(info.end_offsets))
        # Same records as the streaming read: aborted gateway transactions stay invisible.
        .option("kafka.isolation.level", "read_committed")
        .option("failOnDataLoss", "false")
        .load()
    )


def _maybe_older_than(records: DataFrame, watermark_ms: int) -> DataFrame:
    """Records whose corrected event time may be behind the watermark (a superset of the late valid ones)."""
    fields = records.select("*", F.json_tuple(F.col("value").cast("string"), "event_time", "sent_time",
                                              "received_time").alias("_et", "_st", "_rt"))
    received = F.coalesce(F.col("_rt").cast("long"), F.unix_millis("timestamp"))
    corrected = F.col("_et").cast("long") + received - F.col("_st").cast("long")
    return fields.where(corrected < watermark_ms).drop("_et", "_st", "_rt")


def late_contributions(spark: SparkSession, config: Config, info: BatchInfo) -> DataFrame:
    """Every contribution (event, window) of the batch's late events (corrected time behind the watermark), with
    ``dropped``: True when Spark dropped it (window already closed), False when it corrected an open window."""
    wm = info.watermark_ms
    candidates = _maybe_older_than(batch_records(spark, config, info), wm)
    events = envelope.accepted(envelope.parse(candidates, config))
    contributions = events.where(event_time_ms() < wm).select("*", F.inline(window_assignments(window_specs(config))))
    return contributions.select(
        "window_kind", "window_length_ms", "window_hop_ms", *SERIES,
        F.timestamp_millis("window_start_ms").alias("window_start"),
        F.timestamp_millis("window_end_ms").alias("window_end"),
        F.col("partition").alias("source_partition"), F.col("offset").alias("source_offset"),
        F.col("id").alias("event_id"), "device", "corrected_event_time",
        F.timestamp_millis(F.lit(wm)).alias("watermark"),
        (F.lit(wm) - event_time_ms()).alias("lateness_ms"),
        (F.col("window_end_ms") <= wm).alias("dropped"),
    )


def stragglers(late: DataFrame) -> DataFrame:
    """One row per dropped contribution, with its lateness."""
    return late.where("dropped").select(*STRAGGLER_COLUMNS)


def corrections(late: DataFrame) -> DataFrame:
    """Per open window the late events corrected: how many, and the latest of them."""
    return late.where(~F.col("dropped")).groupBy(*CORRECTION_KEY).agg(
        F.count(F.lit(1)).alias("late_events"), F.max("lateness_ms").alias("max_lateness_ms"))
