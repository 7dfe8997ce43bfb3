"""How far the stream job has got, from ``pipeline_progress``: watermarks, processed offsets and consumer lag.

Shared by the dashboard (freshness, lag per partition) and the alert evaluator (``freshness``, ``lag`` rules).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from clickhouse_connect.driver.client import Client
from confluent_kafka import Consumer, TopicPartition

from eventide.config import Config

# The stream job's queries, named as analytics.vocabulary names them (the store sits below the job, so it cannot
# import them; tests/unit/dashboard/test_freshness.py checks the two lists agree).
ACCEPT_QUERY = "accept"
"""Reads Kafka: writes ``logs``, dead letters, duplicates, device clocks and records lost to retention."""
WINDOWS_QUERY = "windows"
"""The query whose watermark decides which tumbling/hopping windows are final (also stragglers, corrections)."""
KEYED_WINDOWS_QUERY = "keyed_windows"
"""Sliding windows and sessions (and their stragglers)."""
QUERIES = (ACCEPT_QUERY, WINDOWS_QUERY, KEYED_WINDOWS_QUERY)
PROVISIONAL_WINDOWS = "provisional_windows"
"""Not a query: ``accept``'s provisional tumbling and hopping rows (``analytics.windows.provisional``), which record
each round beside the queries' batches (``analytics.progress.record_round``), so :func:`last_batches` has it too."""
WINDOW_ROWS = (WINDOWS_QUERY, PROVISIONAL_WINDOWS)
"""What moves the tumbling and hopping rows: the ``windows`` query's batches, and the provisional rounds between
them."""
PROVISIONAL_SESSIONS = "provisional_sessions"
"""Not a query either: ``accept``'s provisional open sessions (``analytics.keyed.provisional``), recorded likewise."""
SESSION_ROWS = (KEYED_WINDOWS_QUERY, PROVISIONAL_SESSIONS)
"""What moves the sessions in progress: the ``keyed_windows`` query's batches, and the provisional rounds between
them."""


def watermarks(client: Client) -> dict[str, datetime]:
    """Latest watermark per streaming query (queries without one, like dead letters, are left out)."""
    rows = client.query("SELECT query_name, watermark FROM query_watermarks").result_rows
    marks = {name: mark.replace(tzinfo=UTC) for name, mark in rows if mark is not None}
    return {name: mark for name, mark in marks.items() if mark.timestamp() > 0}


def last_batches(client: Client) -> dict[str, datetime]:
    """When each streaming query's newest micro-batch was stored (the ``recorded_at`` of its latest progress row,
    written once the batch's results were in the store), by query name; a query that stored none is left out."""
    rows = client.query("SELECT query_name, recorded_at FROM query_watermarks").result_rows
    times = {name: at.replace(tzinfo=UTC) for name, at in rows if at is not None}
    return {name: at for name, at in times.items() if at.timestamp() > 0}


def processed_offsets(client: Client, topic: str, query: str = WINDOWS_QUERY) -> dict[int, int]:
    """Next offset to read per partition of ``topic``, as of the query's latest recorded batch."""
    rows = client.query("SELECT sources FROM pipeline_progress WHERE query_name = {q:String} "
                        "ORDER BY batch_timestamp DESC LIMIT 1", parameters={"q": query}).result_rows
    offsets: dict[int, int] = {}
    for source in json.loads(rows[0][0]) if rows else []:
        end = source.get("endOffset")
        end = json.loads(end) if isinstance(end, str) else end or {}
        offsets.update({int(p): int(o) for p, o in end.get(topic, {}).items()})
    return offsets


def consumer_lag(config: Config, client: Client, query: str = WINDOWS_QUERY, timeout_s: float = 2.0) -> dict[int, int]:
    """Records per partition of the events topic that ``query`` has not processed yet. Raises
    ``KafkaException`` when the broker does not answer within ``timeout_s``."""
    topic = config.kafka.events_topic
    processed = processed_offsets(client, topic, query)
    if not processed:
        return {}
    # log_level 0: an unreachable broker is reported by the exception, not by librdkafka lines on stderr.
    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap, "group.id": "eventide-lag-probe",
                         "log_level": 0})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1]
                for p in processed}
    finally:
        consumer.close()
    return {p: max(0, ends[p] - processed[p]) for p in sorted(processed)}
