"""Exact count of tumbling and hopping stragglers (BRIEF §3), done in the job beside the aggregation.

Spark drops a contribution whose window the watermark already closed without saying which events it dropped
(``numRowsDroppedByWatermark`` counts partially aggregated rows). So for every micro-batch of the ``windows``
query, its ``foreachBatch`` reads the batch's own accepted events again (the accepted-events file the batch read)
and applies the same rule Spark applied, with the same watermark: an accepted event's contribution to a window
is dropped iff ``window_end <= watermark``. The window assignment is the aggregation's own
(``windows.window_assignments``), so both agree by construction. Duplicates never reach that file, so they are
never stragglers.

The late events whose window was still open are the **corrections**: the same pass counts them per window.

Late events are a few percent of a batch, so the pass is one Spark job that brings the late contributions to the
driver; stragglers and corrections are split from them there with Arrow (a Spark job per table, the second with
a shuffle, cost ~1 s per micro-batch whatever its size).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analytics.progress import BatchInfo
from analytics.windows import SERIES, event_time_ms, window_assignments, window_specs
from eventide.config import Config

STRAGGLER_COLUMNS = (
    "window_kind", "window_length_ms", "window_hop_ms", "app", "kind", "name", "series_tags", "window_start",
    "window_end", "source_partition", "source_offset", "event_id", "device", "corrected_event_time", "watermark",
    "lateness_ms",
)


CORRECTION_KEY = ("window_kind", "window_length_ms", "window_hop_ms", *SERIES, "window_start", "window_end")
CORRECTION_COLUMNS = (*CORRECTION_KEY, "late_events", "max_lateness_ms")


def late_contributions(events: DataFrame, config: Config, info: BatchInfo) -> DataFrame:
    """Every contribution (event, window) of the batch's late ``events`` (corrected time behind the watermark),
    with ``dropped``: True when Spark dropped it (window already closed), False when it corrected an open window."""
    wm = info.watermark_ms
    contributions = events.where(event_time_ms() < wm).select("*", F.inline(window_assignments(window_specs(config))))
    return contributions.select(
        "window_kind", "window_length_ms", "window_hop_ms", *SERIES,
        F.timestamp_millis("window_start_ms").alias("window_start"),
        F.timestamp_millis("window_end_ms").alias("window_end"),
        F.col("partition").alias("source_partition"), F.col("offset").alias("source_offset"),
        F.col("id").alias("event_id"), "device", "corrected_event_time",
        F.timestamp_millis(F.lit(wm)).alias("watermark"),
        (F.lit(wm) - event_time_ms()).alias("lateness_ms"),
        (F.col("window_end_ms") <= wm).alias("dropped"),
    )


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
