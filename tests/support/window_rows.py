"""Window rows as the stream job writes them, sketches included, built from known events (SQL-layer tests)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from datasketches import hll_sketch, kll_doubles_sketch

from eventide.config import Config
from store.client import connect
from store.range_query import SeriesKey

SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class Event:
    at: datetime
    value: float | None = None
    user: str | None = None
    device: str = "device-1"
    level: str | None = None


def window_row(config: Config, series: SeriesKey, start: datetime, length: timedelta, events: list[Event], *,
               kind: str = "tumbling", hop: timedelta | None = None, version: int = 2) -> dict[str, Any]:
    """The row the job would write for this window, sketches included."""
    values = [e.value for e in events if e.value is not None]
    kll = kll_doubles_sketch(config.stream.kll_k)
    users, devices = hll_sketch(config.stream.hll_lg_k), hll_sketch(config.stream.hll_lg_k)
    for v in values:
        kll.update(v)
    for e in events:
        if e.user is not None:
            users.update(e.user)
        devices.update(e.device)
    seconds = length / SECOND
    return {
        "window_kind": kind, "window_length_ms": length // timedelta(milliseconds=1),
        "window_hop_ms": (hop or length) // timedelta(milliseconds=1),
        "window_start": start, "window_end": start + length,
        "app": series.app, "kind": series.kind, "name": series.name, "series_tags": series.series_tags,
        "event_count": len(events), "value_count": len(values), "sum": math.fsum(values),
        "min": min(values, default=None), "max": max(values, default=None),
        "mean": math.fsum(values) / len(values) if values else None, "rate": len(events) / seconds,
        **{col: kll.get_quantile(q, inclusive=True) if values else None
           for col, q in {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p999": 0.999}.items()},
        "distinct_users": round(users.get_estimate()), "distinct_devices": round(devices.get_estimate()),
        "value_sketch": kll.serialize() if values else b"",
        "users_sketch": users.serialize_compact(), "devices_sketch": devices.serialize_compact(),
        **{f"level_{lvl}": sum(e.level == lvl for e in events)
           for lvl in ("debug", "info", "warning", "error", "critical")},
        "version": version, "written_at": datetime.now(UTC),
    }


def insert(config: Config, rows: list[dict[str, Any]]) -> None:
    columns = list(rows[0])
    with connect(config) as client:
        client.insert("window_aggregates", [[r[c] for c in columns] for r in rows], column_names=columns)
