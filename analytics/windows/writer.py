"""The ``windows`` query's writer: the window rows a micro-batch changed, and its late pass (the dropped stragglers
and corrections of the accept batches it read).

Both run in Spark's tasks, as one Spark job per micro-batch (``sinks.insert_in_tasks``): each task of the
aggregation's output inserts its own window rows, and one task per events file the batch read runs the late pass
over that file (``analytics.windows.stragglers``). The driver plans the job, collects a few rows per task and
inserts the batch's corrections, one row per window a late event corrected: its work per batch is bounded by the
tasks, files and corrected windows, not by the events or the window rows (issue 40).
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analytics import accepted_log, reader_batches
from analytics.rounds import reader_version
from analytics.sinks import BatchWriter, TaskWriter, insert_in_tasks, insert_tables, timed, with_constants
from analytics.spark.checkpoint import BatchInfo, batch_info, files_read
from analytics.vocabulary import LEVEL_FIELDS, QUANTILES, WINDOWS_QUERY
from analytics.windows.stragglers import corrections, late_contributions, late_events, merged_corrections, stragglers
from eventide.config import Config

WINDOW_COLUMNS = (
    "window_kind", "window_length_ms", "window_hop_ms", "window_start", "window_end", "app", "kind", "name",
    "series_tags", "event_count", "value_count", "sum", "min", "max", "mean", "rate", *QUANTILES,
    "distinct_users", "distinct_devices", "value_sketch", "users_sketch", "devices_sketch",
    *LEVEL_FIELDS,
)
_SKETCHES = {"value_sketch", "users_sketch", "devices_sketch"}


def window_rows(frame: DataFrame) -> DataFrame:
    """``frame``'s :data:`WINDOW_COLUMNS` as the store takes them."""
    return frame.select(*_window_row_columns())


@functools.cache
def _window_row_columns() -> tuple[Column, ...]:
    """Built once per process: columns are unresolved expressions, and building them is a call into the JVM each,
    which every micro-batch would otherwise pay (docs/performance.md#query-columns-built-once-per-process)."""
    # Sketch columns are non-nullable Strings in the store: a window without values stores ''.
    return tuple(F.coalesce(F.col(c), F.unhex(F.lit(""))).alias(c) if c in _SKETCHES else F.col(c)
                 for c in WINDOW_COLUMNS)


class WindowRows(TaskWriter):
    """A task's share of the window rows a micro-batch changed, versioned by the newest accept batch the
    micro-batch took (``analytics.rounds.reader_version``: ``version`` orders corrections, and provisional rows; a
    replayed batch writes the same version)."""

    def __init__(self, config: Config, version: int, written_at: datetime) -> None:
        super().__init__(config, WINDOWS_QUERY)
        self.version = version
        self.written_at = written_at

    def tables(self, rows: pa.Table) -> tuple[list[tuple[str, pa.Table]], pa.Table | None]:
        return [("window_aggregates", with_constants(rows, version=self.version, written_at=self.written_at))], None


class LatePass(TaskWriter):
    """The late pass over the events files of a batch, one file per input row (its index in ``files``): inserts the
    files' dropped stragglers and returns their correction partials (per window: late events, largest lateness),
    which the driver merges over the batch's files."""

    def __init__(self, config: Config, files: list[str], info: BatchInfo, detected_at: datetime) -> None:
        super().__init__(config, WINDOWS_QUERY)
        self.files = files
        self.info = info
        self.detected_at = detected_at

    def tables(self, rows: pa.Table) -> tuple[list[tuple[str, pa.Table]], pa.Table | None]:
        lates = [late_contributions(late_events(self.files[i], self.info.watermark_ms), self.config, self.info)
                 for i in rows["id"].to_pylist()]
        late = pa.concat_tables(lates)
        found = with_constants(stragglers(late), query_name=WINDOWS_QUERY, batch_id=self.info.batch_id,
                               detected_at=self.detected_at)
        partials = corrections(late)
        return [("stragglers", found)], partials if partials.num_rows else None


def window_writer(config: Config) -> BatchWriter:
    """Upsert the window rows a micro-batch changed (``version``: the newest accept batch it took), then count the
    batch's dropped stragglers and corrections with the batch's own offsets and watermark: in tasks, one Spark job
    per batch (module docstring). Last, the reader batches both readers are done with go
    (``reader_batches.expire``)."""
    checkpoint = config.checkpoint_dir / WINDOWS_QUERY

    def write(batch: DataFrame, batch_id: int) -> None:
        now = datetime.now(UTC)
        info = batch_info(checkpoint, batch_id)
        # The batch read window partials; its late pass reads the events of the same accept batches (each file
        # the batch read maps to its events file; an accept batch may have several).
        files = ([str(accepted_log.events_file_of(config, f)) for f in files_read(checkpoint, info)]
                 if info.has_records else [])
        # (None only for a batch that read nothing, and so writes no row)
        newest = accepted_log.newest_batch_read(checkpoint, int(info.end_offsets.get("logOffset", -1))) or 0
        version = reader_version(newest)
        frames, writers = [window_rows(batch)], [WindowRows(config, version, now)]
        if files:
            # One task per events file, each reading only its own file.
            frames.append(batch.sparkSession.range(len(files), numPartitions=len(files)))
            writers.append(LatePass(config, files, info, now))
        # The stateful aggregation runs when its rows are written.
        with timed(WINDOWS_QUERY, "tasks"):
            _, partials = insert_in_tasks(frames, writers)
        if partials:
            insert_tables(config, [("corrections", with_constants(merged_corrections(partials), batch_id=batch_id,
                                                                  detected_at=now))], WINDOWS_QUERY)
        with timed(WINDOWS_QUERY, "expire"):   # here, never beside this query's listing of its reader batches
            reader_batches.expire(config, WINDOWS_QUERY)

    return write
