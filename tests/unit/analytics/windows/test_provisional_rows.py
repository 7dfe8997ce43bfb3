"""Provisional window rows: after each accept batch, a window's row as its events so far make it.

Given accept batches of events (their window partials) and the row the store holds for a window, the provisional
row is that row plus the partials of the accept batches it does not cover: the row the events of all those batches
give, never one counting a batch twice, and never one for a window the ``windows`` query may still close before
taking these events (``analytics.windows.provisional``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from analytics.accepted_log import BatchMeta
from analytics.rounds import covered, reader_version, watermark_bound_ms, worth_writing
from analytics.vocabulary import ARROW_TIME
from analytics.windows.partials import partials
from analytics.windows.provisional import (
    BatchPartials,
    by_window,
    provisional_rows,
    provisional_version,
    reusable,
)
from eventide.config import load_config
from store.range_query import SeriesKey
from tests.support.window_rows import Event, window_row

T0_MS = int(datetime(2026, 11, 29, 12, 0, tzinfo=UTC).timestamp() * 1000)
CONFIG = load_config(environ={})   # tumbling 10 s and 60 s, hopping 300 s every 60 s; and the allowed lateness
NOW = datetime(2026, 11, 29, 12, 5, tzinfo=UTC)
LATENCY = SeriesKey("shop", "metric", "latency_ms", "")


def at(ms: int) -> datetime:
    return datetime.fromtimestamp((T0_MS + ms) / 1000, UTC)


def batch(*events: Event) -> BatchPartials:
    """The window partials of an accept batch of ``latency_ms`` events."""
    n = len(events)
    return by_window(partials(pa.table({
        "app": ["shop"] * n, "kind": ["metric"] * n, "name": ["latency_ms"] * n, "series_tags": [""] * n,
        "corrected_event_time": pa.array([int(e.at.timestamp() * 1e6) for e in events], pa.int64()).cast(ARROW_TIME),
        "metric_value": pa.array([e.value for e in events], pa.float64()), "user": [e.user for e in events],
        "device": [e.device for e in events], "level": [e.level for e in events],
    }), CONFIG), CONFIG)


def key(length_s: int, start_ms: int, kind: str = "tumbling") -> tuple:
    return (kind, length_s * 1000, T0_MS + start_ms, *LATENCY)


def rows_by_window(rows: pa.Table) -> dict[tuple, dict]:
    return {(r["window_kind"], r["window_length_ms"], int(r["window_start"].timestamp() * 1000),
             r["app"], r["kind"], r["name"], r["series_tags"]): r for r in rows.to_pylist()}


def stored(row: dict) -> dict:
    """A row as the store hands it back to the provisional writer."""
    return {c: row[c] for c in ("event_count", "value_count", "sum", "min", "max", "value_sketch", "users_sketch",
                                "devices_sketch", "level_debug", "level_info", "level_warning", "level_error",
                                "level_critical", "version")}


FIRST = [Event(at(1_000), 5.0, user="ann"), Event(at(2_000), 1.0, user="bob")]
SECOND = [Event(at(3_000), 9.0, user="ann", device="d2")]
THIRD = [Event(at(4_000), 2.5, user="cid"), Event(at(12_000), 4.0)]
PENDING = {1: batch(*FIRST), 2: batch(*SECOND), 3: batch(*THIRD)}
BEFORE_ANY = T0_MS - 3_600_000   # a watermark far behind every event: no window is left out


def test_versions_order_a_provisional_row_between_the_windows_rows_before_and_after_its_batch() -> None:
    assert reader_version(6) < provisional_version(7) < reader_version(7)
    assert covered(reader_version(7)) == covered(provisional_version(7)) == 7


def test_with_nothing_stored_a_window_gets_the_row_of_every_event_of_the_pending_batches() -> None:
    result = provisional_rows(CONFIG, [3], PENDING, {}, committed=0, bound_ms=BEFORE_ANY, written_at=NOW)

    rows = rows_by_window(result.rows)
    expected = window_row(CONFIG, LATENCY, at(0), timedelta(seconds=10), FIRST + SECOND + THIRD[:1])
    got = rows[key(10, 0)]
    for column in ("event_count", "value_count", "sum", "min", "max", "mean", "rate", "p50", "p90", "p99",
                   "distinct_users", "distinct_devices"):
        assert got[column] == pytest.approx(expected[column]), column
    assert got["version"] == provisional_version(3) and result.windows_left == 0
    minute = rows[key(60, 0)]
    assert minute["event_count"] == 5 and minute["distinct_users"] == 3 and minute["max"] == 9.0
    # the hopping windows of 300 s every 60 s holding t = 1..12 s: the five starting 0, -60, ... -240 s
    assert {k[2] - T0_MS for k in rows if k[0] == "hopping"} == {0, -60_000, -120_000, -180_000, -240_000}
    hopping = rows[key(300, -240_000, "hopping")]
    expected = window_row(CONFIG, LATENCY, at(-240_000), timedelta(seconds=300), FIRST + SECOND + THIRD,
                          kind="hopping", hop=timedelta(seconds=60))
    for column in ("event_count", "sum", "min", "max", "p50", "p99", "distinct_users", "distinct_devices", "rate"):
        assert hopping[column] == pytest.approx(expected[column]), column
    assert hopping["window_hop_ms"] == 60_000


def test_a_stored_row_is_merged_with_only_the_batches_it_does_not_cover() -> None:
    windows_row = window_row(CONFIG, LATENCY, at(0), timedelta(seconds=10), FIRST + SECOND,
                             version=reader_version(2))   # the windows query took batches 1 and 2

    result = provisional_rows(CONFIG, [3], PENDING, {key(10, 0): stored(windows_row)}, committed=2,
                              bound_ms=BEFORE_ANY, written_at=NOW)

    got = rows_by_window(result.rows)[key(10, 0)]
    assert (got["event_count"], got["sum"], got["min"], got["max"]) == (4, 17.5, 1.0, 9.0)
    assert got["distinct_users"] == 3 and got["distinct_devices"] == 2
    assert got["p50"] == window_row(CONFIG, LATENCY, at(0), timedelta(seconds=10),
                                    FIRST + SECOND + THIRD[:1])["p50"]


def test_an_earlier_provisional_row_counts_as_covering_its_own_batch() -> None:
    earlier = provisional_rows(CONFIG, [2], PENDING, {}, committed=0, bound_ms=BEFORE_ANY, written_at=NOW)
    stored_row = stored(rows_by_window(earlier.rows)[key(10, 0)])

    result = provisional_rows(CONFIG, [3], PENDING, {key(10, 0): stored_row}, committed=0, bound_ms=BEFORE_ANY,
                              written_at=NOW)

    assert rows_by_window(result.rows)[key(10, 0)]["event_count"] == 4   # 3 from batches 1-2, 1 from batch 3


def test_the_row_written_last_stands_for_the_stored_one_while_it_covers_what_the_windows_query_committed() -> None:
    earlier = provisional_rows(CONFIG, [2], PENDING, {}, committed=0, bound_ms=BEFORE_ANY, written_at=NOW)
    written = {k: {**row, "version": provisional_version(2)} for k, row in earlier.written.items()}
    hopping = {key(300, -k * 60_000, "hopping") for k in range(5)}
    assert earlier.written.keys() == {key(10, 0), key(60, 0), *hopping}

    # The windows query committed batch 1 (or 2): the rows written at batch 2 cover it, and merged with batch 3's
    # partials they give the row of every event so far, with no read of the store.
    kept = reusable(written, {key(10, 0), key(10, 10_000)}, committed=2)
    assert kept.keys() == {key(10, 0)}   # the window at 10 s was never written: the store is asked for it
    result = provisional_rows(CONFIG, [3], PENDING, kept, committed=2, bound_ms=BEFORE_ANY, written_at=NOW)
    expected = window_row(CONFIG, LATENCY, at(0), timedelta(seconds=10), FIRST + SECOND + THIRD[:1])
    got = rows_by_window(result.rows)[key(10, 0)]
    for column in ("event_count", "sum", "min", "max", "p50", "distinct_users", "distinct_devices"):
        assert got[column] == pytest.approx(expected[column]), column

    # Once the windows query committed batch 3, its rows may hold batch 3, whose partials are no longer kept.
    assert reusable(written, {key(10, 0), key(60, 0)}, committed=3) == {}


def test_batches_a_committed_windows_micro_batch_took_are_never_added_again() -> None:
    # The windows query committed batch 2; the window's stored row is older (it wrote nothing for it since).
    old_row = window_row(CONFIG, LATENCY, at(0), timedelta(seconds=10), FIRST, version=reader_version(1))
    result = provisional_rows(CONFIG, [3], PENDING, {key(10, 0): stored(old_row)}, committed=2,
                              bound_ms=BEFORE_ANY, written_at=NOW)

    assert rows_by_window(result.rows)[key(10, 0)]["event_count"] == 3   # batch 1 stored + batch 3's one event


def test_a_window_the_stored_row_already_covers_up_to_this_batch_gets_no_row() -> None:
    taken = window_row(CONFIG, LATENCY, at(0), timedelta(seconds=10), FIRST + SECOND + THIRD[:1],
                       version=reader_version(3))   # the windows query was quicker than this batch

    result = provisional_rows(CONFIG, [3], PENDING, {key(10, 0): stored(taken)}, committed=0, bound_ms=BEFORE_ANY,
                              written_at=NOW)

    assert key(10, 0) not in rows_by_window(result.rows)
    assert key(10, 10_000) in rows_by_window(result.rows)   # the event at 12 s: another window, nothing stored


def test_only_windows_the_batch_itself_touches_are_written() -> None:
    result = provisional_rows(CONFIG, [2], PENDING, {}, committed=0, bound_ms=BEFORE_ANY, written_at=NOW)

    assert key(10, 10_000) not in rows_by_window(result.rows)   # batch 3's, not yet accepted at batch 2
    assert rows_by_window(result.rows)[key(10, 0)]["event_count"] == 3


def test_windows_at_or_behind_the_highest_watermark_the_windows_query_may_apply_are_left_to_it() -> None:
    # The windows query's watermark may reach the newest event (12 s) minus the allowed lateness; no window of
    # these events ends that early, so nothing is left.
    lateness_ms = int(CONFIG.stream.allowed_lateness_s * 1000)
    bound = watermark_bound_ms(T0_MS - 3_600_000, T0_MS + 12_000, CONFIG)
    assert bound == T0_MS + 12_000 - lateness_ms
    assert watermark_bound_ms(T0_MS + 5_000, T0_MS + 12_000, CONFIG) == max(bound, T0_MS + 5_000)
    assert provisional_rows(CONFIG, [3], PENDING, {}, 0, bound, NOW).windows_left == 0

    # At 10 s, the window [0, 10 s) may be closed when the windows query takes these events: its contribution
    # may be a dropped straggler, so only the windows query writes it.
    result = provisional_rows(CONFIG, [3], PENDING, {}, committed=0, bound_ms=T0_MS + 10_000, written_at=NOW)
    rows = rows_by_window(result.rows)
    assert key(10, 0) not in rows and key(10, 10_000) in rows and key(60, 0) in rows
    assert result.windows_left == 1


def test_batches_taken_together_write_every_window_any_of_them_touched_under_the_newest_version() -> None:
    result = provisional_rows(CONFIG, [2, 3], PENDING, {}, committed=0, bound_ms=BEFORE_ANY, written_at=NOW)

    rows = rows_by_window(result.rows)
    assert rows[key(10, 0)]["event_count"] == 4 and rows[key(10, 10_000)]["event_count"] == 1
    assert {r["version"] for r in rows.values()} == {provisional_version(3)}


def accepted(batch_id: int, started_s: float, oldest_record_s: float) -> BatchMeta:
    """An accept batch started at ``started_s`` whose oldest record reached the broker at ``oldest_record_s``."""
    return BatchMeta(batch_id, {}, {}, first_timestamp_ms=int(oldest_record_s * 1000),
                     last_timestamp_ms=int(started_s * 1000), accepted_at_ms=int(started_s * 1000))


def test_rows_are_written_only_while_the_job_keeps_up_within_three_triggers() -> None:
    trigger_s = CONFIG.stream.trigger_interval_s
    # A job keeping up: the windows query took the batches up to a trigger ago, each batch's records a second old.
    keeping_up = [accepted(b, 100 + b, 99 + b) for b in range(1, 6)]
    assert worth_writing(keeping_up, CONFIG)
    # The windows query more than three triggers behind accept: its own rows are what is late.
    behind = [accepted(b, 100 + b * trigger_s, 99 + b * trigger_s) for b in range(1, 6)]
    assert not worth_writing(behind, CONFIG)
    # accept catching up on a backlog: its batch holds records that reached the broker a minute before it started.
    assert not worth_writing([accepted(1, 100, 40)], CONFIG)
    assert worth_writing([accepted(1, 100, 100 - 3 * trigger_s)], CONFIG)
