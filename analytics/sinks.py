"""``foreachBatch`` writers from the stream job to ClickHouse (and the dead-letter topic).

Writes are idempotent, which with Spark's checkpoints gives an exactly-once effect: window rows are keyed by
(window, series) and versioned by the micro-batch id in a ReplacingMergeTree, dead letters are keyed by their
Kafka position. A micro-batch replayed after a crash rewrites identical rows and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics.windows import LEVEL_COLUMNS, QUANTILES
from eventide.config import Config
from store.client import connect

WINDOW_COLUMNS = (
    "window_kind", "window_length_ms", "window_start", "window_end", "app", "kind", "name", "series_tags",
    "event_count", "value_count", "sum", "min", "max", "mean", "rate", *QUANTILES,
    "distinct_users", "distinct_devices", "value_sketch", "users_sketch", "devices_sketch",
    *[f"level_{lvl}" for lvl in LEVEL_COLUMNS],
)
_SKETCHES = {"value_sketch", "users_sketch", "devices_sketch"}
DEAD_LETTER_COLUMNS = ("source_topic", "source_partition", "source_offset", "kafka_timestamp", "reason", "raw",
                       "raw_bytes", "detected_at")

BatchWriter = Callable[[DataFrame, int], None]


def _utc(ts: datetime) -> datetime:
    # Spark hands out naive datetimes in the session time zone, which the job pins to UTC.
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts


def window_writer(config: Config) -> BatchWriter:
    """Upsert the window rows a micro-batch changed; ``version`` = batch id orders corrections."""

    def write(batch: DataFrame, batch_id: int) -> None:
        rows = batch.collect()
        if not rows:
            return
        written_at = datetime.now(UTC)
        data = []
        for row in rows:
            values = []
            for col in WINDOW_COLUMNS:
                v = row[col]
                if col in _SKETCHES:
                    v = bytes(v) if v is not None else b""
                elif col in ("window_start", "window_end"):
                    v = _utc(v)
                values.append(v)
            data.append([*values, batch_id, written_at])
        with connect(config) as client:
            client.insert("window_aggregates", data, column_names=[*WINDOW_COLUMNS, "version", "written_at"])

    return write


def dead_letter_writer(config: Config) -> BatchWriter:
    """Store rejected records with their reason in ClickHouse and forward them to the dead-letter topic."""
    limit = config.envelope.max_record_bytes

    def write(batch: DataFrame, batch_id: int) -> None:
        batch = batch.persist()
        try:
            rows = batch.select(
                "topic", "partition", "offset", "kafka_timestamp", "reason",
                F.substring(F.coalesce(F.col("value").cast("string"), F.lit("")), 1, limit).alias("raw"),
                F.coalesce(F.octet_length("value"), F.lit(0)).alias("raw_bytes"),
            ).collect()
            if not rows:
                return
            detected_at = datetime.now(UTC)
            data = [[r.topic, r.partition, r.offset, _utc(r.kafka_timestamp), r.reason, r.raw, r.raw_bytes,
                     detected_at] for r in rows]
            with connect(config) as client:
                client.insert("dead_letters", data, column_names=list(DEAD_LETTER_COLUMNS))
            # The topic copy is at-least-once (a replayed batch is forwarded again); the table is the count.
            (batch.select(
                F.col("value"),
                F.array(
                    F.struct(F.lit("reason").alias("key"), F.encode("reason", "UTF-8").alias("value")),
                    F.struct(F.lit("source").alias("key"),
                             F.encode(F.format_string("%s/%d/%d", "topic", "partition", "offset"), "UTF-8")
                             .alias("value")),
                ).alias("headers"))
             .write.format("kafka")
             .option("kafka.bootstrap.servers", config.kafka.bootstrap)
             .option("topic", config.kafka.dead_letter_topic)
             .option("includeHeaders", "true")
             .save())
        finally:
            batch.unpersist()

    return write
