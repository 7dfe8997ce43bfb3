"""Event envelope v1 (shared BRIEF §1): the one JSON object per Kafka record that every producer writes.

The constants here are the contract the stream job validates against (``analytics.accept.validation``), so both sides
of Kafka share one definition.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

ENVELOPE_VERSION: Final = 1
KINDS: Final = ("metric", "log")
LEVELS: Final = ("debug", "info", "warning", "error", "critical")
MAX_APP_CHARS: Final = 128
MAX_DEVICE_CHARS: Final = 128
MAX_NAME_CHARS: Final = 256


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def ms_of(ts: datetime) -> int:
    """``ts`` in the envelope's clock, milliseconds since the epoch (a naive time, as the store returns one, is UTC)."""
    return int((ts if ts.tzinfo else ts.replace(tzinfo=UTC)).timestamp() * 1000)


def utc_of(ms: int) -> datetime:
    """Milliseconds since the epoch as a UTC datetime (what the store's DateTime64 columns take)."""
    return datetime.fromtimestamp(ms / 1000, UTC)


def offset_clock(offset_ms: int) -> Callable[[], int]:
    """A device clock that reads true time + ``offset_ms`` (demo and tests simulate skewed devices with it)."""
    return lambda: now_ms() + offset_ms


def uuid7(unix_ms: int | None = None) -> str:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, version 7, 74 random bits. Sorts by creation time."""
    ms = now_ms() if unix_ms is None else unix_ms
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76                               # version
    value |= ((rand >> 62) & 0xFFF) << 64            # rand_a: 12 bits
    value |= 0b10 << 62                              # RFC 4122 variant
    value |= rand & ((1 << 62) - 1)                  # rand_b: 62 bits
    return str(uuid.UUID(int=value))


def _envelope(kind: str, *, app: str, device: str, name: str, event_time: int, sent_time: int,
              user: str | None, tags: Mapping[str, str] | None, event_id: str | None,
              **body: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "v": ENVELOPE_VERSION, "id": event_id or uuid7(), "kind": kind, "app": app, "device": device,
        "name": name, **body, "event_time": event_time, "sent_time": sent_time,
    }
    if user is not None:
        event["user"] = user
    if tags:
        event["tags"] = dict(tags)
    return event


def metric_event(*, app: str, device: str, name: str, value: float, event_time: int, sent_time: int,
                 user: str | None = None, tags: Mapping[str, str] | None = None,
                 event_id: str | None = None) -> dict[str, Any]:
    """A metric envelope as a dict (``json.dumps`` it for the wire)."""
    return _envelope("metric", app=app, device=device, name=name, event_time=event_time, sent_time=sent_time,
                     user=user, tags=tags, event_id=event_id, value=value)


def log_event(*, app: str, device: str, name: str, level: str, message: str, event_time: int, sent_time: int,
              user: str | None = None, tags: Mapping[str, str] | None = None,
              event_id: str | None = None) -> dict[str, Any]:
    """A log envelope as a dict; ``name`` is the logger name."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, not {level!r}")
    return _envelope("log", app=app, device=device, name=name, event_time=event_time, sent_time=sent_time,
                     user=user, tags=tags, event_id=event_id, level=level, message=message)


def encode(event: Mapping[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":"), allow_nan=False).encode()
