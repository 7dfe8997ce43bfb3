"""The ``keyed_windows`` query's writer: sliding windows, sessions and their stragglers, each keyed so a replayed batch
changes nothing."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analytics import accepted_log, reader_batches
from analytics.keyed import runs as session_runs
from analytics.keyed.schema import DROPPED_RUN, OPEN_SESSION, OPEN_SESSION_GONE, RUN_LAST, SESSION, SLIDING
from analytics.rounds import reader_version
from analytics.sinks import BatchWriter, TaskWriter, insert_in_tasks, renamed, timed, with_constants
from analytics.spark.checkpoint import batch_info, files_read
from analytics.vocabulary import KEYED_WINDOWS_QUERY, LEVEL_FIELDS, SERIES, epoch_ms
from analytics.windows.stragglers import STRAGGLER_COLUMNS
from eventide.config import Config

SLIDING_COLUMNS = (
    "window_length_ms", "app", "kind", "name", "series_tags", "window_start", "window_end", "source_partition",
    "source_offset", "event_id", "event_count", "value_count", "sum", "min", "max", "mean", "rate", *LEVEL_FIELDS,
)
SESSION_COLUMNS = (
    "gap_ms", "app", "key_kind", "session_key", "session_start", "session_end", "last_event_time", "duration_ms",
    "event_count", "metric_count", "log_count", *LEVEL_FIELDS,
)

OPEN_SESSION_COLUMNS = (*SESSION_COLUMNS, "is_open")
_SESSION_NAMES = {"window_length_ms": "gap_ms", "kind": "key_kind", "name": "session_key",
                  "window_start": "session_start", "window_end": "session_end", "event_time": "last_event_time"}


def keyed_windows_writer(config: Config) -> BatchWriter:
    """Write sliding windows, sessions and their stragglers, each keyed so a replayed batch changes nothing.

    One Spark job per batch, and the rows never reach the driver: each task of the query's output computes each
    table's derived columns in Spark, splits its rows into the three tables and inserts them (:class:`KeyedRows`);
    the driver collects a row per table and task (issue 40). Last, the reader batches both readers are done with go
    (``reader_batches.expire``)."""
    checkpoint = config.checkpoint_dir / KEYED_WINDOWS_QUERY

    def write(batch: DataFrame, batch_id: int) -> None:
        now = datetime.now(UTC)
        info = batch_info(checkpoint, batch_id)
        # A batch without data (the watermark moved: timers close sessions) covers what the batch before it did, so
        # its retiring rows have that batch's version and win as the later insert (ReplacingMergeTree keeps the last
        # of equal versions), as the windows query's rows do. None only before the first accept batch.
        newest = accepted_log.newest_batch_read(checkpoint, int(info.end_offsets.get("logOffset", -1))) or 0
        out = batch.select(*_output_columns(config.stream.sliding_window_s * 1000, config.stream.session_gap_s * 1000))
        with timed(KEYED_WINDOWS_QUERY, "tasks"):   # the stateful query runs when its rows are written
            insert_in_tasks([out], [KeyedRows(config, checkpoint, batch_id, now, reader_version(newest))])
        with timed(KEYED_WINDOWS_QUERY, "expire"):   # here, never beside this query's listing of its reader batches
            reader_batches.expire(config, KEYED_WINDOWS_QUERY)

    return write


@functools.cache
def _output_columns(sliding_ms: int, gap_ms: int) -> tuple[Column, ...]:
    """The stateful operator's rows with each table's derived columns, built once per process and settings
    (docs/performance.md#query-columns-built-once-per-process)."""
    has_values = F.col("value_count") > 0
    ts = F.timestamp_millis
    return (
        F.col("row_type"), F.col("window_kind"), *map(F.col, SERIES),
        # a sliding window's length, or a session's gap (also the length of each one's stragglers)
        F.when(F.col("window_kind") == SLIDING, sliding_ms).otherwise(gap_ms).alias("window_length_ms"),
        ts("window_start_ms").alias("window_start"), ts("window_end_ms").alias("window_end"),
        ts("event_time_ms").alias("event_time"),
        (F.col("event_time_ms") - F.col("window_start_ms")).alias("duration_ms"),
        *map(F.col, ("source_partition", "source_offset", "event_id", "device", "event_count", "value_count", "sum")),
        F.when(has_values, F.col("min")).alias("min"), F.when(has_values, F.col("max")).alias("max"),
        F.when(has_values, F.col("sum") / F.col("value_count")).alias("mean"),
        (F.col("event_count") * 1000.0 / sliding_ms).alias("rate"), F.col("metric_count"), F.col("log_count"),
        *map(F.col, LEVEL_FIELDS), ts("watermark_ms").alias("watermark"), F.col("lateness_ms"), F.col(RUN_LAST),
    )


class KeyedRows(TaskWriter):
    """A task's share of the query's output rows, split by ``row_type`` into the three tables; a run of session
    events dropped whole (``dropped_run``) is expanded into its events' stragglers from the batch's events files,
    read by the task that has the run (rare: late session events)."""

    def __init__(self, config: Config, checkpoint: Path, batch_id: int, written_at: datetime,
                 open_version: int) -> None:
        super().__init__(config, KEYED_WINDOWS_QUERY)
        self.checkpoint = checkpoint
        self.batch_id = batch_id
        self.written_at = written_at
        self.open_version = open_version

    def tables(self, out: pa.Table) -> tuple[list[tuple[str, pa.Table]], pa.Table | None]:
        batch_id, now = self.batch_id, self.written_at
        is_window = pc.equal(out["row_type"], "window")
        sliding = out.filter(pc.and_(is_window, pc.equal(out["window_kind"], SLIDING)))
        sessions = out.filter(pc.and_(is_window, pc.equal(out["window_kind"], SESSION)))
        # Sessions in progress, and the provisional rows that no longer stand: a start gone, or a session closed
        # (its final row retires its provisional one; inserted before the final rows, so a reader may miss a closing
        # session for an instant but never counts it both open and closed).
        provisional = out.filter(pc.is_in(out["row_type"], pa.array([OPEN_SESSION, OPEN_SESSION_GONE])))
        provisional = pa.concat_tables([
            provisional.append_column("is_open", pc.equal(provisional["row_type"], OPEN_SESSION).cast(pa.uint8())),
            sessions.append_column("is_open", pa.array([0] * sessions.num_rows, pa.uint8()))])
        dropped = out.filter(pc.equal(out["row_type"], "straggler")).select(list(_KEYED_STRAGGLER_COLUMNS))
        dropped_runs = out.filter(pc.equal(out["row_type"], DROPPED_RUN))
        if dropped_runs.num_rows:
            # Every events file the batch read (an accept batch may have several).
            files = files_read(self.checkpoint, batch_info(self.checkpoint, batch_id))
            dropped = pa.concat_tables([dropped, _run_stragglers(
                dropped_runs, accepted_log.read_files(files, _RUN_EVENT_COLUMNS)).cast(dropped.schema)])
        return [
            ("sliding_windows", with_constants(sliding.select(list(SLIDING_COLUMNS)),
                                                version=batch_id, written_at=now)),
            ("open_sessions", with_constants(renamed(provisional, _SESSION_NAMES).select(list(OPEN_SESSION_COLUMNS)),
                                             version=self.open_version, written_at=now)),
            ("sessions", with_constants(renamed(sessions, _SESSION_NAMES).select(list(SESSION_COLUMNS)),
                                        version=batch_id, written_at=now)),
            ("stragglers", with_constants(renamed(dropped, {"event_time": "corrected_event_time"}).append_column(
                "window_hop_ms", pa.array([0] * dropped.num_rows, pa.int64())).select(list(STRAGGLER_COLUMNS)),
                query_name=KEYED_WINDOWS_QUERY, batch_id=batch_id, detected_at=now)),
        ], None


_RUN_EVENT_COLUMNS = (*session_runs.EVENT_COLUMNS, "partition", "offset", "id")
_KEYED_STRAGGLER_COLUMNS = ("window_kind", "window_length_ms", "app", "kind", "name", "series_tags", "window_start",
                            "window_end", "event_time", "source_partition", "source_offset", "event_id", "device",
                            "watermark", "lateness_ms")


def _run_stragglers(runs: pa.Table, events: pa.Table) -> pa.Table:
    """The straggler rows of the session runs ``keyed_windows`` dropped whole (its ``dropped_run`` rows), one per
    event of each run, from the batch's accepted events: the columns of the processor's own straggler rows.

    A row carries its head's partition and its size (``source_partition``, ``event_count``), so a run formed within
    one Kafka partition takes only that partition's events (``session_runs.events_of_runs``)."""
    straggler_of = session_runs.events_of_runs(pa.table({
        **{c: runs[c] for c in ("app", "kind", "name", "window_kind", "series_tags", "window_length_ms",
                                "window_start", "window_end", "watermark")},
        "first_ms": epoch_ms(runs["event_time"]), "last_ms": runs[RUN_LAST],
        "watermark_ms": epoch_ms(runs["watermark"]),
        "head_partition": runs["source_partition"], "run_events": runs["event_count"]}), events)
    found = pa.table({
        **{c: straggler_of[c] for c in ("window_kind", "window_length_ms", "app", "kind", "name", "series_tags",
                                        "window_start", "window_end")},
        "event_time": straggler_of["corrected_event_time"], "source_partition": straggler_of["partition"],
        "source_offset": straggler_of["offset"], "event_id": straggler_of["id"], "device": straggler_of["device"],
        "watermark": straggler_of["watermark"],
        "lateness_ms": pc.subtract(straggler_of["watermark_ms"], straggler_of["t_ms"]),
    })
    # An event taken by two runs (events of one key and time, each its own run in a file without runs) is one row.
    return found.group_by(found.column_names, use_threads=False).aggregate([]).select(found.column_names)
