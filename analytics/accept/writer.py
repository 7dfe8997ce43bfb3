"""The ``accept`` query's writer: from each batch of Kafka records, the first copies published to the accepted-events
log (read by the stateful queries) with their window partials, and stored: log lines, duplicates, rejected records
(also forwarded to the dead-letter topic), each device's clock offsets and the dedup state."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics import accepted_log
from analytics.accept import dedup, validation
from analytics.checkpoint import batch_info
from analytics.keyed import rows as keyed_rows
from analytics.keyed import runs as session_runs
from analytics.sinks import BatchWriter, insert_tables, timed, with_constants
from analytics.vocabulary import ACCEPT_QUERY, KEYED_WINDOWS_QUERY, WINDOWS_QUERY
from analytics.windows import partials as window_partials
from eventide.config import Config

DUPLICATE_COLUMNS = ("source_topic", "source_partition", "source_offset", "kafka_timestamp", "event_id", "app",
                     "device")
DEAD_LETTER_COLUMNS = ("source_topic", "source_partition", "source_offset", "kafka_timestamp", "reason", "raw",
                       "raw_bytes")


def accept_writer(config: Config) -> BatchWriter:
    """The ``accept`` query's batch: publish its first copies to the accepted-events log (read by the stateful
    queries), store its log lines, duplicates, rejected records (also forwarded to the dead-letter topic), each
    device's clock offsets and the dedup state.

    Every Spark job costs a fixed overhead per micro-batch (at a few thousand events per batch, most of the
    batch), so the batch runs one: it brings every record to the driver as Arrow, the accepted columns of a valid
    record and the dead-letter columns of a rejected one. Everything else (first copies, the accepted-events file,
    clock offsets, dead letters and their topic copies) is computed and written from that table."""
    limit = config.envelope.max_record_bytes
    readers = [config.checkpoint_dir / q for q in (WINDOWS_QUERY, KEYED_WINDOWS_QUERY)]
    accepted_ids = dedup.AcceptedIds(config)
    dead_letter_topic = _DeadLetterTopic(config)

    def write(records: DataFrame, batch_id: int) -> None:
        spark = records.sparkSession
        accepted_columns = validation.accepted_schema(spark, config).fieldNames()
        now = datetime.now(UTC)
        with timed(ACCEPT_QUERY, "validate"):
            batch = accept_projection(records, accepted_columns, limit).toArrow()
        with timed(ACCEPT_QUERY, "split"):
            # Each part filters only the columns it reads; the accepted columns are filtered once, by first copy.
            valid = pc.is_null(batch["reason"]).to_numpy(zero_copy_only=False)
            candidates = batch.select(list(dedup.COPY_COLUMNS)).filter(pa.array(valid))
            rejected = batch.select(list(_REJECTED_COLUMNS)).filter(pa.array(~valid))
        memory: list[accepted_log.BatchMeta] = []
        accepted = batch.select(accepted_columns).slice(0, 0)
        rows: list[tuple[str, pa.Table]] = []
        if candidates.num_rows:
            span = pc.min_max(candidates["kafka_timestamp"]).as_py()
            earliest, latest = _epoch_ms(span["min"]), _epoch_ms(span["max"])
            memory = dedup.horizon(config, batch_id, earliest) if config.stream.deduplicate else []
            with timed(ACCEPT_QUERY, "dedup"):
                replay = accepted_log.published(config, batch_id)
                if replay:   # its file says what was accepted
                    first = dedup.published_copies(candidates, str(accepted_log.events_file(config, batch_id)))
                elif config.stream.deduplicate:
                    first = dedup.first_copies(candidates, accepted_ids.of(memory))
                else:
                    first = pa.array(np.ones(candidates.num_rows, dtype=bool))
                kept = np.zeros(batch.num_rows, dtype=bool)   # the batch's rows that are first copies
                kept[valid] = first.to_numpy(zero_copy_only=False)
                accepted = batch.select(accepted_columns).filter(pa.array(kept))
                copies = batch.select(list(_COPY_SOURCE)).filter(pa.array(valid & ~kept))
            with timed(ACCEPT_QUERY, "events_file"):
                if not replay:
                    info = batch_info(config.checkpoint_dir / ACCEPT_QUERY, batch_id)
                    # Session runs are marked here, where the whole batch is at hand (analytics.keyed.runs).
                    # So are the rows keyed_windows reads, written first (analytics.keyed.rows).
                    published = keyed_rows.row_groups(
                        session_runs.with_runs(accepted, config.stream.session_gap_s * 1000), config)
                    accepted_log.publish(config, published, accepted_log.BatchMeta(
                        batch_id, info.start_offsets, info.end_offsets, earliest, latest))
                if config.stream.deduplicate:
                    accepted_ids.remember(batch_id, accepted)
            # After the events file: the windows writer reads the events of the partials it merged.
            with timed(ACCEPT_QUERY, "window_partials"):
                window_partials.publish(config, batch_id, accepted)
            with timed(ACCEPT_QUERY, "log_lines"):
                rows.append(("logs", log_lines(batch, kept)))
            if copies.num_rows:
                rows.append(("duplicates", with_constants(copies.rename_columns(list(DUPLICATE_COLUMNS)),
                                                           batch_id=batch_id, detected_at=now)))
        rows.append(("device_clocks", with_constants(_clock_offsets(accepted),
                                                      batch_id=batch_id, recorded_at=now)))
        if rejected.num_rows:
            rows.append(("dead_letters", with_constants(rejected.select(
                [*_KAFKA_COORDINATES, "reason", "raw", "raw_bytes"]).rename_columns(
                list(DEAD_LETTER_COLUMNS)), detected_at=now)))
        rows.append(("dedup_state", pa.table({
            "batch_id": [batch_id], "horizon_ms": [config.stream.dedup_horizon_ms],
            "horizon_ids": [sum(m.events for m in memory)],
            "horizon_bytes": [sum(m.size_bytes for m in memory)],
            "horizon_memory_bytes": [accepted_ids.nbytes(memory)],
            "accepted": [accepted.num_rows], "duplicates": [candidates.num_rows - accepted.num_rows],
            "dead_letters": [rejected.num_rows], "recorded_at": [now]})))
        insert_tables(config, rows, ACCEPT_QUERY)
        if rejected.num_rows:
            # The topic copy is at-least-once (a replayed batch is forwarded again); the table is the count.
            with timed(ACCEPT_QUERY, "dead_letter_topic"):
                dead_letter_topic.forward(rejected)
        with timed(ACCEPT_QUERY, "expire"):
            accepted_log.expire(config, readers, int(now.timestamp() * 1000))

    return write


_KAFKA_COORDINATES = ("topic", "partition", "offset", "kafka_timestamp")
_REJECTED_COLUMNS = (*_KAFKA_COORDINATES, "reason", "raw", "raw_bytes", "value")   # dead letters, their topic copy
_COPY_SOURCE = (*_KAFKA_COORDINATES, "id", "app", "device")                         # -> DUPLICATE_COLUMNS


def accept_projection(records: DataFrame, accepted_columns: list[str], limit: int) -> DataFrame:
    """What ``accept`` brings to the driver per record (``validation.parse``'s rows): the accepted columns of a valid
    record and, for a log, its message; the Kafka coordinates, reason and raw bytes of a rejected one."""
    rejected_only = F.col("dead_letter_reason").isNotNull()
    return records.select(
        # A rejected record's envelope fields are never computed, only its Kafka coordinates.
        *[F.col(c) if c in _KAFKA_COORDINATES else F.when(~rejected_only, F.col(c)).alias(c)
          for c in accepted_columns],
        F.when(~rejected_only & (F.col("kind") == "log"), F.col("message")).alias("message"),
        F.col("dead_letter_reason").alias("reason"),
        # Raw bytes travel for rejected records only.
        F.when(rejected_only, F.col("value")).alias("value"),
        F.when(rejected_only, F.substring(F.coalesce(F.col("value").cast("string"), F.lit("")), 1, limit))
        .alias("raw"),
        F.when(rejected_only, F.coalesce(F.octet_length("value"), F.lit(0))).alias("raw_bytes"),
    )


def log_lines(batch: pa.Table, kept: np.ndarray) -> pa.Table:
    """The ``logs`` table's rows (sql/0013_logs.sql) of the batch's first copies (``kept``) that are logs.

    One block, and nothing in it from the wall clock: a replayed batch (the same first copies, in the same order)
    sends the very same block, which the table's insert deduplication drops (sql/0013_logs.sql)."""
    is_log = pc.equal(batch["kind"], "log").to_numpy(zero_copy_only=False)
    lines = batch.filter(pa.array(kept & np.asarray(is_log, dtype=bool))).combine_chunks()
    tags = lines["tags"].combine_chunks() if lines.num_rows else pa.array([], lines.schema.field("tags").type)
    return pa.table({
        "corrected_event_time": lines["corrected_event_time"],
        "event_time": pc.cast(lines["event_time"], pa.timestamp("ms", tz="UTC")),
        "received_time": pc.cast(lines["received_time"], pa.timestamp("ms", tz="UTC")),
        **{c: lines[c] for c in ("app", "level", "name", "device")},
        "user": pc.fill_null(lines["user"], ""),
        "message": lines["message"],
        # An event without tags has a null map; the column holds an empty one.
        "tags": pa.MapArray.from_arrays(tags.offsets, tags.keys, tags.items),
        "event_id": lines["id"], "source_partition": lines["partition"], "source_offset": lines["offset"],
    })


class _DeadLetterTopic:
    """A copy of each rejected record on the dead-letter topic, its reason and source in headers; one producer
    for the life of the query.

    The producer is created with the writer, not at the first rejected record: an idempotent producer first
    obtains its producer id from the broker, a round of requests before its first delivery
    (docs/performance.md#arrows-allocator-and-the-dead-letter-producer),
    and that wait then held up the batch. Created at the query's start, it connects while Spark runs the first
    batch."""

    def __init__(self, config: Config) -> None:
        self._topic = config.kafka.dead_letter_topic
        self._producer = Producer({"bootstrap.servers": config.kafka.bootstrap, "acks": "all",
                                   "enable.idempotence": True})

    def forward(self, rejected: pa.Table) -> None:
        """Send ``rejected`` (columns topic, partition, offset, reason, value) and wait until the broker has every
        copy; raise if it refused one (Spark then retries the batch)."""
        topic, failures = self._topic, []
        for source_topic, partition, offset, reason, value in zip(
                *(rejected[c].to_pylist() for c in ("topic", "partition", "offset", "reason", "value")),
                strict=True):
            self._producer.produce(
                topic, value, headers=[("reason", reason.encode()),
                                       ("source", f"{source_topic}/{partition}/{offset}".encode())],
                on_delivery=lambda err, _msg: failures.append(str(err)) if err else None)
            self._producer.poll(0)
        self._producer.flush()   # returns once each copy is delivered or failed (the producer's delivery timeout)
        if failures:
            raise RuntimeError(f"the dead-letter topic {topic} did not take {len(failures)} records: {failures[:3]}")


def _clock_offsets(accepted: pa.Table) -> pa.Table:
    """Per (app, device) of the accepted events: their count and clock offsets, and the latest receive time."""
    grouped = accepted.group_by(["app", "device"], use_threads=False).aggregate([
        ("id", "count"), ("clock_offset_ms", "min"), ("clock_offset_ms", "max"), ("clock_offset_ms", "mean"),
        ("received_time", "max")])
    return pa.table({
        "app": grouped["app"], "device": grouped["device"], "events": grouped["id_count"],
        "offset_min_ms": grouped["clock_offset_ms_min"], "offset_max_ms": grouped["clock_offset_ms_max"],
        "offset_avg_ms": grouped["clock_offset_ms_mean"],
        "last_received": grouped["received_time_max"].cast(pa.timestamp("ms", tz="UTC")),
    })


def _epoch_ms(t: datetime) -> int:
    return int(t.replace(tzinfo=UTC).timestamp() * 1000) if t.tzinfo is None else int(t.timestamp() * 1000)
