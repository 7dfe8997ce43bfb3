"""Exact count of tumbling and hopping stragglers (BRIEF §3), done in the job beside the aggregation.

Spark drops a contribution whose window the watermark already closed without saying which events it dropped
(``numRowsDroppedByWatermark`` counts partially aggregated rows). So for every micro-batch of the ``windows``
query, its ``foreachBatch`` reads the batch's own accepted events (the events files of the accept batches whose
window partials the batch merged) and applies the same rule Spark applied, with the same watermark: an accepted
event's contribution to a window is dropped iff ``window_end <= watermark``. The windows are the aggregation's
own (``windows.assign_windows`` is ``windows.window_assignments`` computed in the driver, checked to agree).
Duplicates never reach those files, so they are never stragglers.

The late events whose window was still open are the **corrections**: the same pass counts them per window.

Late events are a few percent of a batch, so the pass runs in the driver on Arrow: the batch's files are read
with pyarrow (the columns it needs), late events filtered and assigned their windows with numpy. A Spark job for
the same work pays Spark's fixed cost per job in every micro-batch whatever its size (planning, scheduling,
reading the files again; docs/performance.md#one-spark-job-per-accept-batch).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analytics.checkpoint import BatchInfo
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
