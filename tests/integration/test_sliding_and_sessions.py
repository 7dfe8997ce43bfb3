"""Sliding windows and sessions (BRIEF §2-§3) from the keyed_windows query, with exact corrected times.

Each ``run_job`` is one micro-batch of new data and also a job restart (the queries stop when idle and start
again from their checkpoints), so these tests also show that sliding buffers, pending windows and open sessions
survive restarts.
"""

from __future__ import annotations

from eventide.config import SeriesSelector
from tests.support.pipeline import Event, produce_events, rows, run_job

S = 1000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000


def at(seconds: float) -> int:
    return T0 + int(seconds * S)


def configured(stack, **stream):
    return stack.model_copy(update={"stream": stack.stream.model_copy(update=stream)})


def sliding(config, name: str = "latency_ms") -> list[tuple]:
    return [((r["e"] - T0) / S, r["event_count"], r["sum"], r["min"], r["max"]) for r in rows(
        config, "SELECT toUnixTimestamp64Milli(window_end) AS e, event_count, sum, min, max FROM sliding_windows "
                f"FINAL WHERE name = '{name}' ORDER BY window_end, source_partition, source_offset")]


def dropped(config, kind: str) -> list[tuple]:
    return [((r["s"] - T0) / S, (r["e"] - T0) / S, r["device"], r["lateness_ms"] / S) for r in rows(
        config, "SELECT toUnixTimestamp64Milli(window_start) AS s, toUnixTimestamp64Milli(window_end) AS e, device, "
                f"lateness_ms FROM stragglers FINAL WHERE window_kind = '{kind}' ORDER BY window_start, device")]


def test_sliding_windows_trail_each_event_and_are_emitted_once_the_watermark_reaches_it(stack, spark):
    config = configured(stack, sliding_window_s=60,
                        sliding_series=[SeriesSelector(app="shop", kind="metric", name="latency_ms")])
    produce_events(config, [
        Event(at(0), 1.0),
        Event(at(30), 2.0),
        Event(at(60), 4.0),                    # exactly L after the first: (0, 60] leaves it out
        Event(at(60), 8.0, device="device-2"), # same instant: each window includes the other
        Event(at(10), 5.0, name="other"),      # not a sliding series
        Event(at(20), None, name="app.db", level="error"),     # logs at warning and above: sliding by default
        Event(at(40), None, name="app.db", level="info"),      # below warning: not in the series
        Event(at(50), None, name="app.db", level="warning"),
    ])
    run_job(spark, config)
    # Spark follows a batch with a no-data batch when the watermark moved (to 60 - 30 = 30 s): t_e <= 30 emitted.
    assert sliding(config) == [(0.0, 1, 1.0, 1.0, 1.0), (30.0, 2, 3.0, 1.0, 2.0)]

    produce_events(config, [Event(at(200), 16.0)])   # watermark -> 170 s after this batch
    run_job(spark, config)
    produce_events(config, [
        Event(at(150), 32.0, device="late"),     # behind the watermark: its own window is closed (straggler),
                                                 # but it still counts in the open window of t=200
        Event(at(170), 64.0, device="at-wm"),    # exactly at the watermark: late too
    ])
    run_job(spark, config)
    produce_events(config, [Event(at(400), 1.0)])     # watermark -> 370 s: the window of t=200 closes
    run_job(spark, config)
    run_job(spark, config)                            # a no-data batch fires the timers

    assert sliding(config) == [
        (0.0, 1, 1.0, 1.0, 1.0),
        (30.0, 2, 3.0, 1.0, 2.0),
        (60.0, 3, 14.0, 2.0, 8.0),
        (60.0, 3, 14.0, 2.0, 8.0),
        (200.0, 3, 112.0, 16.0, 64.0),
    ]
    assert [(e, n) for e, n, *_ in sliding(config, "app.db")] == [(20.0, 1), (50.0, 2)]
    assert dropped(config, "sliding") == [(90.0, 150.0, "late", 20.0), (110.0, 170.0, "at-wm", 0.0)]


def test_sessions_split_at_the_gap_and_late_events_cannot_change_an_emitted_session(stack, spark):
    config = configured(stack, session_gap_s=60)
    produce_events(config, [
        Event(at(0), user="ann"),
        Event(at(30), user="ann", level="error", name="app"),
        Event(at(90), user="ann"),                 # exactly G after the previous: a new session
        Event(at(100), user="ann"),
        Event(at(10), device="kiosk-9"),           # no user: sessions per device
    ])
    run_job(spark, config)
    produce_events(config, [Event(at(1000), user="bob")])   # watermark -> 970 s
    run_job(spark, config)
    run_job(spark, config)
    produce_events(config, [
        Event(at(20), user="ann", device="late"),            # joins [0, 90), already emitted: dropped
        Event(at(915), user="ann", device="open"),           # 915 + 60 > 970: its session is open
        Event(at(970), user="ann", device="at-wm"),          # exactly at the watermark: open, same session
    ])
    run_job(spark, config)
    produce_events(config, [Event(at(2000), user="bob")])   # closes everything before 1970 s
    run_job(spark, config)
    run_job(spark, config)

    sessions = [(r["app"], r["key_kind"], r["session_key"], (r["s"] - T0) / S, (r["e"] - T0) / S, r["event_count"],
                 r["duration_ms"] / S, r["metric_count"], r["log_count"], r["level_error"]) for r in rows(
        config, "SELECT app, key_kind, session_key, toUnixTimestamp64Milli(session_start) AS s, "
                "toUnixTimestamp64Milli(session_end) AS e, event_count, duration_ms, metric_count, log_count, "
                "level_error FROM sessions FINAL ORDER BY session_key, session_start")]
    assert sessions == [
        ("shop", "user", "ann", 0.0, 90.0, 2, 30.0, 1, 1, 1),
        ("shop", "user", "ann", 90.0, 160.0, 2, 10.0, 2, 0, 0),
        ("shop", "user", "ann", 915.0, 1030.0, 2, 55.0, 2, 0, 0),
        ("shop", "user", "bob", 1000.0, 1060.0, 1, 0.0, 1, 0, 0),
        ("shop", "device", "kiosk-9", 10.0, 70.0, 1, 0.0, 1, 0, 0),
    ]
    assert dropped(config, "session") == [(0.0, 90.0, "late", 950.0)]


def open_and_closed_sessions(config) -> tuple[list[tuple], list[tuple]]:
    """(sessions in progress, final sessions) as (key, start s, last event s, events)."""
    def read(sql: str) -> list[tuple]:
        return [(r["session_key"], (r["s"] - T0) / S, (r["l"] - T0) / S, r["event_count"]) for r in rows(config, sql)]
    columns = ("session_key, toUnixTimestamp64Milli(session_start) AS s, toUnixTimestamp64Milli(last_event_time) AS l, "
               "event_count")
    return (read(f"SELECT {columns} FROM open_sessions FINAL WHERE is_open ORDER BY session_key, session_start"),
            read(f"SELECT {columns} FROM sessions FINAL ORDER BY session_key, session_start"))


def test_a_session_is_shown_open_as_it_grows_and_then_only_as_its_final_row(stack, spark):
    config = configured(stack, session_gap_s=60)
    produce_events(config, [Event(at(0), user="ann"), Event(at(30), user="ann"), Event(at(10), device="kiosk-9")])
    run_job(spark, config)
    # One batch in: both sessions are open, with their events so far, and none is final.
    assert open_and_closed_sessions(config) == ([("ann", 0.0, 30.0, 2), ("kiosk-9", 10.0, 10.0, 1)], [])

    produce_events(config, [Event(at(50), user="ann")])
    run_job(spark, config)
    # ann's session grew: the same row, a newer version; kiosk-9's stands.
    assert open_and_closed_sessions(config) == ([("ann", 0.0, 50.0, 3), ("kiosk-9", 10.0, 10.0, 1)], [])

    produce_events(config, [Event(at(1000), user="bob")])   # watermark -> 970 s: ann's and kiosk-9's close
    run_job(spark, config)
    run_job(spark, config)
    # Each closed session is now only its final row, with the events it last showed; bob's is open.
    assert open_and_closed_sessions(config) == (
        [("bob", 1000.0, 1000.0, 1)], [("ann", 0.0, 50.0, 3), ("kiosk-9", 10.0, 10.0, 1)])


def test_keyed_windows_reads_only_the_events_it_uses_but_all_of_a_batch_chosen_under_other_settings(stack, spark):
    """``accept`` writes the rows ``keyed_windows`` takes (run heads, sliding series) first in each batch file and
    marks them for the settings that chose them: the query skips the rest, unless the settings changed since."""
    from analytics.job import run_until_idle

    before = configured(stack, sliding_window_s=60)           # latency_ms is not a sliding series yet
    produce_events(before, [Event(at(0), 1.0), Event(at(30), 2.0), Event(at(31), 4.0)])   # one run: head at 0
    run_until_idle(spark, before, ("accept",))
    after = configured(stack, sliding_window_s=60,
                       sliding_series=[SeriesSelector(app="shop", kind="metric", name="latency_ms")])
    produce_events(after, [Event(at(200), 8.0), Event(at(201), 5.0, name="other"),
                           Event(at(202), 5.0, name="other")])   # one run: head at 200; "other" is not sliding
    run_job(spark, after)

    # The first batch was marked for other settings: read whole, its latency events all get their windows.
    assert sliding(after) == [(0.0, 1, 1.0, 1.0, 1.0), (30.0, 2, 3.0, 1.0, 2.0), (31.0, 3, 7.0, 1.0, 4.0)]
    # The second was read by its marks: the run's head only (the two later events of the run are not needed).
    assert [r["input_rows"] for r in rows(after, "SELECT input_rows FROM pipeline_progress FINAL WHERE query_name "
                                               "= 'keyed_windows' AND input_rows > 0 ORDER BY batch_id")] == [3, 1]
