"""Records Kafka deleted (retention) before the job read them: counted in ``kafka_data_loss`` rather than left to
Spark's log line (``failOnDataLoss=false``: they are gone whether the job stops or not; docs/operations.md,
"Retention and lag")."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics import sinks
from analytics.spark.checkpoint import batch_info as checkpoint_info
from analytics.vocabulary import ACCEPT_QUERY
from eventide.config import Config

log = logging.getLogger(__name__)


def count_data_loss(config: Config, checkpoint: Path, writer: sinks.BatchWriter) -> sinks.BatchWriter:
    """``writer`` (the ``accept`` query's), first recording in ``kafka_data_loss`` any offsets of the batch's range
    that Kafka deleted before the batch read them.

    A partition's range [start, end) is from the query's offset log. Only when the partition's earliest offset
    (asked of the broker, one request per batch) is past ``start`` can records be missing; then the batch's first
    offset read in that partition (one small Spark job, only then) says where reading resumed: the offsets before
    it and before the earliest one were never read. Keyed by (topic, partition, start): a replayed batch rewrites
    its row."""
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
    topic = config.kafka.events_topic

    def write(records: DataFrame, batch_id: int) -> None:
        info = checkpoint_info(checkpoint, batch_id)
        starts = {int(p): int(o) for p, o in info.start_offsets.get(topic, {}).items() if int(o) >= 0}
        ends = info.end_offsets.get(topic, {})
        earliest = _earliest_offsets(admin, topic, list(starts), batch_id) if starts else {}
        if earliest:
            behind = [p for p, start in starts.items() if earliest.get(p, start) > start]
            if behind:
                first_read = dict(records.where(F.col("partition").isin(behind)).groupBy("partition")
                                  .agg(F.min("offset")).collect())
                gaps = []
                for p in behind:
                    resumed = min(earliest[p], first_read.get(p, int(ends.get(str(p), earliest[p]))))
                    if resumed > starts[p]:
                        gaps.append((p, starts[p], resumed))
                if gaps:
                    _record_data_loss(config, topic, batch_id, gaps)
        writer(records, batch_id)
    return write


def _earliest_offsets(admin: AdminClient, topic: str, partitions: list[int], batch_id: int) -> dict[int, int]:
    """Each partition's earliest offset; {} (the check skipped for this batch, with a warning) when the brokers do
    not answer in time: a broker being replaced must not fail a batch that has already read its records."""
    try:
        futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.earliest() for p in partitions},
                                     request_timeout=10)
        return {tp.partition: future.result(timeout=15).offset for tp, future in futures.items()}
    except Exception as exc:   # any client error: the batch goes on, unchecked
        log.warning("accept batch %d: could not ask the brokers for %s's earliest offsets (%s); this batch is not "
                    "checked for records deleted before it read them", batch_id, topic, exc)
        return {}


def _record_data_loss(config: Config, topic: str, batch_id: int, gaps: list[tuple[int, int, int]]) -> None:
    for partition, start, resumed in gaps:
        log.error("accept batch %d: %d offsets of %s partition %d (%d to %d) were deleted by Kafka's retention "
                  "before the job read them; recorded in kafka_data_loss", batch_id, resumed - start, topic,
                  partition, start, resumed - 1)
    now = datetime.now(UTC)
    sinks.insert_tables(config, [("kafka_data_loss", pa.table({
        "topic": [topic] * len(gaps), "partition": pa.array([g[0] for g in gaps], pa.int32()),
        "from_offset": [g[1] for g in gaps], "to_offset": [g[2] for g in gaps],
        "skipped_offsets": pa.array([g[2] - g[1] for g in gaps], pa.uint64()),
        "query_name": [ACCEPT_QUERY] * len(gaps), "batch_id": pa.array([batch_id] * len(gaps), pa.uint64()),
        "detected_at": pa.array([now] * len(gaps), pa.timestamp("ms", tz="UTC"))}))], ACCEPT_QUERY)
