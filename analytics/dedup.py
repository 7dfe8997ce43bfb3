"""Deduplication by event id (docs/time-semantics.md, "Duplicates"), before any window sees an event.

The first copy of an id is accepted: earliest on the broker's clock (Kafka timestamp), ties broken by Kafka
position, so every replay of a micro-batch picks the same copy. A later copy is a duplicate when its id is among
the batch's earlier copies or among the events accepted within the horizon before it; the accepted-events log
(``analytics.accepted_log``) is that memory, so it survives restarts with nothing else to checkpoint.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from analytics import accepted_log
from analytics.accepted_log import BatchMeta
from eventide.config import Config

POSITION = ("partition", "offset")


def horizon(config: Config, batch_id: int, earliest_ms: int) -> list[BatchMeta]:
    """The published batches a batch is checked against: every earlier one holding an event that reached the
    broker within the horizon before the batch's earliest event."""
    cutoff = earliest_ms - config.stream.dedup_horizon_ms
    return [m for m in accepted_log.metas(config) if m.batch_id < batch_id and m.last_timestamp_ms >= cutoff]


def remembered_ids(spark: SparkSession, config: Config, schema: StructType, batches: list[BatchMeta]) -> DataFrame:
    files = [str(accepted_log.events_file(config, m.batch_id)) for m in batches]
    return accepted_log.read_batches(spark, schema, files).select("id")


def first_copies(valid: DataFrame, remembered: DataFrame) -> DataFrame:
    """The valid events that are the first copy of their id (same columns as ``valid``)."""
    order = Window.partitionBy("id").orderBy("kafka_timestamp", *POSITION)
    firsts = valid.withColumn("_copy", F.row_number().over(order)).where(F.col("_copy") == 1).drop("_copy")
    # Only the batch's ids are looked up in the (much larger) memory of earlier batches.
    seen = remembered.join(F.broadcast(firsts.select("id")), "id", "left_semi")
    return firsts.join(seen, "id", "left_anti").select(*valid.columns)


def duplicates(valid: DataFrame, accepted: DataFrame) -> DataFrame:
    """The valid events of a batch that were not accepted: the duplicates."""
    return valid.join(accepted.select(*POSITION), list(POSITION), "left_anti")
