"""A refreshing page part reads the store again only when what it follows changed (its query stored a new batch, or
its own version of the data moved), its filters changed, or the pipeline is not keeping up; otherwise it draws its
last read again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dashboard.live import LastRead, batch_is_fresh, followed_version, still_current
from store.pipeline import WINDOW_ROWS

T0 = datetime(2026, 11, 28, 12, 0, 0, tzinfo=UTC)
STALE_AFTER_S = 15.0


def read_at(version: object, key: object = 30) -> LastRead[object]:
    return LastRead(key=key, version=version, data="charts of that read")


def test_no_new_batch_of_the_followed_query_keeps_the_last_read():
    assert still_current(read_at(T0), 30, T0, trusted=True)


def test_a_new_batch_or_a_new_version_reads_again():
    assert not still_current(read_at(T0), 30, T0 + timedelta(seconds=5), trusted=True)
    assert not still_current(read_at(1200), 30, 1201, trusted=True)


def test_other_filters_read_again():
    assert not still_current(read_at(T0, key=30), 60, T0, trusted=True)
    assert not still_current(read_at(T0, key=("shop", ["x"])), ("shop", ["y"]), T0, trusted=True)


def test_a_pipeline_that_stopped_storing_batches_is_read_at_every_refresh():
    # Past the stale threshold the page is about a stopped job: lag and alerts must keep moving.
    assert batch_is_fresh(T0, T0 + timedelta(seconds=15), STALE_AFTER_S)
    assert not batch_is_fresh(T0, T0 + timedelta(seconds=16), STALE_AFTER_S)
    assert not still_current(read_at(T0), 30, T0, trusted=False)


def test_before_the_first_batch_every_refresh_reads():
    assert not batch_is_fresh(None, T0, STALE_AFTER_S)
    assert not still_current(read_at(None), 30, None, trusted=True)


def test_the_first_refresh_reads():
    assert not still_current(None, 30, T0, trusted=True)


def test_a_tumbling_chart_reads_again_after_a_provisional_round_between_two_batches_of_the_windows_query():
    # accept's provisional rows move the tumbling windows every accept batch; the windows query every trigger.
    batch = {"windows": T0, "provisional_windows": T0 + timedelta(seconds=1)}
    last = read_at(followed_version(batch, WINDOW_ROWS))
    assert still_current(last, 30, followed_version(dict(batch), WINDOW_ROWS), trusted=True)
    a_round_later = {**batch, "provisional_windows": T0 + timedelta(seconds=2)}
    assert not still_current(last, 30, followed_version(a_round_later, WINDOW_ROWS), trusted=True)
    # A part following the windows query alone (stragglers) waits for its next batch.
    assert followed_version(a_round_later, ("windows",)) == followed_version(batch, ("windows",))


def test_a_part_reads_at_every_refresh_until_its_first_query_stored_a_batch():
    # Provisional rounds alone (the windows query's first batch still running) are not yet a version to keep.
    assert followed_version({"provisional_windows": T0}, WINDOW_ROWS) is None
    assert not still_current(read_at(None), 30, None, trusted=True)
