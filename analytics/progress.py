"""Spark's progress reports of every micro-batch (what each batch read is in ``analytics.checkpoint``).

``ProgressRecorder`` stores Spark's ``StreamingQueryProgress`` of every batch in ``pipeline_progress``; its
watermark is the finality clock (a window of a query is final once that query's watermark reached its end).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

from analytics.checkpoint import Offsets
from eventide.config import Config
from store.client import connect

log = logging.getLogger(__name__)

PROGRESS_COLUMNS = (
    "query_name", "query_id", "run_id", "batch_id", "batch_timestamp", "watermark", "input_rows",
    "input_rows_per_second", "processed_rows_per_second", "rows_dropped_by_watermark", "state_rows",
    "state_memory_bytes", "duration_ms", "durations", "sources", "recorded_at",
)


def _ts(iso: str | None) -> datetime:
    if not iso:
        return datetime.fromtimestamp(0, UTC)
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


# Maps a source's end offset (Spark's JSON) to the events-topic offsets it stands for.
SourceOffsets = Callable[[str], Offsets]


def _source(source: Any, kafka_offsets: SourceOffsets | None) -> dict[str, Any]:
    described = {"description": source.description, "startOffset": source.startOffset,
                 "endOffset": source.endOffset, "latestOffset": source.latestOffset}
    if kafka_offsets is not None:
        # A query reading the accepted-events log records how far into the events topic its results reach, so
        # lag is measured the same way for every query.
        described.update(description=f"events topic, through {source.description}", startOffset=None,
                         latestOffset=None, endOffset=json.dumps(kafka_offsets(source.endOffset or "{}")))
    return described


def progress_row(progress: Any, kafka_offsets: SourceOffsets | None = None) -> list[Any]:
    """One ``pipeline_progress`` row from a ``StreamingQueryProgress``."""
    operators = progress.stateOperators or []
    return [
        progress.name or "", str(progress.id), str(progress.runId), progress.batchId, _ts(progress.timestamp),
        _ts((progress.eventTime or {}).get("watermark")), progress.numInputRows,
        float(progress.inputRowsPerSecond or 0.0), float(progress.processedRowsPerSecond or 0.0),
        sum(op.numRowsDroppedByWatermark for op in operators), sum(op.numRowsTotal for op in operators),
        sum(op.memoryUsedBytes for op in operators), int((progress.durationMs or {}).get("triggerExecution", 0)),
        json.dumps(progress.durationMs or {}),
        json.dumps([_source(s, kafka_offsets) for s in progress.sources]),
        datetime.now(UTC),
    ]


class ProgressRecorder(StreamingQueryListener):
    """Writes the progress of tracked queries to ``pipeline_progress`` of their store. Runs on the driver's
    listener thread; a failed write is logged and skipped (the next batch's row carries the newer watermark)."""

    def __init__(self) -> None:
        self._stores: dict[str, tuple[Config, SourceOffsets | None]] = {}

    def track(self, query: StreamingQuery, config: Config, kafka_offsets: SourceOffsets | None = None) -> None:
        """Record ``query``'s progress; ``kafka_offsets`` translates its source offsets when it does not read
        the events topic itself."""
        self._stores[str(query.id)] = (config, kafka_offsets)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        tracked = self._stores.get(str(event.progress.id))
        if tracked is None:
            return
        config, kafka_offsets = tracked
        try:
            with connect(config) as client:
                client.insert("pipeline_progress", [progress_row(event.progress, kafka_offsets)],
                              column_names=list(PROGRESS_COLUMNS))
        except Exception:
            log.exception("could not record progress of %s", event.progress.name)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def progress_recorder(spark: SparkSession) -> ProgressRecorder:
    """The session's one recorder, registered on first use."""
    recorder = getattr(spark, "_eventide_progress", None)
    if recorder is None:
        recorder = ProgressRecorder()
        spark.streams.addListener(recorder)
        spark._eventide_progress = recorder  # type: ignore[attr-defined]
    return recorder
