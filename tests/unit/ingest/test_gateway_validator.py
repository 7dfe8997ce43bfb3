"""The gateway's pure-Python envelope validator gives the stream job's reasons
(``analytics.accept.validation._rules``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from eventide.envelope import encode, log_event, metric_event
from ingest.gateway.validation import json_type, loads, validation_error

LIMIT = 65536


def _metric(**changes: Any) -> dict[str, Any]:
    event = metric_event(app="shop", device="d1", name="latency_ms", value=1.5, event_time=1_000, sent_time=2_000)
    event.update(changes)
    return event


def _log(**changes: Any) -> dict[str, Any]:
    event = log_event(app="shop", device="d1", name="payments", level="error", message="declined",
                      event_time=1_000, sent_time=2_000)
    event.update(changes)
    return event


def _without(event: dict[str, Any], field: str) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != field}


RAW_TEXT: dict[int, str] = {}


def _raw(text: str) -> Any:
    """An event parsed from ``text``; the parity test sends ``text`` itself (``1e999`` has no Python spelling)."""
    event = loads(text)
    RAW_TEXT[id(event)] = text
    return event


# Raw JSON text, so number spellings (5.0, 1e999, huge integers) reach the validator as a client sends them.
BAD: list[tuple[object, str]] = [
    ([1, 2, 3], "not a JSON object"),
    ("event", "not a JSON object"),
    (_without(_metric(), "v"), "missing field: v"),
    (_metric(v=None), "missing field: v"),
    (_metric(v="1"), "mistyped field: v (expected integer, got STRING)"),
    (_metric(v=True), "mistyped field: v (expected integer, got BOOLEAN)"),
    (_metric(v=2), "unsupported envelope version: 2"),
    (_without(_metric(), "id"), "missing field: id"),
    (_metric(id=7), "mistyped field: id (expected string, got BIGINT)"),
    (_metric(id=""), "invalid field: id must not be empty"),
    (_metric(kind="trace"), "invalid field: kind must be one of metric, log"),
    (_metric(kind=["metric"]), "mistyped field: kind (expected string, got ARRAY<STRING>)"),
    (_metric(app=42), "mistyped field: app (expected string, got BIGINT)"),
    (_metric(app=""), "invalid field: app must be 1-128 characters"),
    (_metric(device="d" * 129), "invalid field: device must be 1-128 characters"),
    (_metric(name="n" * 257), "invalid field: name must be 1-256 characters"),
    (_without(_metric(), "event_time"), "missing field: event_time"),
    (_metric(event_time="1700000000000"), "mistyped field: event_time (expected integer ms, got STRING)"),
    (_raw('{"v":1,"id":"x","kind":"metric","app":"a","device":"d","name":"n","value":1,'
          '"event_time":5.0,"sent_time":6}'), "mistyped field: event_time (expected integer ms, got DECIMAL(1,0))"),
    (_metric(sent_time=False), "mistyped field: sent_time (expected integer ms, got BOOLEAN)"),
    (_metric(sent_time=2**63), "mistyped field: sent_time (expected integer ms, got DECIMAL(19,0))"),
    (_metric(received_time="now"), "mistyped field: received_time (expected integer ms, got STRING)"),
    (_metric(user=5), "mistyped field: user (expected string, got BIGINT)"),
    (_metric(tags={"region": 1}), "mistyped field: tags (expected object of strings, got OBJECT<region: BIGINT>)"),
    (_metric(tags=["eu"]), "mistyped field: tags (expected object of strings, got ARRAY<STRING>)"),
    # Keys that are not plain identifiers are quoted in the type; a ': ' inside a key is not a separator.
    (_metric(tags={"zone: STRING, b": 1}),
     "mistyped field: tags (expected object of strings, got OBJECT<`zone: STRING, b`: BIGINT>)"),
    (_metric(tags={"x`y": "z", "9": "a", "_ok9": 1}),
     "mistyped field: tags (expected object of strings, got OBJECT<`9`: STRING, _ok9: BIGINT, `x``y`: STRING>)"),
    (_without(_metric(), "value"), "missing field: value"),
    (_metric(value="12"), "mistyped field: value (expected number, got STRING)"),
    (_metric(value=True), "mistyped field: value (expected number, got BOOLEAN)"),
    (_raw('{"v":1,"id":"x","kind":"metric","app":"a","device":"d","name":"n","value":1e999,'
          '"event_time":1,"sent_time":2}'), "invalid field: value must be finite"),
    (_without(_log(), "level"), "missing field: level"),
    (_log(level="fatal"), "invalid field: level must be one of debug, info, warning, error, critical"),
    (_log(level=3), "invalid field: level must be one of debug, info, warning, error, critical"),
    (_without(_log(), "message"), "missing field: message"),
    (_log(message={"text": "x"}), "mistyped field: message (expected string, got OBJECT<text: STRING>)"),
    (_metric(event_time=5_000, sent_time=4_000), "event_time is after sent_time"),
    # Rules run in the stream job's order: the first failure is the reason.
    (_metric(v=2, app=42), "unsupported envelope version: 2"),
    (_metric(app=42, event_time="x"), "mistyped field: app (expected string, got BIGINT)"),
]


@pytest.mark.parametrize(("event", "reason"), BAD, ids=[reason for _, reason in BAD])
def test_bad_events_get_the_stream_jobs_reason(event: object, reason: str) -> None:
    assert validation_error(event, LIMIT) == reason


def test_record_too_large_is_checked_first_and_measured_as_written() -> None:
    event = _metric(name="x" * 70_000, v=2)
    size = len(encode(event))
    assert validation_error(event, LIMIT) == f"record too large: {size} bytes > {LIMIT}"
    assert validation_error(_metric(), 100, record_bytes=101) == "record too large: 101 bytes > 100"


VALID: list[dict[str, Any]] = [
    _metric(),
    _log(),
    _metric(value=3, user="u-1", tags={"region": "eu"}, received_time=2_500),
    _metric(user=None, tags=None, received_time=None),   # null optional fields count as absent
    _metric(event_time=2_000, sent_time=2_000),
    _metric(value=-(10**300)),
    _metric(extra={"anything": [1, "x"]}),                # unknown fields are ignored, as in the stream job
    _metric(app="é" * 128),
    _metric(tags={"a b": "x", "zone: BIGINT": "eu", "back`quote": "y"}),   # keys Spark prints quoted
]


@pytest.mark.parametrize("event", VALID)
def test_valid_events_pass(event: dict[str, Any]) -> None:
    assert validation_error(event, LIMIT) is None


def test_json_types_are_named_as_spark_names_them() -> None:
    # Measured with schema_of_variant(try_parse_json(...)) on Spark 4.1.
    spark_says = {
        "5": "BIGINT", "5.0": "DECIMAL(1,0)", "1.50": "DECIMAL(2,1)", "100.0": "DECIMAL(3,0)",
        "0.001": "DECIMAL(3,3)", "1e3": "DOUBLE", "9223372036854775808": "DECIMAL(19,0)",
        "123456789012345678901234567890123456789012": "DOUBLE", "null": "VOID", "true": "BOOLEAN",
        '{"b":1,"a":"x"}': "OBJECT<a: STRING, b: BIGINT>", "[]": "ARRAY<VOID>", "[1,2.5]": "ARRAY<DECIMAL(21,1)>",
        '[1,"a",null]': "ARRAY<VARIANT>", '[{"a":1},{"b":2}]': "ARRAY<OBJECT<a: BIGINT, b: BIGINT>>",
        '{"a b":1,"9":1,"x`y":"z","_ok9":1}': "OBJECT<`9`: BIGINT, _ok9: BIGINT, `a b`: BIGINT, `x``y`: STRING>",
    }
    assert {text: json_type(loads(text)) for text in spark_says} == spark_says


def test_loads_refuses_non_json_constants_and_keeps_floats_usable() -> None:
    with pytest.raises(ValueError, match="NaN is not valid JSON"):
        loads('{"value": NaN}')
    parsed = loads('{"value": 1.25}')
    assert parsed["value"] == 1.25
    assert json.dumps(parsed) == '{"value": 1.25}'
