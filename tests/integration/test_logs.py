"""Every accepted log line is stored once in ``logs``, with the time the windows use (docs/dashboard.md, "Finding a
log line"): re-sent copies, replayed micro-batches, late lines and skewed device clocks included.

Given log events with known messages sent through Kafka and the real stream job, the ``logs`` table holds exactly
those lines. The search itself (words, phrases, tags) has its own tests over this table
(tests/test_log_search.py).
"""

from __future__ import annotations

from typing import Any

from eventide.envelope import encode, log_event
from tests.support.pipeline import Event, minute_in_past, produce_events, produce_raw, rows, run_job

S = 1000


def log_line(at: int, message: str, *, event_id: str, level: str = "error", app: str = "shop",
             device: str = "device-1", skew_ms: int = 0, offline_ms: int = 0, delay_ms: int = 0,
             user: str | None = None, tags: dict[str, str] | None = None) -> bytes:
    """A log line that truly happened at ``at`` on a device whose clock is ``skew_ms`` ahead, sent ``offline_ms``
    later and reaching the gateway ``delay_ms`` after that (``received_time``, server clock). Its corrected time is
    ``at`` + ``delay_ms``: the job takes transport delay for clock offset (BRIEF §1)."""
    event = log_event(app=app, device=device, name="app.server", level=level, message=message,
                      event_time=at + skew_ms, sent_time=at + skew_ms + offline_ms, user=user, tags=tags,
                      event_id=event_id)
    return encode({**event, "received_time": at + offline_ms + delay_ms})


def stored(config: Any) -> list[dict[str, Any]]:
    return rows(config, "SELECT event_id, message, level, app, device, user, tags, "
                        "toUnixTimestamp64Milli(corrected_event_time) AS t, toUnixTimestamp64Milli(event_time) AS "
                        "device_t FROM logs ORDER BY event_id")


def test_given_copies_a_skewed_clock_and_tags_then_each_line_is_stored_once_with_its_corrected_time(stack, spark):
    t0 = minute_in_past()
    lines = [
        log_line(t0 + 1 * S, "payment declined for order 17", event_id="a", user="u-42",
                 tags={"order": "17", "region": "eu"}),
        log_line(t0 + 2 * S, "cache warm", event_id="b", level="info", device="phone-9", skew_ms=3_600_000),
        log_line(t0 + 3 * S, "payment declined for order 18", event_id="c", app="search"),
    ]
    copy_of_a = log_line(t0 + 1 * S, "payment declined for order 17", event_id="a", user="u-42",
                         tags={"order": "17", "region": "eu"}, delay_ms=4 * S)
    produce_raw(stack, [*lines, copy_of_a])            # the copy in the same batch
    run_job(spark, stack)
    produce_raw(stack, [copy_of_a])                    # and in a later one
    run_job(spark, stack)

    assert stored(stack) == [
        {"event_id": "a", "message": "payment declined for order 17", "level": "error", "app": "shop",
         "device": "device-1", "user": "u-42", "tags": {"order": "17", "region": "eu"}, "t": t0 + 1 * S,
         "device_t": t0 + 1 * S},
        # An hour-fast clock: the device said t0 + 1 h + 2 s, the line is stored at the corrected t0 + 2 s.
        {"event_id": "b", "message": "cache warm", "level": "info", "app": "shop", "device": "phone-9", "user": "",
         "tags": {}, "t": t0 + 2 * S, "device_t": t0 + 3_600_000 + 2 * S},
        {"event_id": "c", "message": "payment declined for order 18", "level": "error", "app": "search",
         "device": "device-1", "user": "", "tags": {}, "t": t0 + 3 * S, "device_t": t0 + 3 * S},
    ]
    [duplicates] = rows(stack, "SELECT count() AS n FROM duplicates FINAL")
    assert duplicates["n"] == 2


def test_given_a_line_whose_window_had_closed_then_it_is_stored_and_known_as_a_straggler(stack, spark):
    t0 = minute_in_past()
    produce_raw(stack, [log_line(t0 + 1 * S, "on time", event_id="on-time")])
    produce_events(stack, [Event(t0 + 300 * S, 1.0, device="later")])      # the watermark passes t0 + 240 s
    run_job(spark, stack)
    produce_raw(stack, [log_line(t0 + 2 * S, "too late for its window", event_id="late", offline_ms=400 * S)])
    run_job(spark, stack)

    assert [(r["event_id"], r["t"]) for r in stored(stack)] == [("late", t0 + 2 * S), ("on-time", t0 + 1 * S)]
    late = rows(stack, "SELECT DISTINCT event_id FROM stragglers FINAL")
    assert late == [{"event_id": "late"}]


def test_given_a_replayed_accept_batch_then_the_logs_table_gains_nothing(stack, spark):
    """A crash after the batch's rows were written and before Spark committed it: on restart Spark runs the batch
    again (same offsets), which writes the same lines again; the table keeps one of each."""
    t0 = minute_in_past()
    produce_raw(stack, [log_line(t0 + i * S, f"line {i}", event_id=f"id-{i}") for i in range(5)])
    run_job(spark, stack)
    commits = stack.checkpoint_dir / "accept" / "commits"
    last = max(commits.glob("[0-9]*"), key=lambda p: int(p.name))
    last.unlink()                                      # as if the job had died before committing the batch
    run_job(spark, stack)

    assert last.exists()                               # the batch ran again
    assert [r["message"] for r in stored(stack)] == [f"line {i}" for i in range(5)]


def test_given_metrics_and_a_log_then_only_the_log_is_a_line(stack, spark):
    t0 = minute_in_past()
    produce_events(stack, [Event(t0 + S, 2.0), Event(t0 + 2 * S, None, level="warning")])
    run_job(spark, stack)

    [line] = stored(stack)
    assert (line["level"], line["message"], line["t"]) == ("warning", "m", t0 + 2 * S)
