"""Exact count of tumbling and hopping stragglers (BRIEF §3), done in the job beside the aggregation.

Spark drops a contribution whose window the watermark already closed without saying which events it dropped
(``numRowsDroppedByWatermark`` counts partially aggregated rows). So for every micro-batch of the ``windows``
query, its ``foreachBatch`` reads the batch's own accepted events (the events files of the accept batches whose
window partials the batch merged) and applies the same rule Spark applied, with the same watermark: an accepted
event's contribution to a window is dropped iff ``window_end <= watermark``. The windows are the aggregation's
own (``windows.assign_windows`` is ``windows.window_assignments`` computed in the driver, checked to agree).
Duplicates never reach those files, so they are never stragglers.

The late events whose window was still open are the **corrections**: the same pass counts them per window.

The pass runs in Spark's tasks, one per events file (``analytics.windows.writer``), in the same Spark job as the
window rows: a file is read with pyarrow, its time column first and the other columns only when some of its events
are late (:func:`late_events`), late events are assigned their windows with numpy, its stragglers are inserted by
the task, and only its per-window correction partials go to the driver, which merges them
(:func:`merged_corrections`). So the driver's work per batch is bounded by files and windows, not events. Reading
the files with Spark instead (its Parquet reader, the watermark filter in the JVM) decodes every row of every
column it needs in the JVM and sends the late rows to Python all the same; pyarrow decodes one int64 column per
row and the rest only for files with late events, and needs no plan per batch.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from analytics.accepted_log import local_path
from analytics.spark.checkpoint import BatchInfo
from analytics.vocabulary import ARROW_TIME, SERIES, assign_windows, epoch_ms, window_specs
from eventide.config import Config

STRAGGLER_COLUMNS = (
    "window_kind", "window_length_ms", "window_hop_ms", "app", "kind", "name", "series_tags", "window_start",
    "window_end", "source_partition", "source_offset", "event_id", "device", "corrected_event_time", "watermark",
    "lateness_ms",
)


CORRECTION_KEY = ("window_kind", "window_length_ms", "window_hop_ms", *SERIES, "window_start", "window_end")
CORRECTION_COLUMNS = (*CORRECTION_KEY, "late_events", "max_lateness_ms")


EVENT_COLUMNS = (*SERIES, "partition", "offset", "id", "device", "corrected_event_time")
"""The accepted-event columns the late pass reads."""


def late_contributions(events: pa.Table, config: Config, info: BatchInfo) -> pa.Table:
    """Every contribution (event, window) of the batch's late ``events`` (corrected time behind the watermark),
    with ``dropped``: True when Spark dropped it (window already closed), False when it corrected an open window.

    ``events`` holds at least :data:`EVENT_COLUMNS` of the batch's accepted events."""
    wm = info.watermark_ms
    event_ms = epoch_ms(events["corrected_event_time"], null_ms=wm)
    late_rows = np.flatnonzero(event_ms < wm)
    late, late_ms = events.take(late_rows), event_ms[late_rows]
    windows = assign_windows(window_specs(config), late_ms)
    of = windows["event"]
    contributor, contributor_ms = late.take(of), late_ms[of.to_numpy()]
    start_ms, end_ms = windows["window_start_ms"].to_numpy(), windows["window_end_ms"].to_numpy()
    return pa.table({
        "window_kind": windows["window_kind"],
        "window_length_ms": windows["window_length_ms"],
        "window_hop_ms": windows["window_hop_ms"],
        **{c: contributor[c] for c in SERIES},
        "window_start": _timestamps(start_ms),
        "window_end": _timestamps(end_ms),
        "source_partition": contributor["partition"],
        "source_offset": contributor["offset"],
        "event_id": contributor["id"],
        "device": contributor["device"],
        "corrected_event_time": contributor["corrected_event_time"].cast(ARROW_TIME),
        "watermark": _timestamps(np.full(len(start_ms), wm, dtype=np.int64)),
        "lateness_ms": pa.array(wm - contributor_ms, pa.int64()),
        "dropped": pa.array(end_ms <= wm, pa.bool_()),
    })


def _timestamps(ms: np.ndarray) -> pa.Array:
    return pa.array(ms * 1000, pa.int64()).cast(ARROW_TIME)


def stragglers(late: pa.Table) -> pa.Table:
    """One row per dropped contribution (of ``late_contributions``, collected), with its lateness."""
    return late.filter(late["dropped"]).select(list(STRAGGLER_COLUMNS))


def corrections(late: pa.Table) -> pa.Table:
    """Per open window the late events corrected (of ``late_contributions``, collected): how many, and the
    latest of them."""
    corrected = late.filter(pc.invert(late["dropped"]))
    per_window = corrected.group_by(list(CORRECTION_KEY), use_threads=False).aggregate(
        [("lateness_ms", "count"), ("lateness_ms", "max")])
    return per_window.rename_columns(
        {"lateness_ms_count": "late_events", "lateness_ms_max": "max_lateness_ms"}).select(list(CORRECTION_COLUMNS))


def late_events(file: str, watermark_ms: int) -> pa.Table:
    """:data:`EVENT_COLUMNS` of the events in one accepted-events ``file`` (a ``file:`` URI, as a reader's
    file-source log names it, or a path) whose corrected time is behind the watermark: the only ones
    :func:`late_contributions` counts. The time column is read first; the others only when an event is late."""
    parquet = pq.ParquetFile(local_path(file))
    times = parquet.read(columns=["corrected_event_time"])["corrected_event_time"]
    late = epoch_ms(times, null_ms=watermark_ms) < watermark_ms
    if not late.any():
        return parquet.schema_arrow.empty_table().select(list(EVENT_COLUMNS))
    return parquet.read(columns=list(EVENT_COLUMNS)).filter(pa.array(late))


def merged_corrections(partials: list[pa.Table]) -> pa.Table:
    """One row per window of :func:`corrections` tables of parts of a batch (one per events file): the late
    events summed, the largest lateness kept. A single part comes back as it is."""
    if len(partials) == 1:
        return partials[0]
    per_window = pa.concat_tables(partials).group_by(list(CORRECTION_KEY), use_threads=False).aggregate(
        [("late_events", "sum"), ("max_lateness_ms", "max")])
    return per_window.rename_columns(
        {"late_events_sum": "late_events", "max_lateness_ms_max": "max_lateness_ms"}).select(list(CORRECTION_COLUMNS))
