"""The ``windows`` query's writer: the window rows a micro-batch changed, and its late pass (the dropped stragglers
and corrections of the accept batches it read)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics import accepted_log
from analytics.checkpoint import batch_info
from analytics.sinks import BatchWriter, insert_tables, timed, with_constants
from analytics.vocabulary import LEVEL_FIELDS, QUANTILES, WINDOWS_QUERY
from analytics.windows.stragglers import EVENT_COLUMNS, corrections, late_contributions, stragglers
from eventide.config import Config

WINDOW_COLUMNS = (
    "window_kind", "window_length_ms", "window_hop_ms", "window_start", "window_end", "app", "kind", "name",
    "series_tags", "event_count", "value_count", "sum", "min", "max", "mean", "rate", *QUANTILES,
    "distinct_users", "distinct_devices", "value_sketch", "users_sketch", "devices_sketch",
    *LEVEL_FIELDS,
)
_SKETCHES = {"value_sketch", "users_sketch", "devices_sketch"}


def arrow_rows(frame: DataFrame, columns: tuple[str, ...], **extra: Any) -> pa.Table:
    """``frame``'s ``columns`` (plus constant ``extra`` columns) as an Arrow table, without building Python rows."""
    selected = frame.select(*[
        # Sketch columns are non-nullable Strings in the store: a window without values stores ''.
        F.coalesce(F.col(c), F.unhex(F.lit(""))).alias(c) if c in _SKETCHES else F.col(c) for c in columns])
    return with_constants(selected.toArrow(), **extra)


def window_writer(config: Config) -> BatchWriter:
    """Upsert the window rows a micro-batch changed (``version`` = batch id orders corrections), then count the
    batch's dropped stragglers and corrections with the batch's own offsets and watermark."""
    checkpoint = config.checkpoint_dir / WINDOWS_QUERY

    def write(batch: DataFrame, batch_id: int) -> None:
        now = datetime.now(UTC)
        with timed(WINDOWS_QUERY, "aggregate"):   # the stateful aggregation runs when its rows are collected
            rows = [("window_aggregates", arrow_rows(batch, WINDOW_COLUMNS, version=batch_id, written_at=now))]
        info = batch_info(checkpoint, batch_id)
        # The batch read window partials; its late pass reads the events of the same accept batches.
        files = ([str(accepted_log.events_file_of(config, f)) for f in accepted_log.files_read(checkpoint, info)]
                 if info.has_records else [])
        if files:
            with timed(WINDOWS_QUERY, "late_events"):
                late = late_contributions(accepted_log.read_files(files, EVENT_COLUMNS), config, info)
                rows.append(("stragglers", with_constants(stragglers(late), query_name=WINDOWS_QUERY,
                                                           batch_id=batch_id, detected_at=now)))
                rows.append(("corrections", with_constants(corrections(late), batch_id=batch_id,
                                                            detected_at=now)))
        insert_tables(config, rows, WINDOWS_QUERY)

    return write
