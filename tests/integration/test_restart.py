"""Exactly-once effect: a job restarted from its checkpoint yields the results of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from eventide.config import to_environ
from store.client import connect
from tests.support.pipeline import Metric, minute_in_past, ms, produce, produce_raw, run_job, wait_until, window_rows

SECOND = 1000


def _events(t0: int, count: int, first_value: int = 0) -> list[Metric]:
    """``count`` events over the 10 s windows starting at t0, t0+10s, t0+20s. Each lies ≥ 1 s from a window edge,
    since corrected time includes the network delay; all within 30 s, the allowed lateness, so none is dropped."""
    def at(i: int) -> int:
        window, slot = divmod(i, -(-count // 3))
        return t0 + window * 10 * SECOND + SECOND + slot * (8 * SECOND) // -(-count // 3)

    return [Metric(at(i), float(first_value + i), device=f"device-{i % 7}") for i in range(count)]


def _expected(t0: int, events: list[Metric], length_s: int) -> dict[int, tuple[int, float]]:
    windows: dict[int, list[float]] = defaultdict(list)
    for e in events:
        windows[(e.at - t0) // (length_s * SECOND) * length_s * SECOND].append(e.value)
    return {start: (len(v), sum(v)) for start, v in sorted(windows.items())}


def _observed(config, t0: int, length_s: int) -> dict[int, tuple[int, float]]:
    return {ms(r["window_start"]) - t0: (r["event_count"], r["sum"]) for r in window_rows(config, length_s)}


def _stored_rows_after_merge(config, table: str = "window_aggregates", where: str = "window_kind = 'tumbling'") -> int:
    with connect(config) as client:
        client.command(f"OPTIMIZE TABLE {table} FINAL")
        return int(client.query(f"SELECT count() FROM {table} WHERE {where}").result_rows[0][0])


def _drop_last_commit(checkpoint: Path) -> int:
    """Simulate a crash after the sink wrote batch N but before Spark committed it."""
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    last = commits[-1]
    last.unlink()
    last.with_name(f".{last.name}.crc").unlink(missing_ok=True)  # the checksum goes with the file it checks
    return int(last.name)


def test_replayed_batch_after_crash_before_commit_changes_nothing(stack, spark):
    stack = stack.model_copy(update={"stream": stack.stream.model_copy(update={"max_offsets_per_trigger": 40})})
    t0 = minute_in_past()
    first, second = _events(t0, 200), _events(t0, 100, first_value=1000)
    produce(stack, first)
    produce_raw(stack, [b"broken-1", b"broken-2"])
    run_job(spark, stack)
    queries = ("accept", "windows", "keyed_windows")
    replayed = {q: _drop_last_commit(stack.checkpoint_dir / q) for q in queries}
    assert all(batch >= 3 for batch in replayed.values()), replayed  # several micro-batches really ran

    produce(stack, second)
    run_job(spark, stack)

    for q, batch in replayed.items():
        assert (stack.checkpoint_dir / q / "commits" / str(batch)).exists()  # the batch was run again
    assert _observed(stack, t0, 10) == _expected(t0, first + second, 10)
    assert _observed(stack, t0, 60) == _expected(t0, first + second, 60)
    assert _stored_rows_after_merge(stack) == len(_expected(t0, first + second, 10)) + 1
    with connect(stack) as client:
        assert client.query("SELECT count() FROM dead_letters FINAL").result_rows[0][0] == 2


def test_job_killed_mid_stream_resumes_from_checkpoint_without_duplicates_or_gaps(stack, spark):
    # Ten micro-batches: the job is killed after its third, the restart runs the rest.
    batches = 10
    stack = stack.model_copy(update={"stream": stack.stream.model_copy(
        update={"max_offsets_per_trigger": 120, "trigger_interval_s": 0.5})})
    t0 = minute_in_past()
    events = _events(t0, 120 * batches)
    produce(stack, events)

    job = subprocess.Popen([sys.executable, "-m", "analytics.job"], env={**os.environ, **to_environ(stack)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    commits = stack.checkpoint_dir / "windows" / "commits"
    try:
        # Only a guard against a job that never gets going: beside another test file's Spark session on the 2-core
        # CI machine, a new job's JVM, session and three queries took over 120 s to commit three batches.
        wait_until(lambda: len(list(commits.glob("[0-9]*"))) >= 3, timeout_s=360)
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # no shutdown hooks, no final commit
        job.wait()
    done_before_kill = len(list(commits.glob("[0-9]*")))
    assert done_before_kill < batches, "the job finished before it was killed; nothing was tested"

    run_job(spark, stack)  # restart from the same checkpoints

    assert _observed(stack, t0, 10) == _expected(t0, events, 10)
    assert _observed(stack, t0, 60) == _expected(t0, events, 60)
    assert _stored_rows_after_merge(stack) == len(_expected(t0, events, 10)) + 1


def test_restart_mid_sliding_window_and_mid_session_loses_no_state_and_emits_no_duplicates(stack, spark):
    from tests.support.pipeline import Event, produce_events, rows

    s, t0 = SECOND, 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000
    config = stack.model_copy(update={"stream": stack.stream.model_copy(update={
        "sliding_window_s": 60, "session_gap_s": 60, "max_offsets_per_trigger": 3})})
    # Error logs of one logger (sliding by default) by one user (one session), over several micro-batches.
    produce_events(config, [Event(t0 + i * 10 * s, None, user="ann", name="db", level="error") for i in range(6)])
    run_job(spark, config)                     # windows pending and the session open when the job stops
    replayed = _drop_last_commit(config.checkpoint_dir / "keyed_windows")
    assert replayed >= 1
    produce_events(config, [Event(t0 + 70 * s + i * 10 * s, None, user="ann", name="db", level="error")
                            for i in range(3)])
    run_job(spark, config)                     # restart: replays the uncommitted batch, then the new ones
    produce_events(config, [Event(t0 + 1000 * s, None, user="flush", name="flush", level="info")])
    run_job(spark, config)

    counts = [r["event_count"] for r in rows(config, "SELECT event_count FROM sliding_windows FINAL "
                                                     "WHERE name = 'db' ORDER BY window_end")]
    # Events at 0, 10, ..., 50, 70, 80, 90 s; each window (t - 60 s, t] holds the events after t - 60 s.
    assert counts == [1, 2, 3, 4, 5, 6, 5, 5, 5]
    assert [(r["event_count"], r["duration_ms"]) for r in rows(
        config, "SELECT event_count, duration_ms FROM sessions FINAL WHERE session_key = 'ann'")] == [(9, 90 * s)]
    assert _stored_rows_after_merge(config, "sliding_windows", "name = 'db'") == 9
    assert _stored_rows_after_merge(config, "sessions", "session_key = 'ann'") == 1
