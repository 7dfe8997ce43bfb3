"""Malformed records go to the dead-letter table and topic with a reason; good records in the same stream count."""

from __future__ import annotations

import json

from confluent_kafka import Consumer, Producer

from eventide.envelope import encode, metric_event
from store.client import connect
from tests.support.pipeline import Metric, minute_in_past, produce, produce_raw, run_job, window_rows


def _good(**overrides):
    event = metric_event(app="shop", device="d1", name="latency_ms", value=1.0,
                         event_time=minute_in_past() + 1000, sent_time=minute_in_past() + 2000)
    event.update(overrides)
    return event


def _without(field):
    event = _good()
    del event[field]
    return encode(event)


MALFORMED = {
    b"{this is not json": "unparseable JSON",
    b"[1, 2, 3]": "not a JSON object",
    _without("value"): "missing field: value",
    _without("id"): "missing field: id",
    encode(_good(app=42)): "mistyped field: app (expected string, got BIGINT)",
    encode(_good(event_time="1700000000000")): "mistyped field: event_time (expected integer ms, got STRING)",
    encode(_good(value="12")): "mistyped field: value (expected number, got STRING)",
    b'{"v":1,"id":"x","kind":"metric","app":"a","device":"d","name":"n","value":1e999,'
    b'"event_time":1,"sent_time":2}': "invalid field: value must be finite",
    encode(_good(v=2)): "unsupported envelope version: 2",
    encode(_good(kind="trace")): "invalid field: kind must be one of metric, log",
    encode(_good(event_time=5000, sent_time=4000)): "event_time is after sent_time",
    encode(_good(tags={"region": 1})): "mistyped field: tags (expected object of strings, got OBJECT<region: BIGINT>)",
}
TOO_LARGE = encode(_good(name="x" * 70_000))
MALFORMED[TOO_LARGE] = f"record too large: {len(TOO_LARGE)} bytes > 65536"   # the default envelope.max_record_bytes


def test_malformed_records_are_dead_lettered_with_reasons_and_good_ones_still_count(stack, spark):
    t0 = minute_in_past()
    produce(stack, [Metric(t0 + 1000, 1.0)])
    produce_raw(stack, list(MALFORMED))
    produce(stack, [Metric(t0 + 2000, 2.0), Metric(t0 + 3000, 3.0)])
    run_job(spark, stack)

    [window] = window_rows(stack, 10)
    assert (window["event_count"], window["sum"]) == (3, 6.0)

    with connect(stack) as client:
        stored = client.query("SELECT raw, reason, raw_bytes FROM dead_letters FINAL").result_rows
    # Each record once, as it was sent (the one over the limit truncated to it), with its reason and full size.
    truncated = TOO_LARGE[:stack.envelope.max_record_bytes]
    assert sorted((raw.encode(), reason, raw_bytes) for raw, reason, raw_bytes in stored) == sorted(
        (truncated if raw is TOO_LARGE else raw, reason, len(raw)) for raw, reason in MALFORMED.items())

    # The dead-letter topic carries each original record, byte for byte, with its reason in a header.
    consumer = Consumer({"bootstrap.servers": stack.kafka.bootstrap, "group.id": "dlq-check",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([stack.kafka.dead_letter_topic])
    letters = []
    try:
        while len(letters) < len(MALFORMED):
            msg = consumer.poll(10)
            assert msg is not None, f"only {len(letters)} dead letters on the topic"
            letters.append((msg.value(), dict(msg.headers())["reason"].decode()))
    finally:
        consumer.close()
    assert sorted(letters) == sorted(MALFORMED.items())


def test_a_record_as_large_as_the_topic_takes_is_dead_lettered_whole_and_the_records_around_it_count(stack, spark):
    """Producers other than ours may send records up to the events topic's largest message (kafka.max_message_bytes),
    many times the record limit: the table keeps the record's first bytes and its size, the topic gets it whole."""
    t0 = minute_in_past()
    huge = encode(_good(name="y" * (stack.kafka.max_message_bytes - 10_000)))
    produce(stack, [Metric(t0 + 1000, 1.0)])
    producer = Producer({"bootstrap.servers": stack.kafka.bootstrap,
                         "message.max.bytes": stack.kafka.max_message_bytes})
    producer.produce(stack.kafka.events_topic, huge)
    assert producer.flush(30) == 0
    produce(stack, [Metric(t0 + 2000, 2.0)])
    run_job(spark, stack)

    [window] = window_rows(stack, 10)
    assert (window["event_count"], window["sum"]) == (2, 3.0)
    limit = stack.envelope.max_record_bytes
    with connect(stack) as client:
        stored = client.query("SELECT raw, reason, raw_bytes FROM dead_letters FINAL").result_rows
    assert stored == [(huge[:limit].decode(), f"record too large: {len(huge)} bytes > {limit}", len(huge))]

    consumer = Consumer({"bootstrap.servers": stack.kafka.bootstrap, "group.id": "dlq-check",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([stack.kafka.dead_letter_topic])
    try:
        msg = consumer.poll(10)
        assert msg is not None, "no dead letter on the topic"
        assert msg.value() == huge
        headers = dict(msg.headers())
        assert headers["reason"].decode() == stored[0][1]
        assert headers["source"].decode().startswith(f"{stack.kafka.events_topic}/")
        assert consumer.poll(2) is None, "the record was forwarded more than once"
    finally:
        consumer.close()


def test_unparseable_records_never_stop_the_job(stack, spark):
    t0 = minute_in_past()
    produce_raw(stack, [b"\xff\xfe binary junk", b"", b"null", json.dumps({"v": 1}).encode()])
    produce(stack, [Metric(t0 + 1000, 5.0)])
    run_job(spark, stack)
    [window] = window_rows(stack, 10)
    assert window["event_count"] == 1
    with connect(stack) as client:
        assert client.query("SELECT count() FROM dead_letters FINAL").result_rows[0][0] == 4
