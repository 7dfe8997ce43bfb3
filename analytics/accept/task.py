"""The ``accept`` query's work on one Kafka partition of a batch, run in the Spark task that read it.

The driver's ``accept`` writer (``analytics.accept.writer``) hands each task its partition's validated records as
Arrow (``mapInArrow``), and each task, in parallel over the partitions of the events topic:

- splits valid from rejected records;
- chooses the first copies against its partition's dedup horizon (``analytics.accept.dedup``);
- marks session runs and the rows ``keyed_windows`` reads (``analytics.keyed.runs``, ``analytics.keyed.rows``) and
  stages its partition's events file, then its window partials (``analytics.windows.partials``), for the driver to
  publish (``accepted_log.publish``) once every task has succeeded;
- stores its log lines, duplicates and rejected records in ClickHouse, and forwards the rejected records to the
  dead-letter topic;
- returns one small row (:data:`RESULT`): its counts, broker-time span, dedup state size, stage timings and its
  devices' clock offsets, which the driver stores for the whole batch in one insert (in place of one per
  partition: an insert costs the store a part, and at a real-time pace their number, more than their rows, is its
  cost).

So what reaches the driver per batch is one row per partition, whatever the number of events (its clock offsets:
a row per device the partition's batch heard from).

Everything a task writes is idempotent, so a retried task or a replayed batch changes nothing: staged files are
published only once (a replay of a published batch stages nothing and takes its first copies from the published
file), and every table is keyed by Kafka position, by device and batch, or (``logs``) deduplicated by the insert
itself (the same first copies in the same order make the same block).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer

from analytics import accepted_log
from analytics.accept import dedup
from analytics.accept.spill import HeldRecords
from analytics.keyed import rows as keyed_rows
from analytics.keyed import runs as session_runs
from analytics.sinks import insert_tables, warnings_kept, with_constants
from analytics.vocabulary import ACCEPT_QUERY
from analytics.windows import partials as window_partials
from eventide.config import Config

DUPLICATE_COLUMNS = ("source_topic", "source_partition", "source_offset", "kafka_timestamp", "event_id", "app",
                     "device")
DEAD_LETTER_COLUMNS = ("source_topic", "source_partition", "source_offset", "kafka_timestamp", "reason", "raw",
                       "raw_bytes")
KAFKA_COORDINATES = ("topic", "partition", "offset", "kafka_timestamp")
_COPY_SOURCE = (*KAFKA_COORDINATES, "id", "app", "device")   # -> DUPLICATE_COLUMNS

WIDE_COLUMNS = ("tags", "message")
"""The columns of a valid record a task reads one slice at a time, where it writes them (``analytics.accept.spill``);
it holds the others, a few hundred bytes a record, for its partition's whole batch."""

REJECTED_BYTES = 64 * 1024 * 1024
"""Rejected records a task holds before it stores and forwards them (one request each way)."""

RESULT = pa.schema([
    ("partition", pa.int32()), ("candidates", pa.int64()), ("accepted", pa.int64()), ("dead_letters", pa.int64()),
    ("first_timestamp_ms", pa.int64()), ("last_timestamp_ms", pa.int64()), ("horizon_ids", pa.int64()),
    ("horizon_bytes", pa.int64()), ("horizon_memory_bytes", pa.int64()), ("staged_bytes", pa.int64()),
    ("spilled_bytes", pa.int64()), ("oversized", pa.int64()), ("seconds", pa.string()),
    ("warnings", pa.list_(pa.string())), ("stored_at_ms", pa.int64()), ("device_clocks", pa.binary()),
])
"""What each task returns to the driver: one row per Kafka partition of the batch (``spilled_bytes``: its valid records
written to its local disk, 0 unless they exceeded ``stream.task_memory_bytes``; ``oversized``: its rejected records
over ``envelope.max_record_bytes``, which the driver copies to the dead-letter topic; ``seconds``: its stage timings
as JSON, for the benchmark; ``warnings``: what it logged while it waited for the store, for the driver's log;
``stored_at_ms``: when its rows, the log lines among them, were in the store, epoch ms, for the benchmark;
``device_clocks``: :func:`clock_offsets` of its accepted events, an Arrow IPC stream)."""


@dataclass(frozen=True)
class AcceptPartition:
    """One batch's work on each Kafka partition, as ``mapInArrow``'s function (pickled to the tasks).

    ``records``' schema is the driver's projection (``writer.accept_projection``): the accepted columns, the
    message, and the reason, raw bytes and value of a rejected record. ``replay``: the batch's events are already
    published; ``partials_published``: so are its partials."""

    config: Config
    batch_id: int
    attempt: str
    accepted_columns: tuple[str, ...]
    replay: bool
    partials_published: bool
    now: datetime

    def __call__(self, chunks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        clock = _Stopwatch()
        rejected: list[pa.RecordBatch] = []
        partitions: set[int] = set()
        records = dead_letters = oversized = rejected_bytes = 0
        limit = self.config.envelope.max_record_bytes
        with HeldRecords(self.config.stream.task_memory_bytes) as held:
            for chunk in chunks:
                # Spark's Arrow chunks hold at most spark.sql.execution.arrow.maxRecordsPerBatch records (10,000).
                # Rejected records (their first envelope.max_record_bytes each) are stored and forwarded once they
                # add up to REJECTED_BYTES, never all held; valid records (each at most
                # envelope.max_record_bytes) are held up to stream.task_memory_bytes, then spilled to local disk.
                records += chunk.num_rows
                partitions.update(pc.unique(chunk.column("partition")).to_pylist())
                is_valid = pc.is_null(chunk.column("reason"))
                refused = chunk.filter(pc.invert(is_valid))
                if refused.num_rows:
                    dead_letters += refused.num_rows
                    oversized += pc.sum(pc.greater(refused.column("raw_bytes"), limit)).as_py() or 0
                    rejected.append(refused)
                    rejected_bytes += refused.nbytes   # a running sum: nbytes walks every buffer of a batch
                    if rejected_bytes >= REJECTED_BYTES:
                        self._reject(rejected, clock)
                        rejected, rejected_bytes = [], 0
                held.add(chunk.filter(is_valid).select([*self.accepted_columns, "message"]))
            if not records:
                return
            partition = _only_partition(partitions, self.config)
            with warnings_kept() as warnings:
                result = self._accept(held, partition, rejected, dead_letters, clock)
        yield pa.RecordBatch.from_pylist([{**result, "oversized": oversized, "warnings": warnings}], schema=RESULT)

    def _reject(self, rejected: list[pa.RecordBatch], clock: _Stopwatch, rows: list[tuple[str, pa.Table]] | None = None
                ) -> None:
        """Store rejected records in ``dead_letters`` (with the other ``rows``, in one request) and forward them to
        the dead-letter topic, but those over ``envelope.max_record_bytes``: the task has only their first bytes,
        what ``dead_letters`` keeps of them, and the driver forwards them (``writer.forward_oversized``)."""
        table = pa.Table.from_batches(rejected) if rejected else None
        if table is not None:
            rows = [*(rows or []), ("dead_letters", with_constants(pa.table(
                [*(table[c] for c in (*KAFKA_COORDINATES, "reason")), _as_text(table["value"]), table["raw_bytes"]],
                names=list(DEAD_LETTER_COLUMNS)), detected_at=self.now))]
        with clock("store_write"):
            insert_tables(self.config, rows or [], ACCEPT_QUERY)
        if table is not None:
            whole = table.filter(pc.less_equal(table["raw_bytes"], self.config.envelope.max_record_bytes))
            # The topic copy is at-least-once (a replayed batch is forwarded again); the table is the count.
            with clock("dead_letter_topic"):
                _dead_letter_topic(self.config).forward(whole)

    def _accept(self, held: HeldRecords, partition: int, rejected: list[pa.RecordBatch], dead_letters: int,
                clock: _Stopwatch) -> dict[str, object]:
        """The valid records' work (``held``: the accepted columns and the message), written with the ``rejected``
        records not yet stored.

        The choices that span the partition's batch (first copies, session runs, window partials, clock offsets) read
        its narrow columns; the wide ones are read one slice at a time (``HeldRecords.slices``: the whole batch unless
        it was spilled) where they are written, to the events file and the ``logs`` rows."""
        config, batch_id = self.config, self.batch_id
        batch = held.table()
        narrow_columns = [c for c in self.accepted_columns if c not in WIDE_COLUMNS]
        accepted = batch.select(narrow_columns).slice(0, 0)
        kept = np.zeros(batch.num_rows, dtype=bool)
        memory: list[accepted_log.BatchMeta] = []
        span: dict[str, int | None] = {"first": None, "last": None}
        staged_bytes, memory_bytes = 0, 0
        rows: list[tuple[str, pa.Table]] = []
        slices = held.slices(batch)
        if batch.num_rows:
            candidates = batch.select(list(dedup.COPY_COLUMNS))
            times = pc.min_max(candidates["kafka_timestamp"].cast(pa.int64())).as_py()   # µs since the epoch
            span = {"first": times["min"] // 1000, "last": times["max"] // 1000}
            with clock("dedup"):
                kept = self._first_copies(candidates, partition, span["first"], memory).to_numpy(
                    zero_copy_only=False)
                accepted = batch.select(narrow_columns).filter(pa.array(kept))
                copies = batch.select(list(_COPY_SOURCE)).filter(pa.array(~kept))
            if not self.replay:
                with clock("events_file"):
                    # Session runs are marked here, where the partition's batch is at hand (analytics.keyed.runs),
                    # and so are the rows keyed_windows reads (analytics.keyed.rows).
                    staged_bytes = accepted_log.stage_file(
                        accepted_log.staging_dir(config.accepted_events_dir, batch_id, self.attempt), partition,
                        self._events_file_rows(batch, slices, kept, accepted))
            if config.stream.deduplicate:
                memory_bytes = _memory(config, partition).nbytes(memory)
                _memory(config, partition).remember(batch_id, accepted)
            if not self.partials_published:
                with clock("window_partials"):
                    accepted_log.stage_file(
                        accepted_log.staging_dir(config.window_partials_dir, batch_id, self.attempt), partition,
                        [window_partials.partials(accepted, config)])
            for start, end in slices[:-1]:   # a spilled batch's lines, one request per slice but the last
                lines = log_lines(batch.slice(start, end - start), kept[start:end])
                with clock("store_write"):
                    insert_tables(config, [("logs", lines)], ACCEPT_QUERY)
            start, end = slices[-1]
            with clock("log_lines"):
                rows.append(("logs", log_lines(batch.slice(start, end - start), kept[start:end])))
            if copies.num_rows:
                rows.append(("duplicates", with_constants(copies.rename_columns(list(DUPLICATE_COLUMNS)),
                                                           batch_id=batch_id, detected_at=self.now)))
        self._reject(rejected, clock, rows)
        return {
            "partition": partition, "candidates": batch.num_rows, "accepted": accepted.num_rows,
            "dead_letters": dead_letters, "first_timestamp_ms": span["first"],
            "last_timestamp_ms": span["last"],
            "horizon_ids": sum(m.partition_events(partition) for m in memory),
            "horizon_bytes": sum(m.partition_bytes(partition) for m in memory), "horizon_memory_bytes": memory_bytes,
            "staged_bytes": staged_bytes, "spilled_bytes": held.spilled_bytes, "seconds": json.dumps(clock.seconds),
            "stored_at_ms": int(time.time() * 1000), "device_clocks": ipc_stream(clock_offsets(accepted)),
        }

    def _events_file_rows(self, batch: pa.Table, slices: list[tuple[int, int]], kept: np.ndarray,
                          accepted: pa.Table) -> Iterator[pa.Table]:
        """The partition's events file, row group by row group: per slice of ``batch``, its first copies (``kept``)
        with their session-run columns, the rows ``keyed_windows`` reads first (``analytics.keyed.rows``). The runs
        are formed over the whole batch (``accepted``: the first copies' narrow columns, in the same order)."""
        config = self.config
        runs = session_runs.with_runs(accepted.select([*session_runs.EVENT_COLUMNS, "level"]),
                                      config.stream.session_gap_s * 1000).select(list(session_runs.RUN_FIELDS))
        before = np.concatenate([[0], np.cumsum(kept)])   # first copies before each row
        for start, end in slices:
            rows = batch.slice(start, end - start).select(list(self.accepted_columns)).filter(
                pa.array(kept[start:end]))
            run_rows = runs.slice(int(before[start]), rows.num_rows)
            for name in session_runs.RUN_FIELDS:
                rows = rows.append_column(run_rows.schema.field(name), run_rows[name])
            yield from keyed_rows.row_groups(rows, config)

    def _first_copies(self, candidates: pa.Table, partition: int, earliest_ms: int,
                      memory: list[accepted_log.BatchMeta]) -> pa.BooleanArray:
        """Which candidates are first copies; fills ``memory`` with the batches of the horizon they were checked
        against."""
        config = self.config
        if self.replay:   # the published file says what was accepted
            return dedup.published_copies(candidates, accepted_log.partition_events(
                config, self.batch_id, partition, dedup.POSITION))
        if not config.stream.deduplicate:
            return pa.array(np.ones(candidates.num_rows, dtype=bool))
        memory.extend(dedup.horizon(config, self.batch_id, partition, earliest_ms))
        return _memory(config, partition).first_copies(candidates, memory)


def _only_partition(found: set[int], config: Config) -> int:
    """The one Kafka partition a task's records come from; a partition the layout has no file for is refused
    with what to change."""
    if len(found) != 1:
        raise RuntimeError(f"accept batch task read Kafka partitions {sorted(found)}: each task must read exactly one "
                           "(do not set the Kafka source's minPartitions or maxRecordsPerPartition)")
    [partition] = found
    if partition >= config.kafka.events_partitions:
        raise RuntimeError(
            f"the events topic has a partition {partition}, but kafka.events_partitions is "
            f"{config.kafka.events_partitions}: the accepted-events log has one file per partition; set "
            "kafka.events_partitions to the topic's partition count once the stateful queries have caught up "
            "(docs/operations.md, \"Adding partitions\")")
    return partition


class _Stopwatch:
    """The seconds one task spends per stage: ``with clock("stage"):`` adds the block's to ``seconds[stage]``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start


_memories: dict[tuple[str, int], dedup.AcceptedIds] = {}


def _memory(config: Config, partition: int) -> dedup.AcceptedIds:
    """This process's dedup memory of one partition of one accepted-events log (a worker may serve several
    partitions, and in tests several jobs)."""
    key = (str(config.accepted_events_dir), partition)
    if key not in _memories:
        _memories[key] = dedup.AcceptedIds(config, partition)
    return _memories[key]


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


def clock_offsets(accepted: pa.Table) -> pa.Table:
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


def ipc_stream(table: pa.Table) -> bytes:
    """``table`` as an Arrow IPC stream: a table inside one value of a task's result row."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)
    return sink.getvalue().to_pybytes()


def _as_text(raw: pa.ChunkedArray) -> pa.ChunkedArray:
    """Rejected records' bytes as the ``raw`` text of ``dead_letters`` ('' for a record without a value): the bytes
    as they are, not decoded, as ClickHouse's String keeps them (a rejected record need not be UTF-8)."""
    text = pa.chunked_array([chunk.view(pa.string()) for chunk in raw.chunks], pa.string())
    return pc.fill_null(text, "")


class _DeadLetterTopic:
    """A copy of each rejected record on the dead-letter topic, its reason and source in headers; one producer
    per process (a Spark task's Python worker) and topic."""

    def __init__(self, config: Config) -> None:
        self._topic = config.kafka.dead_letter_topic
        # The client's own default limit (1,000,000 bytes) is below a record the events topic takes.
        self._producer = Producer({"bootstrap.servers": config.kafka.bootstrap, "acks": "all",
                                   "enable.idempotence": True,
                                   "message.max.bytes": config.kafka.dead_letter_max_message_bytes})

    def forward(self, rejected: pa.Table) -> None:
        """Send ``rejected`` (columns topic, partition, offset, reason, value) and wait until the broker has every
        copy; raise if it refused one (Spark then retries the task, and the batch)."""
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


_dead_letter_topics: dict[tuple[str, str], _DeadLetterTopic] = {}


def _dead_letter_topic(config: Config) -> _DeadLetterTopic:
    key = (config.kafka.bootstrap, config.kafka.dead_letter_topic)
    if key not in _dead_letter_topics:
        _dead_letter_topics[key] = _DeadLetterTopic(config)
    return _dead_letter_topics[key]
