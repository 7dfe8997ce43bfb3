"""``foreachBatch`` writers from the stream job to ClickHouse (and the dead-letter topic).

Writes are idempotent, which with Spark's checkpoints gives an exactly-once effect: window rows are keyed by
(window, series) and versioned by the micro-batch id in a ReplacingMergeTree; sliding windows, stragglers and
dead letters are keyed by their event's Kafka position; sessions by (key, start). A micro-batch replayed after a
crash rewrites identical rows and changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from clickhouse_connect.driver.exceptions import OperationalError
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics import accepted_log, dedup, envelope
from analytics.keyed_windows import KEYED_WINDOWS_QUERY, SESSION, SLIDING
from analytics.progress import batch_info
from analytics.stragglers import (
    STRAGGLER_COLUMNS,
    corrections,
    late_contributions,
    stragglers,
)
from analytics.windows import LEVEL_FIELDS, QUANTILES, SERIES, WINDOWS_QUERY
from eventide.config import Config
from store.client import StoreUnavailable, connect, redact

log = logging.getLogger(__name__)
ACCEPT_QUERY = "accept"

WINDOW_COLUMNS = (
    "window_kind", "window_length_ms", "window_hop_ms", "window_start", "window_end", "app", "kind", "name",
    "series_tags", "event_count", "value_count", "sum", "min", "max", "mean", "rate", *QUANTILES,
    "distinct_users", "distinct_devices", "value_sketch", "users_sketch", "devices_sketch",
    *LEVEL_FIELDS,
)
_SKETCHES = {"value_sketch", "users_sketch", "devices_sketch"}
DUPLICATE_COLUMNS = ("source_topic", "source_partition", "source_offset", "kafka_timestamp", "event_id", "app",
                     "device")
DEAD_LETTER_COLUMNS = ("source_topic", "source_partition", "source_offset", "kafka_timestamp", "reason", "raw",
                       "raw_bytes")
SLIDING_COLUMNS = (
    "window_length_ms", "app", "kind", "name", "series_tags", "window_start", "window_end", "source_partition",
    "source_offset", "event_id", "event_count", "value_count", "sum", "min", "max", "mean", "rate", *LEVEL_FIELDS,
)
SESSION_COLUMNS = (
    "gap_ms", "app", "key_kind", "session_key", "session_start", "session_end", "last_event_time", "duration_ms",
    "event_count", "metric_count", "log_count", *LEVEL_FIELDS,
)

BatchWriter = Callable[[DataFrame, int], None]
STORE_RETRY_FIRST_S, STORE_RETRY_MAX_S = 1.0, 10.0   # pauses between write attempts while the store is away

# Seconds spent per micro-batch in each sink stage, by (query, stage), in this driver process: read by the
# benchmark (bench/pipeline.py) for its per-stage breakdown and logged at DEBUG.
sink_seconds: dict[tuple[str, str], list[float]] = defaultdict(list)


@contextmanager
def _timed(query: str, stage: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        sink_seconds[(query, stage)].append(elapsed)
        log.debug("%s %s took %.3f s", query, stage, elapsed)


def arrow_rows(frame: DataFrame, columns: tuple[str, ...], **extra: Any) -> pa.Table:
    """``frame``'s ``columns`` (plus constant ``extra`` columns) as an Arrow table, without building Python rows."""
    selected = frame.select(*[
        # Sketch columns are non-nullable Strings in the store: a window without values stores ''.
        F.coalesce(F.col(c), F.unhex(F.lit(""))).alias(c) if c in _SKETCHES else F.col(c) for c in columns])
    return _with_constants(selected.toArrow(), **extra)


def insert_tables(config: Config, rows: list[tuple[str, pa.Table]], query: str) -> None:
    """Insert each (table, rows) pair with one client (nothing if every one is empty).

    An unreachable store (stopped, restarting, network) does not fail the query: the micro-batch waits and
    retries for up to ``store.write_retry_s``, saying so in the log. Nothing is lost meanwhile: Spark commits the
    batch only once this returns, and every table is keyed, so rows a failed attempt already wrote are replaced by
    the same rows. Errors the store answers (bad SQL, schema) fail at once."""
    rows = [(table, data) for table, data in rows if data.num_rows]
    if not rows:
        return
    deadline = time.monotonic() + config.store.write_retry_s
    pause = STORE_RETRY_FIRST_S
    while True:
        try:
            with _timed(query, "store_write"), connect(config) as client:
                for table, data in rows:
                    client.insert_arrow(table, data)
            return
        except (StoreUnavailable, OperationalError) as exc:
            if time.monotonic() + pause > deadline:
                raise StoreUnavailable(f"{query}: the store at {redact(config.store_url)} stayed unreachable for "
                                       f"{config.store.write_retry_s:g} s (store.write_retry_s): {exc}") from exc
            log.warning("%s: store unreachable at %s (%s); the micro-batch waits and retries in %g s",
                        query, redact(config.store_url), str(exc).splitlines()[0][:200], pause)
            time.sleep(pause)
            pause = min(pause * 2, STORE_RETRY_MAX_S)


def window_writer(config: Config) -> BatchWriter:
    """Upsert the window rows a micro-batch changed (``version`` = batch id orders corrections), then count the
    batch's dropped stragglers and corrections with the batch's own offsets and watermark."""
    checkpoint = config.checkpoint_dir / WINDOWS_QUERY

    def write(batch: DataFrame, batch_id: int) -> None:
        now = datetime.now(UTC)
        with _timed(WINDOWS_QUERY, "aggregate"):   # the stateful aggregation runs when its rows are collected
            rows = [("window_aggregates", arrow_rows(batch, WINDOW_COLUMNS, version=batch_id, written_at=now))]
        info = batch_info(checkpoint, batch_id)
        if info.has_records:
            spark = batch.sparkSession
            events = accepted_log.read_batches(spark, envelope.accepted_schema(spark, config),
                                               accepted_log.files_read(checkpoint, info))
            with _timed(WINDOWS_QUERY, "late_events"):
                late = late_contributions(events, config, info).toArrow()
                rows.append(("stragglers", _with_constants(stragglers(late), query_name=WINDOWS_QUERY,
                                                           batch_id=batch_id, detected_at=now)))
                rows.append(("corrections", _with_constants(corrections(late), batch_id=batch_id,
                                                            detected_at=now)))
        insert_tables(config, rows, WINDOWS_QUERY)

    return write


def keyed_windows_writer(config: Config) -> BatchWriter:
    """Write sliding windows, sessions and their stragglers, each keyed so a replayed batch changes nothing."""
    sliding_ms = config.stream.sliding_window_s * 1000
    gap_ms = config.stream.session_gap_s * 1000
    ts = F.timestamp_millis

    def write(batch: DataFrame, batch_id: int) -> None:
        batch = batch.persist()
        try:
            now = datetime.now(UTC)
            windows = batch.where(F.col("row_type") == "window")
            has_values = F.col("value_count") > 0
            sliding = windows.where(F.col("window_kind") == SLIDING).select(
                F.lit(sliding_ms).alias("window_length_ms"), *SERIES,
                ts("window_start_ms").alias("window_start"), ts("window_end_ms").alias("window_end"),
                "source_partition", "source_offset", "event_id", "event_count", "value_count", "sum",
                F.when(has_values, F.col("min")).alias("min"), F.when(has_values, F.col("max")).alias("max"),
                F.when(has_values, F.col("sum") / F.col("value_count")).alias("mean"),
                (F.col("event_count") * 1000.0 / sliding_ms).alias("rate"), *LEVEL_FIELDS)
            rows = [("sliding_windows", arrow_rows(sliding, SLIDING_COLUMNS, version=batch_id, written_at=now))]
            sessions = windows.where(F.col("window_kind") == SESSION).select(
                F.lit(gap_ms).alias("gap_ms"), "app", F.col("kind").alias("key_kind"),
                F.col("name").alias("session_key"), ts("window_start_ms").alias("session_start"),
                ts("window_end_ms").alias("session_end"), ts("event_time_ms").alias("last_event_time"),
                (F.col("event_time_ms") - F.col("window_start_ms")).alias("duration_ms"),
                "event_count", "metric_count", "log_count", *LEVEL_FIELDS)
            rows.append(("sessions", arrow_rows(sessions, SESSION_COLUMNS, version=batch_id, written_at=now)))
            dropped = batch.where(F.col("row_type") == "straggler").select(
                "window_kind",
                F.when(F.col("window_kind") == SLIDING, sliding_ms).otherwise(gap_ms).alias("window_length_ms"),
                F.lit(0).alias("window_hop_ms"), *SERIES,
                ts("window_start_ms").alias("window_start"), ts("window_end_ms").alias("window_end"),
                "source_partition", "source_offset", "event_id", "device",
                ts("event_time_ms").alias("corrected_event_time"), ts("watermark_ms").alias("watermark"),
                "lateness_ms")
            rows.append(("stragglers", arrow_rows(dropped, STRAGGLER_COLUMNS, query_name=KEYED_WINDOWS_QUERY,
                                                  batch_id=batch_id, detected_at=now)))
            insert_tables(config, rows, KEYED_WINDOWS_QUERY)
        finally:
            batch.unpersist()

    return write


def accept_writer(config: Config) -> BatchWriter:
    """The ``accept`` query's batch: publish its first copies to the accepted-events log (read by the stateful
    queries), store its duplicates, its rejected records (also forwarded to the dead-letter topic), each
    device's clock offsets and the dedup state.

    Every Spark job costs a fixed overhead per micro-batch, so the common case runs two: one pass over the batch
    that brings a few narrow columns per record to the driver (from which the first copies, clock offsets and
    broker-time span are computed with Arrow), and the publication. Dead letters cost a job only in a batch that
    has some."""
    limit = config.envelope.max_record_bytes
    readers = [config.checkpoint_dir / q for q in (WINDOWS_QUERY, KEYED_WINDOWS_QUERY)]
    accepted_ids = dedup.AcceptedIds(config)

    def write(records: DataFrame, batch_id: int) -> None:
        spark = records.sparkSession
        schema = envelope.accepted_schema(spark, config)
        # Read twice (summary, publication), so cached; only rejected records keep their raw bytes.
        records = records.withColumn(
            "value", F.when(F.col("dead_letter_reason").isNotNull(), F.col("value"))).persist()
        try:
            now = datetime.now(UTC)
            valid = records.where(F.col("dead_letter_reason").isNull()).select(*schema.fieldNames())
            with _timed(ACCEPT_QUERY, "validate"):
                summary = records.select(
                    F.col("dead_letter_reason").isNull().alias("ok"), *_SUMMARY_COLUMNS).toArrow()
            candidates = summary.filter(summary["ok"])
            rejected_count = summary.num_rows - candidates.num_rows
            memory: list[accepted_log.BatchMeta] = []
            accepted = candidates
            rows: list[tuple[str, pa.Table]] = []
            if candidates.num_rows:
                span = pc.min_max(candidates["kafka_timestamp"]).as_py()
                earliest, latest = _epoch_ms(span["min"]), _epoch_ms(span["max"])
                memory = dedup.horizon(config, batch_id, earliest) if config.stream.deduplicate else []
                with _timed(ACCEPT_QUERY, "dedup_publish"):
                    replay = accepted_log.published(config, batch_id)
                    if replay:   # its file says what was accepted
                        first = dedup.published_copies(candidates, str(accepted_log.events_file(config, batch_id)))
                    elif config.stream.deduplicate:
                        first = dedup.first_copies(candidates.select(list(dedup.COPY_COLUMNS)),
                                                   accepted_ids.of(memory))
                    else:
                        first = pa.array([True] * candidates.num_rows)
                    copies = candidates.filter(pc.invert(first))
                    if not replay:
                        info = batch_info(config.checkpoint_dir / ACCEPT_QUERY, batch_id)
                        accepted_log.publish(config, dedup.without_copies(valid, copies), accepted_log.BatchMeta(
                            batch_id, info.start_offsets, info.end_offsets, earliest, latest))
                    accepted = candidates.filter(first)
                    if config.stream.deduplicate:
                        accepted_ids.remember(batch_id, accepted["id"])
                if copies.num_rows:
                    rows.append(("duplicates", _with_constants(copies.select(
                        ["topic", "partition", "offset", "kafka_timestamp", "id", "app", "device"]).rename_columns(
                        list(DUPLICATE_COLUMNS)), batch_id=batch_id, detected_at=now)))
            rows.append(("device_clocks", _with_constants(_clock_offsets(accepted),
                                                          batch_id=batch_id, recorded_at=now)))
            rejected = records.where(F.col("dead_letter_reason").isNotNull()).withColumnRenamed(
                "dead_letter_reason", "reason")
            if rejected_count:
                rows.append(("dead_letters", arrow_rows(_dead_letter_rows(rejected, limit), DEAD_LETTER_COLUMNS,
                                                        detected_at=now)))
            rows.append(("dedup_state", pa.table({
                "batch_id": [batch_id], "horizon_ms": [config.stream.dedup_horizon_ms],
                "horizon_ids": [sum(m.events for m in memory)],
                "horizon_bytes": [sum(m.size_bytes for m in memory)],
                "horizon_memory_bytes": [accepted_ids.nbytes(memory)],
                "accepted": [accepted.num_rows], "duplicates": [candidates.num_rows - accepted.num_rows],
                "dead_letters": [rejected_count], "recorded_at": [now]})))
            insert_tables(config, rows, ACCEPT_QUERY)
            if rejected_count:
                # The topic copy is at-least-once (a replayed batch is forwarded again); the table is the count.
                _forward_dead_letters(config, rejected)
            accepted_log.expire(config, readers, int(now.timestamp() * 1000))
        finally:
            records.unpersist()

    return write


# Per record, what the accept query's driver needs: the copy's id and position, and its device's clock offset.
_SUMMARY_COLUMNS = ("topic", "partition", "offset", "kafka_timestamp", "id", "app", "device", "clock_offset_ms",
                    "received_time")


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


def _with_constants(table: pa.Table, **extra: Any) -> pa.Table:
    for name, value in extra.items():
        table = table.append_column(name, pa.array([value] * table.num_rows))
    return table


def _dead_letter_rows(batch: DataFrame, limit: int) -> DataFrame:
    """Rejected records as ``dead_letters`` rows: the raw record (truncated to ``limit``) with its reason."""
    return batch.select(
        F.col("topic").alias("source_topic"), F.col("partition").alias("source_partition"),
        F.col("offset").alias("source_offset"), "kafka_timestamp", "reason",
        F.substring(F.coalesce(F.col("value").cast("string"), F.lit("")), 1, limit).alias("raw"),
        F.coalesce(F.octet_length("value"), F.lit(0)).alias("raw_bytes"),
    )


def _forward_dead_letters(config: Config, batch: DataFrame) -> None:
    """A copy of each rejected record on the dead-letter topic, its reason and source in headers."""
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
