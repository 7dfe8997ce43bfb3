"""Spark's progress reports of every micro-batch (what each batch read is in ``analytics.spark.checkpoint``).

``ProgressRecorder`` stores Spark's ``StreamingQueryProgress`` of every batch in ``pipeline_progress``; its
watermark is the finality clock (a window of a query is final once that query's watermark reached its end). While a
query waits for new data, its newest batch's row is stored again each time Spark reports it idle, with the time of
that report as ``recorded_at``: the row then says "every record received so far is in the store as of then", which
is what the dashboard's freshness line shows (a query with nothing to do is up to date, not stale).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from clickhouse_connect.driver.client import Client
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from analytics.spark.checkpoint import Offsets
from analytics.spark.listener import JsonProgressListener
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


def _offset(value: Any) -> str | None:
    """A source offset as the JVM's progress object gives it: compact JSON text (the report nests it as JSON)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def _source(source: dict[str, Any], kafka_offsets: SourceOffsets | None) -> dict[str, Any]:
    described = {"description": source.get("description"), "startOffset": _offset(source.get("startOffset")),
                 "endOffset": _offset(source.get("endOffset")), "latestOffset": _offset(source.get("latestOffset"))}
    if kafka_offsets is not None:
        # A query reading the accepted-events log records how far into the events topic its results reach, so
        # lag is measured the same way for every query.
        described.update(description=f"events topic, through {described['description']}", startOffset=None,
                         latestOffset=None, endOffset=json.dumps(kafka_offsets(described["endOffset"] or "{}")))
    return described


def progress_row(report: dict[str, Any], kafka_offsets: SourceOffsets | None = None) -> list[Any]:
    """One ``pipeline_progress`` row from a ``StreamingQueryProgress`` as Spark writes it in JSON."""
    operators = report.get("stateOperators") or []
    durations = report.get("durationMs") or {}
    return [
        report.get("name") or "", str(report["id"]), str(report["runId"]), report["batchId"],
        _ts(report.get("timestamp")), _ts((report.get("eventTime") or {}).get("watermark")),
        report.get("numInputRows") or 0, float(report.get("inputRowsPerSecond") or 0.0),
        float(report.get("processedRowsPerSecond") or 0.0),
        *(sum(op.get(metric, 0) for op in operators)
          for metric in ("numRowsDroppedByWatermark", "numRowsTotal", "memoryUsedBytes")),
        int(durations.get("triggerExecution", 0)),
        json.dumps(durations), json.dumps([_source(source, kafka_offsets) for source in report.get("sources") or []]),
        datetime.now(UTC),
    ]


class ProgressRecorder(JsonProgressListener):
    """Writes the progress of tracked queries to ``pipeline_progress`` of their store. Runs on the driver's
    listener thread; a failed write is logged and skipped (the next batch's row carries the newer watermark)."""

    def __init__(self) -> None:
        self._stores: dict[str, tuple[Config, SourceOffsets | None]] = {}
        self._newest: dict[str, tuple[Config, list[Any]]] = {}   # query id -> its newest row, and its store
        # The table's column types per store and database, asked once: an insert without them asks the store first.
        self._column_types: dict[tuple[str, str], Any] = {}

    def track(self, query: StreamingQuery, config: Config, kafka_offsets: SourceOffsets | None = None) -> None:
        """Record ``query``'s progress; ``kafka_offsets`` translates its source offsets when it does not read
        the events topic itself."""
        self._stores[str(query.id)] = (config, kafka_offsets)

    def record(self, report: dict[str, Any]) -> None:
        """Store one progress ``report`` (Spark's JSON of a ``StreamingQueryProgress``) if its query is tracked."""
        tracked = self._stores.get(str(report["id"]))
        if tracked is None:
            return
        config, kafka_offsets = tracked
        try:
            row = progress_row(report, kafka_offsets)
            self._newest[str(report["id"])] = (config, row)
            self._insert(config, row)
        except Exception:
            log.exception("could not record progress of %s", report.get("name"))

    def _insert(self, config: Config, row: list[Any]) -> None:
        store = (config.store_url, config.store.database)
        with connect(config) as client:
            if store not in self._column_types:
                self._column_types[store] = client.create_insert_context(
                    "pipeline_progress", column_names=list(PROGRESS_COLUMNS)).column_types
            client.insert("pipeline_progress", [row], column_names=list(PROGRESS_COLUMNS),
                          column_types=self._column_types[store])

    def onQueryIdle(self, event: Any) -> None:
        """A query found nothing new to read: its newest batch's row again, recorded now. The table keeps one row per
        (query, run, batch), the newest recorded (``ReplacingMergeTree(recorded_at)``), so the batch is not counted
        twice anywhere."""
        newest = self._newest.get(str(event.id))
        if newest is None:
            return
        config, row = newest
        try:
            self._insert(config, [*row[:-1], datetime.now(UTC)])   # recorded_at is the row's last column
        except Exception:
            log.exception("could not record progress of %s", row[0])


ROUND_TYPES = ("LowCardinality(String)", "SimpleAggregateFunction(max, DateTime64(3, 'UTC'))",
               "SimpleAggregateFunction(max, DateTime64(3, 'UTC'))")
"""``query_watermarks_kept``'s column types (sql/0009): given, the client does not ask the store for them before
each round's insert."""


def record_round(client: Client, writer: str, at: datetime) -> None:
    """Record that ``writer`` (not a Spark query: ``store.pipeline.PROVISIONAL_WINDOWS`` or
    ``PROVISIONAL_SESSIONS``) finished writing a round of rows at ``at``, where the queries' newest batches are kept
    (``query_watermarks_kept``): the dashboard reads it as it reads theirs (``store.pipeline.last_batches``). It has
    no watermark: epoch 0, which a maximum never picks and ``store.pipeline.watermarks`` leaves out."""
    client.insert("query_watermarks_kept", [[writer, datetime.fromtimestamp(0, UTC), at]],
                  column_names=["query_name", "watermark", "recorded_at"], column_type_names=ROUND_TYPES)


def progress_recorder(spark: SparkSession) -> ProgressRecorder:
    """The session's one recorder, registered on first use."""
    recorder = getattr(spark, "_eventide_progress", None)
    if recorder is None:
        recorder = ProgressRecorder()
        spark.streams.addListener(recorder)
        spark._eventide_progress = recorder  # type: ignore[attr-defined]
    return recorder
