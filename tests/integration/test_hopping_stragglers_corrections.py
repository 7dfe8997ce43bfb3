"""Tumbling and hopping windows under the watermark: exact window edges, corrections from late events, exactly
counted dropped stragglers, finality (BRIEF §2-§3). Events carry exact corrected times (``support.Event``);
each ``run_job`` is one micro-batch of new data, so the watermark of a step is (max time of earlier steps) - 30 s.
"""

from __future__ import annotations

from tests.support.pipeline import Event, produce_events, rows, run_job, wait_until

S = 1000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000   # an hour boundary, so every window edge is a round number


def at(seconds: float) -> int:
    return T0 + int(seconds * S)


def windows(config, kind: str, length_s: int, where: str = "1") -> list[tuple[int, int, int, float]]:
    """(start s, end s, count, sum) of the latest version of each window, relative to T0."""
    return [(int((r["s"] - T0) / S), int((r["e"] - T0) / S), r["event_count"], r["sum"]) for r in rows(
        config,
        f"SELECT toUnixTimestamp64Milli(window_start) AS s, toUnixTimestamp64Milli(window_end) AS e, event_count, sum"
        f" FROM window_results WHERE window_kind = '{kind}' AND window_length_ms = {length_s * S} AND {where}"
        f" ORDER BY window_start")]


def test_hopping_windows_hold_every_event_in_length_over_hop_windows(stack, spark):
    produce_events(stack, [
        Event(at(60), 1.0),          # exactly on a hop boundary: starts its newest window [60, 360)
        Event(at(299.999), 2.0),     # last ms of [0, 300)
        Event(at(300), 4.0),         # first ms of [300, 600): not in [0, 300)
    ])
    run_job(spark, stack)
    assert windows(stack, "hopping", 300) == [
        (-180, 120, 1, 1.0),
        (-120, 180, 1, 1.0),
        (-60, 240, 1, 1.0),
        (0, 300, 2, 3.0),
        (60, 360, 3, 7.0),
        (120, 420, 2, 6.0),
        (180, 480, 2, 6.0),
        (240, 540, 2, 6.0),
        (300, 600, 1, 4.0),
    ]
    assert windows(stack, "tumbling", 60) == [(60, 120, 1, 1.0), (240, 300, 1, 2.0), (300, 360, 1, 4.0)]


def _tumbling_60s_at_120(config) -> list[dict]:
    """The rows FINAL reads of the tumbling 60 s window [120, 180): what a reader sees, whatever merges ran."""
    return rows(config, "SELECT event_count, version FROM window_aggregates FINAL WHERE window_kind = 'tumbling' "
                        f"AND window_length_ms = 60000 AND window_start = fromUnixTimestamp64Milli({at(120)}, 'UTC')")


def test_late_events_correct_open_windows_and_are_counted_when_their_window_closed(stack, spark):
    produce_events(stack, [Event(at(100), 1.0), Event(at(130), 2.0), Event(at(200), 4.0)])
    run_job(spark, stack)
    [published] = _tumbling_60s_at_120(stack)
    assert published["event_count"] == 1
    # watermark is now 200 - 30 = 170 s
    produce_events(stack, [
        Event(at(165), 10.0, device="late-a"),   # [160,170) closed at 170: dropped; [120,180) open: corrected
        Event(at(170), 20.0, device="late-b"),   # exactly at the watermark: [170,180) is open, counted
        Event(at(50), 40.0, device="late-c"),    # 120 s late: dropped from [50,60), [0,60) and 2 hopping windows
    ])
    run_job(spark, stack)

    assert windows(stack, "tumbling", 10) == [
        (100, 110, 1, 1.0), (130, 140, 1, 2.0), (170, 180, 1, 20.0), (200, 210, 1, 4.0)]
    # [120, 180) was published with 1 event, then corrected to 3: readers see only the newest version.
    assert windows(stack, "tumbling", 60) == [(60, 120, 1, 1.0), (120, 180, 3, 32.0), (180, 240, 1, 4.0)]
    # The correction is a newer version of the same row, never a second row. Read through FINAL before and after
    # (a background merge may already have dropped the older version; FINAL's answer is the same either way).
    [corrected_row] = _tumbling_60s_at_120(stack)
    assert corrected_row["event_count"] == 3 and corrected_row["version"] > published["version"]
    # late-c still counts in the three hopping windows that were open: [0,300), [-60,240), [-120,180)
    hopping = {(s, e): n for s, e, n, _ in windows(stack, "hopping", 300)}
    assert hopping[(0, 300)] == 6 and hopping[(-60, 240)] == 6 and hopping[(-120, 180)] == 5

    dropped = [(r["window_kind"], r["window_length_ms"] // S, (r["ws"] - T0) // S, (r["we"] - T0) // S, r["device"],
                r["lateness_ms"]) for r in rows(
        stack, "SELECT window_kind, window_length_ms, toUnixTimestamp64Milli(window_start) AS ws, "
               "toUnixTimestamp64Milli(window_end) AS we, device, lateness_ms FROM stragglers FINAL "
               "ORDER BY window_kind, window_length_ms, window_start")]
    assert dropped == [
        ("hopping", 300, -240, 60, "late-c", 120 * S),
        ("hopping", 300, -180, 120, "late-c", 120 * S),
        ("tumbling", 10, 50, 60, "late-c", 120 * S),
        ("tumbling", 10, 160, 170, "late-a", 5 * S),
        ("tumbling", 60, 0, 60, "late-c", 120 * S),
    ]
    [events] = rows(stack, "SELECT uniqExact(source_partition, source_offset) AS n FROM stragglers FINAL")
    assert events["n"] == 2

    # Corrections: late events (behind the watermark 170) absorbed by windows still open. late-a (165) and
    # late-c (50); late-b (170) is not behind the watermark.
    corrected = [(r["window_kind"], r["window_length_ms"] // S, (r["ws"] - T0) // S, r["late_events"]) for r in rows(
        stack, "SELECT window_kind, window_length_ms, toUnixTimestamp64Milli(window_start) AS ws, late_events "
               "FROM corrections FINAL ORDER BY window_kind, window_length_ms, window_start")]
    assert corrected == [
        ("hopping", 300, -120, 2), ("hopping", 300, -60, 2), ("hopping", 300, 0, 2), ("hopping", 300, 60, 1),
        ("hopping", 300, 120, 1), ("tumbling", 60, 120, 1)]

    # Progress: the watermark each batch ran with, and Spark's own dropped-rows signal.
    wait_until(lambda: rows(stack, "SELECT max(watermark) = fromUnixTimestamp64Milli("
                                   f"{at(170)}, 'UTC') AS ok FROM pipeline_progress WHERE query_name = 'windows'"
                            )[0]["ok"] == 1)
    [spark_signal] = rows(stack, "SELECT max(rows_dropped_by_watermark) AS n FROM pipeline_progress "
                                 "WHERE query_name = 'windows'")
    assert spark_signal["n"] >= 1
    finality = {(int((r["s"] - T0) / S)): r["is_final"] for r in rows(
        stack, "SELECT toUnixTimestamp64Milli(window_start) AS s, is_final FROM window_results "
               "WHERE window_kind = 'tumbling' AND window_length_ms = 10000")}
    assert finality == {100: 1, 130: 1, 170: 0, 200: 0}
