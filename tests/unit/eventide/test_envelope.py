"""Envelope v1 helpers (pure logic)."""

from __future__ import annotations

import json
import uuid

import pytest

from eventide.envelope import encode, log_event, metric_event, uuid7


def test_uuid7_carries_version_variant_and_time_and_sorts_by_time():
    a, b = uuid7(1_700_000_000_000), uuid7(1_700_000_000_001)
    parsed = uuid.UUID(a)
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert parsed.int >> 80 == 1_700_000_000_000
    assert a < b
    assert len({uuid7(5) for _ in range(1000)}) == 1000


def test_metric_and_log_envelopes_have_the_v1_fields():
    m = metric_event(app="a", device="d", name="n", value=1.5, event_time=1, sent_time=2, user="u",
                     tags={"k": "v"})
    assert {k: m[k] for k in ("v", "kind", "app", "device", "name", "value", "event_time", "sent_time",
                              "user", "tags")} == {"v": 1, "kind": "metric", "app": "a", "device": "d", "name": "n",
                                                   "value": 1.5, "event_time": 1, "sent_time": 2, "user": "u",
                                                   "tags": {"k": "v"}}
    log = log_event(app="a", device="d", name="logger", level="error", message="boom", event_time=1, sent_time=1)
    assert (log["kind"], log["level"], log["message"], "user" in log) == ("log", "error", "boom", False)
    assert json.loads(encode(log)) == log


def test_invalid_level_and_non_finite_values_are_refused_at_the_source():
    with pytest.raises(ValueError, match="level"):
        log_event(app="a", device="d", name="n", level="fatal", message="m", event_time=1, sent_time=1)
    with pytest.raises(ValueError):
        encode(metric_event(app="a", device="d", name="n", value=float("nan"), event_time=1, sent_time=1))
