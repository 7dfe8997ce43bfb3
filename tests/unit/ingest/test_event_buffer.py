"""The SDK's bounded buffer on its own: what each overflow policy keeps, drops and counts (pure logic)."""

from __future__ import annotations

from ingest.sdk.buffer import EventBuffer


def test_drop_oldest_evicts_the_oldest_application_event_and_counts_it() -> None:
    buffer = EventBuffer(capacity=2, policy="drop_oldest")
    for event in ("a", "b", "c"):
        buffer.put(event)
    assert buffer.take(10) == ["b", "c"]
    assert buffer.dropped_oldest == 1
    assert buffer.counts() == (3, 0)


def test_drop_newest_refuses_the_new_event_and_counts_it() -> None:
    buffer = EventBuffer(capacity=2, policy="drop_newest")
    assert [buffer.put(event) for event in ("a", "b", "c")] == [True, True, False]
    assert buffer.take(10) == ["a", "b"]
    assert buffer.dropped_newest == 1
    assert buffer.counts() == (2, 0)


def test_health_events_are_never_evicted_and_never_counted_as_an_applications_drop() -> None:
    # Given a full buffer holding one of the SDK's own health reports ahead of the application's events,
    buffer = EventBuffer(capacity=2, policy="drop_oldest")
    buffer.put_unbounded("health")
    for event in ("a", "b", "c", "d"):
        buffer.put(event)
    # the overflow evicted application events only, and every count is about application events.
    assert buffer.dropped_oldest == 2
    assert buffer.counts() == (4, 2)
    assert len(buffer) == 3
    assert buffer.take(1) == ["health", "c"]
    assert buffer.take(10) == ["d"]
    assert buffer.counts() == (4, 0)
