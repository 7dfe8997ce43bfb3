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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from clickhouse_connect.driver.exceptions import OperationalError
from confluent_kafka import Producer
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics import accepted_log, dedup, envelope, keyed_rows, session_runs, window_partials
from analytics.keyed_windows import DROPPED_RUN, KEYED_WINDOWS_QUERY, RUN_LAST, SESSION, SLIDING
from analytics.progress import batch_info
from analytics.stragglers import (
    EVENT_COLUMNS,
    STRAGGLER_COLUMNS,
    corrections,
    late_contributions,
    stragglers,
)
from analytics.windows import LEVEL_FIELDS, QUANTILES, SERIES, WINDOWS_QUERY, epoch_ms
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
LOG_COLUMNS = ("corrected_event_time", "event_time", "received_time", "app", "level", "name", "device", "user",
               "message", "tags", "event_id", "source_partition", "source_offset")
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
        # The batch read window partials; its late pass reads the events of the same accept batches.
        files = ([str(accepted_log.events_file_of(config, f)) for f in accepted_log.files_read(checkpoint, info)]
                 if info.has_records else [])
        if files:
            with _timed(WINDOWS_QUERY, "late_events"):
                late = late_contributions(accepted_log.read_files(files, EVENT_COLUMNS), config, info)
                rows.append(("stragglers", _with_constants(stragglers(late), query_name=WINDOWS_QUERY,
                                                           batch_id=batch_id, detected_at=now)))
                rows.append(("corrections", _with_constants(corrections(late), batch_id=batch_id,
                                                            detected_at=now)))
        insert_tables(config, rows, WINDOWS_QUERY)

    return write


def keyed_windows_writer(config: Config) -> BatchWriter:
    """Write sliding windows, sessions and their stragglers, each keyed so a replayed batch changes nothing.

    One Spark job per batch: every output row comes to the driver once, with each table's derived columns
    computed in Spark, and the three tables are split from it with Arrow."""
    sliding_ms = config.stream.sliding_window_s * 1000
    gap_ms = config.stream.session_gap_s * 1000
    ts = F.timestamp_millis
    checkpoint = config.checkpoint_dir / KEYED_WINDOWS_QUERY

    def write(batch: DataFrame, batch_id: int) -> None:
        now = datetime.now(UTC)
        has_values = F.col("value_count") > 0
        with _timed(KEYED_WINDOWS_QUERY, "collect"):
            out = batch.select(
                "row_type", "window_kind", *SERIES,
                # a sliding window's length, or a session's gap (also the length of each one's stragglers)
                F.when(F.col("window_kind") == SLIDING, sliding_ms).otherwise(gap_ms).alias("window_length_ms"),
                ts("window_start_ms").alias("window_start"), ts("window_end_ms").alias("window_end"),
                ts("event_time_ms").alias("event_time"),
                (F.col("event_time_ms") - F.col("window_start_ms")).alias("duration_ms"),
                "source_partition", "source_offset", "event_id", "device", "event_count", "value_count", "sum",
                F.when(has_values, F.col("min")).alias("min"), F.when(has_values, F.col("max")).alias("max"),
                F.when(has_values, F.col("sum") / F.col("value_count")).alias("mean"),
                (F.col("event_count") * 1000.0 / sliding_ms).alias("rate"), "metric_count", "log_count",
                *LEVEL_FIELDS, ts("watermark_ms").alias("watermark"), "lateness_ms", RUN_LAST,
            ).toArrow()
        is_window = pc.equal(out["row_type"], "window")
        sliding = out.filter(pc.and_(is_window, pc.equal(out["window_kind"], SLIDING)))
        sessions = out.filter(pc.and_(is_window, pc.equal(out["window_kind"], SESSION)))
        dropped = out.filter(pc.equal(out["row_type"], "straggler")).select(list(_KEYED_STRAGGLER_COLUMNS))
        dropped_runs = out.filter(pc.equal(out["row_type"], DROPPED_RUN))
        if dropped_runs.num_rows:
            with _timed(KEYED_WINDOWS_QUERY, "dropped_runs"):
                files = accepted_log.files_read(checkpoint, batch_info(checkpoint, batch_id))
                dropped = pa.concat_tables([dropped, _run_stragglers(
                    dropped_runs, accepted_log.read_files(files, _RUN_EVENT_COLUMNS)).cast(dropped.schema)])
        rows = [
            ("sliding_windows", _with_constants(sliding.select(list(SLIDING_COLUMNS)),
                                                version=batch_id, written_at=now)),
            ("sessions", _with_constants(_renamed(sessions, {
                "window_length_ms": "gap_ms", "kind": "key_kind", "name": "session_key",
                "window_start": "session_start", "window_end": "session_end", "event_time": "last_event_time",
            }).select(list(SESSION_COLUMNS)), version=batch_id, written_at=now)),
            ("stragglers", _with_constants(_renamed(dropped, {"event_time": "corrected_event_time"}).append_column(
                "window_hop_ms", pa.array([0] * dropped.num_rows, pa.int64())).select(list(STRAGGLER_COLUMNS)),
                query_name=KEYED_WINDOWS_QUERY, batch_id=batch_id, detected_at=now)),
        ]
        insert_tables(config, rows, KEYED_WINDOWS_QUERY)

    return write


_RUN_EVENT_COLUMNS = (*session_runs.EVENT_COLUMNS, "partition", "offset", "id")
_KEYED_STRAGGLER_COLUMNS = ("window_kind", "window_length_ms", "app", "kind", "name", "series_tags", "window_start",
                            "window_end", "event_time", "source_partition", "source_offset", "event_id", "device",
                            "watermark", "lateness_ms")


def _run_stragglers(runs: pa.Table, events: pa.Table) -> pa.Table:
    """The straggler rows of the session runs ``keyed_windows`` dropped whole (its ``dropped_run`` rows), one per
    event of each run, from the batch's accepted events: the columns of the processor's own straggler rows."""
    straggler_of = session_runs.events_of_runs(pa.table({
        **{c: runs[c] for c in ("app", "kind", "name", "window_kind", "series_tags", "window_length_ms",
                                "window_start", "window_end", "watermark")},
        "first_ms": epoch_ms(runs["event_time"]), "last_ms": runs[RUN_LAST],
        "watermark_ms": epoch_ms(runs["watermark"])}), events)
    return pa.table({
        **{c: straggler_of[c] for c in ("window_kind", "window_length_ms", "app", "kind", "name", "series_tags",
                                        "window_start", "window_end")},
        "event_time": straggler_of["corrected_event_time"], "source_partition": straggler_of["partition"],
        "source_offset": straggler_of["offset"], "event_id": straggler_of["id"], "device": straggler_of["device"],
        "watermark": straggler_of["watermark"],
        "lateness_ms": pc.subtract(straggler_of["watermark_ms"], straggler_of["t_ms"]),
    })


def _renamed(table: pa.Table, names: dict[str, str]) -> pa.Table:
    return table.rename_columns([names.get(c, c) for c in table.column_names])


def accept_writer(config: Config) -> BatchWriter:
    """The ``accept`` query's batch: publish its first copies to the accepted-events log (read by the stateful
    queries), store its duplicates, its rejected records (also forwarded to the dead-letter topic), each
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
        accepted_columns = envelope.accepted_schema(spark, config).fieldNames()
        now = datetime.now(UTC)
        with _timed(ACCEPT_QUERY, "validate"):
            batch = accept_projection(records, accepted_columns, limit).toArrow()
        with _timed(ACCEPT_QUERY, "split"):
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
            with _timed(ACCEPT_QUERY, "dedup"):
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
            with _timed(ACCEPT_QUERY, "events_file"):
                if not replay:
                    info = batch_info(config.checkpoint_dir / ACCEPT_QUERY, batch_id)
                    # Session runs are marked here, where the whole batch is at hand (analytics.session_runs).
                    # So are the rows keyed_windows reads, written first (analytics.keyed_rows).
                    published = keyed_rows.row_groups(
                        session_runs.with_runs(accepted, config.stream.session_gap_s * 1000), config)
                    accepted_log.publish(config, published, accepted_log.BatchMeta(
                        batch_id, info.start_offsets, info.end_offsets, earliest, latest))
                if config.stream.deduplicate:
                    accepted_ids.remember(batch_id, accepted)
            # After the events file: the windows writer reads the events of the partials it merged.
            with _timed(ACCEPT_QUERY, "window_partials"):
                window_partials.publish(config, batch_id, accepted)
            with _timed(ACCEPT_QUERY, "log_lines"):
                rows.append(("logs", log_lines(batch, kept)))
            if copies.num_rows:
                rows.append(("duplicates", _with_constants(copies.rename_columns(list(DUPLICATE_COLUMNS)),
                                                           batch_id=batch_id, detected_at=now)))
        rows.append(("device_clocks", _with_constants(_clock_offsets(accepted),
                                                      batch_id=batch_id, recorded_at=now)))
        if rejected.num_rows:
            rows.append(("dead_letters", _with_constants(rejected.select(
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
            with _timed(ACCEPT_QUERY, "dead_letter_topic"):
                dead_letter_topic.forward(rejected)
        with _timed(ACCEPT_QUERY, "expire"):
            accepted_log.expire(config, readers, int(now.timestamp() * 1000))

    return write


_KAFKA_COORDINATES = ("topic", "partition", "offset", "kafka_timestamp")
_REJECTED_COLUMNS = (*_KAFKA_COORDINATES, "reason", "raw", "raw_bytes", "value")   # dead letters, their topic copy
_COPY_SOURCE = (*_KAFKA_COORDINATES, "id", "app", "device")                         # -> DUPLICATE_COLUMNS


def accept_projection(records: DataFrame, accepted_columns: list[str], limit: int) -> DataFrame:
    """What ``accept`` brings to the driver per record (``envelope.parse``'s rows): the accepted columns of a valid
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
    """The ``logs`` rows (``LOG_COLUMNS``) of the batch's first copies (``kept``) that are logs.

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
    obtains its producer id from the broker, which took 0.5-1 s before its first delivery (docs/benchmarks.md),
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


def _with_constants(table: pa.Table, **extra: Any) -> pa.Table:
    for name, value in extra.items():
        table = table.append_column(name, pa.array([value] * table.num_rows))
    return table
