"""The ``accept`` query's writer, in the driver: it runs each batch's per-partition work in Spark tasks
(``analytics.accept.task``: first copies, the staged events and partials files, log lines, duplicates, rejected
records, clock offsets), then publishes the staged files to the accepted-events log and records the dedup state
and the batch's clock offsets (one insert for all partitions).

What the driver handles per batch is one row per Kafka partition (the tasks' results, with a clock row per device
they heard from), whatever the number of events, so adding executors adds throughput: the per-event work spreads
over the events topic's partitions."""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from analytics import accepted_log, reader_batches
from analytics.accept import validation
from analytics.accept.pacing import AcceptPacing
from analytics.accept.task import KAFKA_COORDINATES, RESULT, AcceptPartition
from analytics.sinks import BatchWriter, Newest, insert_tables, sink_seconds, timed, with_constants
from analytics.spark.checkpoint import batch_info
from analytics.vocabulary import ACCEPT_QUERY, KEYED_WINDOWS_QUERY, WINDOWS_QUERY
from eventide.config import Config

log = logging.getLogger(__name__)


def accept_writer(config: Config, live: bool = False,
                  after_hand_over: Callable[[int], object] | None = None) -> BatchWriter:
    """The ``accept`` query's batch: one Spark job whose tasks accept each Kafka partition's records
    (``AcceptPartition``), then, in the driver, the batch's files published once every task succeeded, handed to
    the readers when their reader batch is due (``analytics.reader_batches``; ``live``: the job runs on its
    processing-time trigger, so accept batches are grouped), ``after_hand_over`` called with the id of a batch that
    published events (the job's provisional window rows, ``analytics.windows.provisional``), the dedup state stored,
    and expired files deleted; on a live job, a busy stream's batch then waits until the next is due
    (``analytics.accept.pacing``).

    Every Spark job costs a fixed overhead per micro-batch (at a few thousand events per batch, most of the batch),
    so the batch runs one, and its tasks do all the per-event work."""
    limit = config.envelope.max_record_bytes
    readers = [config.checkpoint_dir / q for q in (WINDOWS_QUERY, KEYED_WINDOWS_QUERY)]
    result_schema = from_arrow_schema(RESULT)
    due = reader_batches.due_after(config, live)
    pacing = AcceptPacing(config.stream.accept_interval, config.stream.accept_busy_interval,
                          config.stream.accept_busy_rate) if live else None

    def write(records: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        spark = records.sparkSession
        # A pool of its own: its tasks take the next free slot before a reader's pending ones (spark.settings).
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", ACCEPT_QUERY)
        accepted_columns = validation.accepted_schema(spark, config).fieldNames()
        now = datetime.now(UTC)
        attempt = uuid.uuid4().hex
        task = AcceptPartition(config, batch_id, attempt, tuple(accepted_columns),
                               replay=accepted_log.published(config, batch_id),
                               partials_published=accepted_log.partials_published(config, batch_id), now=now)
        with timed(ACCEPT_QUERY, "tasks"):
            results = accept_projection(records, accepted_columns, limit).mapInArrow(task, result_schema).toArrow()
        _add_task_seconds(results)
        _note_lines_stored(batch_id, results)
        if pc.sum(results["oversized"]).as_py():
            with timed(ACCEPT_QUERY, "oversized_dead_letters"):
                forward_oversized(records, config)
        for warning in (w for found in results["warnings"].to_pylist() for w in found or []):
            log.warning("%s (in an accept task)", warning)
        for spilled in results.filter(pc.greater(results["spilled_bytes"], 0)).to_pylist():
            log.info("accept batch %d: partition %d held %.1f MB of valid records on its task's disk "
                     "(stream.task_memory_bytes)", batch_id, spilled["partition"], spilled["spilled_bytes"] / 1e6)
        with_valid = results.filter(pc.greater(results["candidates"], 0))
        if with_valid.num_rows:
            info = batch_info(config.checkpoint_dir / ACCEPT_QUERY, batch_id)
            partitions = {str(r["partition"]): [r["first_timestamp_ms"], r["last_timestamp_ms"], r["accepted"],
                                                r["staged_bytes"]] for r in with_valid.to_pylist()}
            with timed(ACCEPT_QUERY, "publish"):
                accepted_log.publish(config, accepted_log.BatchMeta(
                    batch_id, info.start_offsets, info.end_offsets,
                    pc.min(with_valid["first_timestamp_ms"]).as_py(), pc.max(with_valid["last_timestamp_ms"]).as_py(),
                    events=pc.sum(with_valid["accepted"]).as_py(), partitions=partitions,
                    accepted_at_ms=int(now.timestamp() * 1000)), attempt)
        with timed(ACCEPT_QUERY, "hand_over"):
            reader_batches.hand_over(config, int(datetime.now(UTC).timestamp() * 1000), due)
        if after_hand_over is not None and with_valid.num_rows:
            with timed(ACCEPT_QUERY, "after_hand_over"):
                after_hand_over(batch_id)
        insert_tables(config, [("dedup_state", _dedup_state(config, batch_id, results, now)),
                               ("dedup_partitions", _dedup_partitions(config, batch_id, results, now)),
                               ("device_clocks", device_clocks(batch_id, results, now))], ACCEPT_QUERY)
        with timed(ACCEPT_QUERY, "expire"):
            accepted_log.expire(config, readers, int(now.timestamp() * 1000))
        if pacing is not None:
            read = sum(pc.sum(results[column]).as_py() or 0 for column in ("candidates", "dead_letters"))
            hold = pacing.hold_s(started, read, time.monotonic())
            if hold:
                with timed(ACCEPT_QUERY, "paced"):
                    time.sleep(hold)

    return write


def accept_projection(records: DataFrame, accepted_columns: list[str], limit: int) -> DataFrame:
    """What ``accept``'s tasks get per record (``validation.parse``'s rows): the accepted columns of a valid record
    and, for a log, its message; the Kafka coordinates, reason, size and first ``limit`` bytes of a rejected one (the
    whole record unless it is over the limit: :func:`forward_oversized` copies those to the dead-letter topic)."""
    return records.select(*_projection(tuple(accepted_columns), limit))


@functools.cache
def _projection(accepted_columns: tuple[str, ...], limit: int) -> tuple[Column, ...]:
    """:func:`accept_projection`'s columns, built once per process and settings
    (docs/performance.md#query-columns-built-once-per-process)."""
    rejected_only = F.col("dead_letter_reason").isNotNull()
    return (
        # A rejected record's envelope fields are never computed, only its Kafka coordinates.
        *[F.col(c) if c in KAFKA_COORDINATES else F.when(~rejected_only, F.col(c)).alias(c)
          for c in accepted_columns],
        F.when(~rejected_only & (F.col("kind") == "log"), F.col("message")).alias("message"),
        F.col("dead_letter_reason").alias("reason"),
        # Raw bytes travel for rejected records only, never more than the record limit of them.
        F.when(rejected_only, F.substring(F.col("value"), 1, limit)).alias("value"),
        F.when(rejected_only, F.coalesce(F.octet_length("value"), F.lit(0))).alias("raw_bytes"),
    )


def forward_oversized(records: DataFrame, config: Config) -> None:
    """Copy the batch's records over ``envelope.max_record_bytes`` to the dead-letter topic, byte for byte, with
    their reason and source in headers, as the tasks copy the other rejected records: through Spark's Kafka sink, so
    their bytes (up to the topic's largest message each) never enter a Python process.

    Runs only for a batch whose tasks found such records: it reads the batch from Kafka again."""
    limit = config.envelope.max_record_bytes
    (records.where(F.col("dead_letter_reason").isNotNull() & (F.octet_length("value") > limit))
     .select(F.col("value"), F.array(   # the Kafka sink's headers: (key, value) pairs
         F.struct(F.lit("reason").alias("key"), F.col("dead_letter_reason").cast("binary").alias("value")),
         F.struct(F.lit("source").alias("key"), F.concat_ws(
             "/", F.col("topic"), F.col("partition").cast("string"), F.col("offset").cast("string"))
             .cast("binary").alias("value"))).alias("headers"))
     .write.format("kafka")
     .option("kafka.bootstrap.servers", config.kafka.bootstrap)
     .option("topic", config.kafka.dead_letter_topic)
     .option("kafka.acks", "all")
     .option("kafka.max.request.size", str(config.kafka.dead_letter_max_message_bytes))
     .save())


def _add_task_seconds(results: pa.Table) -> None:
    """The tasks' stage timings, summed over the batch's tasks, as ``tasks.<stage>`` in ``sinks.sink_seconds``
    (read by the benchmark)."""
    total: dict[str, float] = defaultdict(float)
    for seconds in results["seconds"].to_pylist():
        for stage, spent in json.loads(seconds).items():
            total[stage] += spent
    for stage, spent in total.items():
        sink_seconds[(ACCEPT_QUERY, f"tasks.{stage}")].append(spent)


LINES_STORED_KEPT = 40_000
lines_stored: Newest[tuple[int, int], int] = Newest(LINES_STORED_KEPT)
"""When each (accept batch, Kafka partition)'s log lines were stored, epoch ms, for the newest ``LINES_STORED_KEPT``
in this driver: read by the benchmark (a line is searchable from then, before its batch ends)."""


def _note_lines_stored(batch_id: int, results: pa.Table) -> None:
    for partition, stored_at_ms in zip(results["partition"].to_pylist(), results["stored_at_ms"].to_pylist(),
                                       strict=True):
        lines_stored.note((batch_id, partition), stored_at_ms)


def device_clocks(batch_id: int, results: pa.Table, now: datetime) -> pa.Table:
    """The batch's ``device_clocks`` rows: each task's clock offsets per device, stored in one insert."""
    parts = [pa.ipc.open_stream(found).read_all() for found in results["device_clocks"].to_pylist() if found]
    if not parts:
        return pa.table({})
    return with_constants(pa.concat_tables(parts), batch_id=batch_id, recorded_at=now)


def _dedup_state(config: Config, batch_id: int, results: pa.Table, now: datetime) -> pa.Table:
    """The batch's row of ``dedup_state``: the partitions' figures added up."""
    def total(column: str) -> int:
        return int(pc.sum(results[column]).as_py() or 0)

    return pa.table({
        "batch_id": [batch_id], "horizon_ms": [config.stream.dedup_horizon_ms],
        "horizon_ids": [total("horizon_ids")], "horizon_bytes": [total("horizon_bytes")],
        "horizon_memory_bytes": [total("horizon_memory_bytes")], "accepted": [total("accepted")],
        "duplicates": [total("candidates") - total("accepted")], "dead_letters": [total("dead_letters")],
        "recorded_at": [now]})


def _dedup_partitions(config: Config, batch_id: int, results: pa.Table, now: datetime) -> pa.Table:
    """One ``dedup_partitions`` row per partition the batch read."""
    n = results.num_rows
    return pa.table({
        "batch_id": pa.array([batch_id] * n, pa.uint64()), "source_partition": results["partition"],
        "horizon_ms": pa.array([config.stream.dedup_horizon_ms] * n, pa.uint64()),
        **{c: results[c] for c in ("horizon_ids", "horizon_bytes", "horizon_memory_bytes", "accepted")},
        "duplicates": pc.subtract(results["candidates"], results["accepted"]),
        "dead_letters": results["dead_letters"], "recorded_at": pa.array([now] * n, pa.timestamp("ms", tz="UTC"))})
