"""Rows for the tables the dashboard reads besides window_aggregates (see ``tests/support/window_rows.py`` for windows),
shaped as the stream job and the alert evaluator write them, for tests that populate chDB through the SQL layer.

Each builder returns a ``{column: value}`` dict; :func:`insert_rows` writes a list of them. Naive datetimes are UTC.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from clickhouse_connect.driver.client import Client

LEVELS = ("debug", "info", "warning", "error", "critical")


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def insert_rows(client: Client, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert dict rows (all with the same keys) into ``table``; nothing to do for an empty list."""
    if not rows:
        return
    columns = list(rows[0])
    client.insert(table, [[row[c] for c in columns] for row in rows], column_names=columns)


def straggler(detected_at: datetime, offset: int, *, window_start: datetime, window_kind: str = "tumbling",
              length_s: int = 10, hop_s: int | None = None, app: str = "shop", kind: str = "metric",
              name: str = "latency_ms", lateness_s: float = 5.0, partition: int = 0,
              device: str = "device-1") -> dict[str, Any]:
    """One dropped contribution of the event at (``partition``, ``offset``) to a window that was already closed."""
    window_end = window_start + timedelta(seconds=length_s)
    # The event sat in the window's last millisecond; the watermark had passed it by lateness_s (> 0: closed).
    event_time = window_end - timedelta(milliseconds=1)
    watermark = event_time + timedelta(seconds=lateness_s)
    return {
        "window_kind": window_kind, "window_length_ms": length_s * 1000, "window_hop_ms": (hop_s or length_s) * 1000,
        "app": app, "kind": kind, "name": name, "series_tags": "", "window_start": window_start,
        "window_end": window_end, "source_partition": partition, "source_offset": offset, "event_id": f"e-{offset}",
        "device": device, "corrected_event_time": event_time,
        "watermark": watermark, "lateness_ms": round(lateness_s * 1000), "query_name": "windows", "batch_id": 1,
        "detected_at": detected_at,
    }


def correction(detected_at: datetime, batch_id: int, *, window_start: datetime, window_kind: str = "tumbling",
               length_s: int = 10, hop_s: int | None = None, app: str = "shop", kind: str = "metric",
               name: str = "latency_ms", late_events: int = 1, max_lateness_s: float = 5.0) -> dict[str, Any]:
    """A window re-published in micro-batch ``batch_id`` with ``late_events`` events that arrived behind the
    watermark while it was still open."""
    return {"window_kind": window_kind, "window_length_ms": length_s * 1000,
            "window_hop_ms": (hop_s or length_s) * 1000, "app": app, "kind": kind, "name": name, "series_tags": "",
            "window_start": window_start, "window_end": window_start + timedelta(seconds=length_s),
            "batch_id": batch_id, "late_events": late_events, "max_lateness_ms": round(max_lateness_s * 1000),
            "detected_at": detected_at}


def dead_letter(detected_at: datetime, offset: int, *, reason: str = "unparseable JSON",
                partition: int = 0) -> dict[str, Any]:
    """A record the job refused, keyed by its Kafka position."""
    raw = '{"v":1,"kind":'
    return {"source_topic": "eventide.events", "source_partition": partition, "source_offset": offset,
            "kafka_timestamp": detected_at - timedelta(seconds=2), "reason": reason, "raw": raw,
            "raw_bytes": len(raw), "detected_at": detected_at}


def progress(watermark: datetime, *, batch_id: int = 1, query_name: str = "windows",
             recorded_at: datetime | None = None) -> dict[str, Any]:
    """A micro-batch of ``query_name`` that ran with ``watermark``.

    ``sources`` is an empty JSON list: no processed offsets, so the consumer-lag probe has nothing to compare and
    never calls a broker (tests that start none would otherwise wait for its timeout).
    """
    recorded = recorded_at or _now()
    return {"query_name": query_name, "query_id": "q", "run_id": "r", "batch_id": batch_id,
            "batch_timestamp": recorded, "watermark": watermark, "input_rows": 100, "input_rows_per_second": 20.0,
            "processed_rows_per_second": 50.0, "rows_dropped_by_watermark": 0, "state_rows": 10,
            "state_memory_bytes": 1 << 20, "duration_ms": 500, "durations": "{}", "sources": "[]",
            "recorded_at": recorded}


def session(session_end: datetime, app: str, key: str, *, duration_s: float, events: int, gap_s: int = 300,
            errors: int = 0, key_kind: str = "user") -> dict[str, Any]:
    """A closed session ending at ``session_end`` (last event + gap)."""
    last_event = session_end - timedelta(seconds=gap_s)
    return {"gap_ms": gap_s * 1000, "app": app, "key_kind": key_kind, "session_key": key,
            "session_start": last_event - timedelta(seconds=duration_s), "session_end": session_end,
            "last_event_time": last_event, "duration_ms": round(duration_s * 1000), "event_count": events,
            "metric_count": events - errors, "log_count": errors, "level_debug": 0, "level_info": 0,
            "level_warning": 0, "level_error": errors, "level_critical": 0, "version": 1, "written_at": _now()}


def sliding_window(window_end: datetime, app: str, offset: int, *, kind: str = "log", name: str = "app.server",
                   length_s: int = 300, events: int = 5, errors: int = 0, value: float | None = None,
                   partition: int = 0) -> dict[str, Any]:
    """The trailing window ``(t_e − L, t_e]`` of the event at (``partition``, ``offset``)."""
    values = events if value is not None else 0
    return {"window_length_ms": length_s * 1000, "app": app, "kind": kind, "name": name, "series_tags": "",
            "window_start": window_end - timedelta(seconds=length_s), "window_end": window_end,
            "source_partition": partition, "source_offset": offset, "event_id": f"e-{offset}",
            "event_count": events, "value_count": values, "sum": (value or 0.0) * values, "min": value,
            "max": value, "mean": value, "rate": events / length_s, "level_debug": 0,
            "level_info": events - errors if kind == "log" else 0, "level_warning": 0, "level_error": errors,
            "level_critical": 0, "version": 1, "written_at": _now()}


def device_clock(app: str, device: str, batch_id: int, offset_s: float, last_received: datetime, *,
                 events: int = 10) -> dict[str, Any]:
    """One device's clock offsets (received − sent) seen in one micro-batch."""
    offset_ms = offset_s * 1000
    return {"app": app, "device": device, "batch_id": batch_id, "events": events,
            "offset_min_ms": round(offset_ms) - 50, "offset_max_ms": round(offset_ms) + 50,
            "offset_avg_ms": offset_ms, "last_received": last_received, "recorded_at": last_received}


def alert_state(rule: str, series: str, state: str, *, evaluated_until: datetime, since: datetime,
                value: float | None, threshold: float, severity: str = "warning",
                breaches: int = 1) -> dict[str, Any]:
    """Where one (rule, series) stands after evaluating windows up to ``evaluated_until``."""
    return {"rule": rule, "series": series, "state": state, "breaches": breaches,
            "evaluated_until": evaluated_until, "since": since, "value": value, "threshold": threshold,
            "severity": severity, "updated_at": _now()}


def alert_transition(rule: str, series: str, to_state: str, window_end: datetime, *, value: float | None,
                     threshold: float, severity: str = "warning") -> dict[str, Any]:
    """One transition, keyed as the evaluator keys it (rule, series, target state, window)."""
    return {"transition_key": f"{rule}|{series}|{to_state}|{window_end.isoformat()}", "rule": rule,
            "series": series, "to_state": to_state, "window_end": window_end, "value": value,
            "threshold": threshold, "severity": severity, "notify": int(to_state in ("firing", "resolved")),
            "recorded_at": _now()}
