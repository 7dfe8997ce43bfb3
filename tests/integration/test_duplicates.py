"""Duplicates by event id count once (docs/time-semantics.md, "Duplicates").

A re-sent event carries the same ``id``; its copy reaches the broker later, so its corrected time differs by the
re-delivery delay. Whatever the copy's time, only the first copy counts in every window kind; the copies are
counted in ``duplicates`` and are never stragglers.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.testclient import TestClient

from eventide.config import SeriesSelector
from eventide.envelope import encode
from ingest.gateway.app import create_app
from ingest.sdk import Client
from ingest.sdk.spool import Spool, spool_directory
from stack import broker
from tests.support.pipeline import Event, minute_in_past, produce_events, produce_raw, rows, run_job
from tests.support.stack import fresh_stack

S = 1000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000   # an hour boundary


def copy_of(event: Event, delay_ms: int) -> bytes:
    """The same envelope (same id) re-delivered ``delay_ms`` later: the gateway stamps a later received_time."""
    envelope = event.envelope()
    return encode({**envelope, "id": f"id-{event.at}-{event.device}", "received_time":
                   envelope["received_time"] + delay_ms})


def original(event: Event) -> bytes:
    return copy_of(event, 0)


def counts(config: Any, sql: str) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for r in rows(config, sql)]


def tumbling_10s(config: Any) -> list[tuple[int, int, float]]:
    return counts(config, f"SELECT toUnixTimestamp64Milli(window_start) - {T0} AS start, event_count, sum "
                          "FROM window_aggregates FINAL WHERE window_kind = 'tumbling' AND window_length_ms = 10000 "
                          "ORDER BY window_start")


def test_copies_in_the_same_batch_in_a_later_batch_and_after_a_restart_count_once(stack, spark):
    config = stack.model_copy(update={"stream": stack.stream.model_copy(update={
        "sliding_window_s": 60, "session_gap_s": 60, "sliding_series": [SeriesSelector(name="latency_ms")]})})
    a, b = Event(T0 + 1 * S, 1.0, user="ann"), Event(T0 + 2 * S, 2.0, user="ann")
    # A's copy re-delivered 9 s later would land in the next 10 s window [T0+10 s, T0+20 s) if it counted.
    produce_raw(config, [original(a), original(b), copy_of(a, 9 * S)])
    run_job(spark, config)
    # A later batch (a new run of the queries, from their checkpoints): copies of A and B, and a new event C.
    c = Event(T0 + 3 * S, 4.0, user="ann")
    produce_raw(config, [copy_of(b, 1 * S), original(c), copy_of(a, 2 * S)])
    run_job(spark, config)
    produce_events(config, [Event(T0 + 600 * S, 0.0, user="flush", device="flush")])  # closes every window
    run_job(spark, config)

    assert tumbling_10s(config)[:1] == [(0, 3, 7.0)]                 # A, B, C once each
    assert len(tumbling_10s(config)) == 2                             # no window from A's late copy; the flush
    sliding = counts(config, "SELECT event_count, sum FROM sliding_windows FINAL WHERE event_id LIKE 'id-%' "
                             "ORDER BY window_end")
    assert sliding == [(1, 1.0), (2, 3.0), (3, 7.0)]                  # one trailing window per accepted event
    [(session_events,)] = counts(config, "SELECT event_count FROM sessions FINAL WHERE session_key = 'ann'")
    assert session_events == 3
    assert counts(config, "SELECT count() FROM stragglers FINAL") == [(0,)]
    assert counts(config, "SELECT app, event_id, count() FROM duplicates FINAL GROUP BY app, event_id "
                          "ORDER BY event_id") == [("shop", f"id-{a.at}-device-1", 2),
                                                   ("shop", f"id-{b.at}-device-1", 1)]
    [state] = rows(config, "SELECT sum(duplicates) AS duplicates, sum(accepted) AS accepted FROM dedup_state FINAL")
    assert state == {"duplicates": 3, "accepted": 4}


def test_a_late_copy_is_a_duplicate_not_a_straggler(stack, spark):
    """The copy arrives after the watermark closed the original's window: it would be a dropped straggler, but
    it is the same event, already counted."""
    a = Event(T0 + 1 * S, 1.0)
    produce_raw(stack, [original(a)])
    produce_events(stack, [Event(T0 + 100 * S, 1.0, device="later")])    # watermark moves to T0 + 70 s
    run_job(spark, stack)
    produce_raw(stack, [copy_of(a, 0)])
    run_job(spark, stack)

    assert counts(stack, "SELECT count() FROM stragglers FINAL") == [(0,)]
    assert counts(stack, "SELECT count() FROM duplicates FINAL") == [(1,)]
    assert tumbling_10s(stack)[0] == (0, 1, 1.0)


def test_a_copy_arriving_after_the_horizon_is_a_new_event(kafka, spark, request):
    """The dedup memory is bounded: an id is remembered for ``dedup_horizon_s`` of broker time after its first
    copy arrived. A copy arriving later is taken for a new event (here in a still-open window)."""
    config = fresh_stack(kafka, request.node.name, dedup_horizon_s=1)
    a = Event(T0 + 1 * S, 1.0)
    produce_raw(config, [original(a)])
    run_job(spark, config)
    time.sleep(1.5)
    produce_raw(config, [copy_of(a, 0)])
    run_job(spark, config)

    assert counts(config, "SELECT count() FROM duplicates FINAL") == [(0,)]
    assert tumbling_10s(config)[0] == (0, 2, 2.0)
    [state] = rows(config, "SELECT horizon_ids, horizon_ms FROM dedup_state FINAL ORDER BY batch_id DESC LIMIT 1")
    assert state == {"horizon_ids": 0, "horizon_ms": 1000}


def test_a_batch_retried_through_the_gateway_counts_once(stack, spark):
    """A client whose answer was lost ("written": "unknown") sends the same batch again."""
    config = stack.model_copy(update={"gateway": stack.gateway.model_copy(update={"tokens": ["t"]})})
    batch = [{k: v for k, v in Event(T0 + i * S, float(i)).envelope().items() if k != "received_time"}
             for i in range(1, 4)]
    with TestClient(create_app(config)) as client:
        for _ in range(2):
            # 503 (the gateway does not see the new topic yet) writes nothing and asks for a retry.
            deadline = time.monotonic() + 20
            while (status := client.post("/v1/events", headers={"Authorization": "Bearer t"},
                                         json=batch).status_code) == 503 and time.monotonic() < deadline:
                time.sleep(0.5)
            assert status == 200
    run_job(spark, config)

    assert [(n, total) for _, n, total in tumbling_10s(config)] == [(3, 6.0)]
    assert counts(config, "SELECT count() FROM duplicates FINAL") == [(3,)]


def test_an_sdk_spool_chunk_replayed_after_a_crash_counts_once(stack, spark):
    """The SDK was killed after Kafka acknowledged a replayed spool chunk but before it trimmed the spool: the
    next SDK process on that device replays the chunk again (same ids, new sent_time)."""
    t0 = minute_in_past()
    sdk = Client("shop", "phone-1", config=stack)
    for i in range(3):
        sdk.metric("latency_ms", float(i + 1), event_time=t0 + (i + 1) * S)
    assert sdk.flush()
    sdk.close()
    sent = broker.read_committed(stack)
    # What the spool held: the envelopes without their closing sent_time (ingest.sdk.sender stamps it at hand-off).
    bodies = [m.value()[:m.value().rindex(b',"sent_time":')] for m in sent]
    spool = Spool(spool_directory(stack.spool_dir, "shop", "phone-1"), 1 << 20, 1 << 20)
    spool.append(bodies)
    spool.close()
    restarted = Client("shop", "phone-1", config=stack)
    assert restarted.flush()
    restarted.close()
    assert len(broker.read_committed(stack)) == 6                     # every event twice in Kafka
    run_job(spark, stack)

    [window] = rows(stack, f"SELECT event_count, sum FROM window_aggregates FINAL WHERE window_kind = 'tumbling' "
                           f"AND window_length_ms = 10000 AND toUnixTimestamp64Milli(window_start) = {t0}")
    assert window == {"event_count": 3, "sum": 6.0}
    assert counts(stack, "SELECT count() FROM duplicates FINAL") == [(3,)]


def test_two_apps_using_the_same_id_are_two_events_and_each_apps_copy_counts_once(stack, spark):
    """An id is unique within its app (BRIEF §1): "shop" and "kiosk" both send an event with id "shared"; each is
    counted, and each app's own copy of it (in the same batch, and in a later one) is a duplicate."""
    def with_id(event: Event, delay_ms: int = 0) -> bytes:
        envelope = event.envelope()
        return encode({**envelope, "id": "shared", "received_time": envelope["received_time"] + delay_ms})

    shop, kiosk = Event(T0 + 1 * S, 1.0, app="shop"), Event(T0 + 2 * S, 2.0, app="kiosk", device="device-2")
    produce_raw(stack, [with_id(shop), with_id(kiosk), with_id(shop, 3 * S)])
    run_job(spark, stack)
    produce_raw(stack, [with_id(kiosk, 4 * S)])
    produce_events(stack, [Event(T0 + 600 * S, 0.0, app="flush", device="flush")])   # closes every window
    run_job(spark, stack)

    assert counts(stack, "SELECT app, event_count, sum FROM window_aggregates FINAL WHERE window_kind = 'tumbling' "
                         "AND window_length_ms = 10000 AND app != 'flush' ORDER BY app") == [("kiosk", 1, 2.0),
                                                                                            ("shop", 1, 1.0)]
    assert counts(stack, "SELECT app, event_id, count() FROM duplicates FINAL GROUP BY app, event_id "
                         "ORDER BY app") == [("kiosk", "shared", 1), ("shop", "shared", 1)]
