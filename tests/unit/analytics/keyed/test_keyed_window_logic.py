"""Pure logic of sliding windows and sessions (no Spark): the per-key state machines the stateful query runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from analytics.keyed import rows as keyed_rows
from analytics.keyed import runs as session_runs
from analytics.keyed import sessions, sliding
from analytics.keyed.events import Events
from eventide.config import load_config

L = 60_000
G = 60_000


def _events(times: list[int], values: list[float | None] | None = None, level: str | None = None) -> Events:
    n = len(times)
    return Events.from_frame(pd.DataFrame({
        "t": times, "metric_value": values if values is not None else [1.0] * n, "level": [level] * n,
        "kind": ["log" if level else "metric"] * n, "partition": [0] * n, "offset": list(range(n)),
        "id": [f"e{i}" for i in range(n)], "device": ["d"] * n,
    }))


def test_a_window_is_emitted_once_the_watermark_reaches_its_event():
    state = sliding.SlidingState()
    assert len(sliding.add_events(state, _events([1_000, 30_000, 61_000]), watermark=0, length_ms=L)) == 0
    assert state.next_due == 1_000
    assert len(sliding.emit_due(state, watermark=999, length_ms=L)["t"]) == 0
    out = pd.DataFrame(sliding.emit_due(state, watermark=61_000, length_ms=L))
    assert out[["t", "event_count", "sum"]].values.tolist() == [[1_000, 1, 1.0], [30_000, 2, 2.0],
                                                                [61_000, 2, 2.0]]  # (1 s, 61 s] drops t = 1 s
    assert state.next_due is None and len(state.t) == 2   # t = 1 s can no longer be in an open window


def test_a_late_event_is_a_straggler_but_counts_in_open_windows():
    state = sliding.SlidingState()
    sliding.add_events(state, _events([100_000]), watermark=0, length_ms=L)
    late = sliding.add_events(state, _events([90_000], [5.0]), watermark=95_000, length_ms=L)
    assert late.t.tolist() == [90_000]
    out = pd.DataFrame(sliding.emit_due(state, watermark=100_000, length_ms=L))
    assert out[["t", "event_count", "sum"]].values.tolist() == [[100_000, 2, 6.0]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300_000), st.one_of(st.none(), st.integers(-9, 9))), min_size=1,
                max_size=60))
def test_batched_window_computation_equals_a_scan_per_window(points):
    times = [t for t, _ in points]
    values = [None if v is None else float(v) for _, v in points]
    state = sliding.SlidingState()
    late = sliding.add_events(state, _events(times, values), watermark=0, length_ms=L)
    out = pd.DataFrame(sliding.emit_due(state, watermark=10**9, length_ms=L)).sort_values(["t", "offset"])
    # Every event after the watermark has its window (t_e - L, t_e], once; one at it (t = 0) is late, its own window
    # already closed. An empty or short output fails here instead of passing the loop below vacuously.
    assert sorted(late.t.tolist()) == [t for t in sorted(times) if t <= 0]
    assert sorted(zip(out.t, out.offset, strict=True)) == sorted((t, i) for i, t in enumerate(times) if t > 0)
    for row in out.itertuples():
        members = [v for t, v in zip(times, values, strict=True) if row.t - L < t <= row.t]
        present = [v for v in members if v is not None]
        assert (row.event_count, row.value_count, row.sum) == (len(members), len(present), float(sum(present)))
        assert (np.isnan(row.min) and not present) or (row.min, row.max) == (min(present), max(present))


def test_sessions_split_at_exactly_the_gap_and_close_at_last_plus_gap():
    state = sessions.SessionState()
    sessions.add_events(state, _events([0, 30_000, 90_000]), watermark=0, gap_ms=G)
    assert state.next_due(G, 0) == 90_000                  # [0, 90 s): 30 s + 60 s
    out = pd.DataFrame(sessions.emit_due(state, watermark=90_000, gap_ms=G, memory_ms=0))
    assert out[["session_start", "last_event_time", "event_count"]].values.tolist() == [[0, 30_000, 2]]
    assert state.open_first.tolist() == [90_000]           # exactly G after 30 s: a session of its own


def test_a_late_event_cannot_change_an_emitted_session():
    state = sessions.SessionState()
    sessions.add_events(state, _events([0]), watermark=0, gap_ms=G)
    sessions.emit_due(state, watermark=60_000, gap_ms=G, memory_ms=3_600_000)
    dropped = sessions.add_events(state, _events([50_000]), watermark=100_000, gap_ms=G)
    # 50 s + 60 s > 100 s: on its own it would be open, but it belongs to the emitted [0, 60 s).
    assert (dropped.events.t.tolist(), dropped.window_start.tolist(), dropped.window_end.tolist()) == (
        [50_000], [0], [60_000])
    assert len(state.open_first) == 0


def test_a_bucket_of_session_keys_round_trips_through_its_state_row():
    bucket: sessions.SessionBucket = {"user\x1eann": sessions.SessionState(),
                                      "device\x1ekiosk": sessions.SessionState()}
    sessions.add_events(bucket["user\x1eann"], _events([0, 10_000, 200_000]), watermark=0, gap_ms=G)
    sessions.add_events(bucket["device\x1ekiosk"], _events([5_000]), watermark=0, gap_ms=G)
    sessions.emit_due(bucket["device\x1ekiosk"], watermark=70_000, gap_ms=G, memory_ms=3_600_000)
    restored = sessions.unpack(sessions.pack(bucket))
    assert restored.keys() == bucket.keys()
    for key, state in bucket.items():
        for field in ("open_first", "open_last", "open_counts", "closed_first", "closed_last"):
            assert np.array_equal(getattr(restored[key], field), getattr(state, field)), (key, field)
    assert sessions.bucket_next_due(restored, G, 3_600_000) == 70_000   # ann's first session: 10 s + 60 s


def test_a_window_closing_in_a_batch_leaves_out_late_events_of_that_same_batch():
    state = sliding.SlidingState()
    sliding.add_events(state, _events([100_000]), watermark=0, length_ms=L)
    # Next batch: the watermark reaches 100 s, so the window of t = 100 s closes in it; an event at 95 s in the
    # same batch arrives after that window closed: a straggler, and not part of the window.
    late = sliding.add_events(state, _events([95_000, 130_000]), watermark=100_000, length_ms=L)
    assert late.t.tolist() == [95_000]
    out = pd.DataFrame(sliding.emit_due(state, watermark=100_000, length_ms=L))
    assert out[["t", "event_count"]].values.tolist() == [[100_000, 1]]
    # It still counts in the window of 130 s, which was open when it arrived.
    out = pd.DataFrame(sliding.emit_due(state, watermark=130_000, length_ms=L))
    assert out[["t", "event_count"]].values.tolist() == [[130_000, 3]]


def reference_add_events(state: sessions.SessionState, events: Events, watermark: int,
                         gap_ms: int) -> sessions.Dropped:
    """The rule as a plain loop over one key's intervals (the per-key code the job ran until 2026-11-25)."""
    new_counts = sessions._event_counts(events)
    # Intervals: (first, last, source, index); source 0 = closed session, 1 = open session, 2 = new event.
    # An open session the watermark has reached is closed already, even if its timer fires only after this input.
    due = state.open_last + gap_ms <= watermark
    intervals = ([(f, la, 0, -1) for f, la in zip(state.closed_first.tolist(), state.closed_last.tolist(),
                                                   strict=True)]
                 + [(f, la, 0 if d else 1, i) for i, (f, la, d) in enumerate(zip(
                     state.open_first.tolist(), state.open_last.tolist(), due.tolist(), strict=True))]
                 + [(t, t, 2, i) for i, t in enumerate(events.t.tolist())])
    intervals.sort()
    runs: list[list[tuple[int, int, int, int]]] = []
    run_last = 0
    for interval in intervals:
        if runs and interval[0] - run_last < gap_ms:
            runs[-1].append(interval)
            run_last = max(run_last, interval[1])
        else:
            runs.append([interval])
            run_last = interval[1]
    keep_open = np.ones(len(state.open_first), dtype=bool)
    new_first, new_last, new_counts_rows = [], [], []
    dropped_index, dropped_start, dropped_end = [], [], []
    for run in runs:
        fresh = [i for _, _, source, i in run if source == 2]
        if not fresh:
            continue
        closed = [(f, last) for f, last, source, _ in run if source == 0]
        first = min(f for f, _, _, _ in run)
        last = max(la for _, la, _, _ in run)
        if closed or last + gap_ms <= watermark:
            start, end = (closed[0][0], closed[0][1] + gap_ms) if closed else (first, last + gap_ms)
            dropped_index += fresh
            dropped_start += [start] * len(fresh)
            dropped_end += [end] * len(fresh)
        else:
            merged = [i for _, _, source, i in run if source == 1]
            keep_open[merged] = False
            new_first.append(first)
            new_last.append(last)
            new_counts_rows.append(new_counts[fresh].sum(axis=0) + state.open_counts[merged].sum(axis=0))
    if new_first:
        state.open_first = np.concatenate([state.open_first[keep_open], np.array(new_first, np.int64)])
        state.open_last = np.concatenate([state.open_last[keep_open], np.array(new_last, np.int64)])
        state.open_counts = np.concatenate([state.open_counts[keep_open], np.array(new_counts_rows, np.int64)])
    return sessions.Dropped(events.take(np.array(dropped_index, dtype=np.int64)), np.array(dropped_start, np.int64),
                   np.array(dropped_end, np.int64))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 400_000)), max_size=25),
                          st.integers(0, 120_000)), min_size=1, max_size=6))
def test_a_bucket_takes_its_keys_events_in_one_pass_as_a_pass_per_key_would(batches):
    ours: sessions.SessionBucket = {}
    theirs: sessions.SessionBucket = {}
    watermark = 0
    for batch, advance in batches:
        watermark += advance
        keys = np.array([k for k, _ in batch], dtype=object)
        events = _events([t for _, t in batch])
        dropped_keys, dropped = sessions.add_bucket_events(ours, keys, events, watermark, G)
        got = sorted(zip(dropped_keys.tolist(), dropped.events.offset.tolist(), dropped.window_start.tolist(),
                         dropped.window_end.tolist(), strict=True))
        expected = []
        for key in dict.fromkeys(keys.tolist()):
            index = np.flatnonzero(keys == key)
            late = reference_add_events(theirs.setdefault(key, sessions.SessionState()), events.take(index),
                                        watermark, G)
            expected += zip([key] * len(late.events), late.events.offset.tolist(), late.window_start.tolist(),
                            late.window_end.tolist(), strict=True)
        assert got == sorted(expected)
        _emit_and_compare(ours, theirs, watermark)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 400_000)), max_size=25),
                          st.integers(0, 120_000)), min_size=1, max_size=6))
def test_the_published_open_sessions_are_always_the_open_sessions_of_the_state(batches):
    # Given any batches of a bucket's keys, each batch's provisional rows applied to a table keyed by (key, start)
    # and each emitted session retiring its row,
    bucket: sessions.SessionBucket = {}
    table: dict[tuple[str, int], tuple[int, int, int] | None] = {}
    watermark = 0
    for batch, advance in batches:
        watermark += advance
        keys = np.array([k for k, _ in batch], dtype=object)
        before = sessions.open_before(bucket, keys)
        sessions.add_bucket_events(bucket, keys, _events([t for _, t in batch]), watermark, G)
        opened = sessions.open_changes(bucket, before, watermark, G)
        for key, first, last, count in zip(opened.keys, opened.first, opened.last, opened.counts[:, 0], strict=True):
            table[(key, int(first))] = (int(last), int(count))
        for key, first in zip(opened.gone_keys, opened.gone_first, strict=True):
            table[(key, int(first))] = None
        for key, state in bucket.items():
            emitted = sessions.emit_due(state, watermark, G, memory_ms=150_000)
            for first in emitted["session_start"].tolist():
                assert table.get((key, first)) is not None   # a session closes only after it was shown open
                table[(key, first)] = None
        # then the table's open rows are exactly the sessions the state holds open, with their last event and count.
        shown = {k: v for k, v in table.items() if v is not None}
        held = {(key, int(f)): (int(last), int(n)) for key, state in bucket.items()
                for f, last, n in zip(state.open_first, state.open_last, state.open_counts[:, 0], strict=True)}
        assert shown == held


def _emit_and_compare(ours: sessions.SessionBucket, theirs: sessions.SessionBucket, watermark: int) -> None:
    """Emit what the watermark closed in both buckets; then both hold the same sessions, open and closed."""
    for bucket in (ours, theirs):
        for state in bucket.values():
            sessions.emit_due(state, watermark, G, memory_ms=150_000)
    assert ours.keys() == theirs.keys()
    for key in ours:
        for field in ("open_first", "open_last", "open_counts", "closed_first", "closed_last"):
            assert getattr(ours[key], field).tolist() == getattr(theirs[key], field).tolist(), (key, field)


def test_the_latest_session_end_so_far_restarts_at_each_key_even_for_times_too_far_apart_to_fold():
    key = np.array([0, 0, 0, 2, 2, 5], dtype=np.int64)
    near = np.array([10, 5, 30, 7, 3, 1], dtype=np.int64)
    assert sessions._latest_end_per_key(key, near).tolist() == [10, 10, 30, 7, 7, 1]
    far = np.array([0, 2**61, 5, -(2**61), -5, 9], dtype=np.int64)
    assert sessions._latest_end_per_key(key, far).tolist() == [0, 2**61, 2**61, -(2**61), -5, 9]


def _accepted(keys: list[str], times: list[int], levels: list[str | None]) -> pa.Table:
    """Accepted events of one app: key 'u…' is a user, any other a device without a user."""
    return pa.table({
        "app": pa.array(["shop"] * len(keys), pa.string()),
        "user": pa.array([k if k.startswith("u") else None for k in keys], pa.string()),
        "device": pa.array([k if not k.startswith("u") else "phone" for k in keys], pa.string()),
        "corrected_event_time": pa.array(np.array(times, np.int64) * 1000, pa.timestamp("us", tz="UTC")),
        "level": pa.array(levels, pa.string()), "partition": pa.array([0] * len(keys), pa.int32()),
        "offset": pa.array(range(len(keys)), pa.int64()),
        "id": pa.array([f"e{i}" for i in range(len(keys))], pa.string()),
    })


def test_a_batch_s_runs_join_a_key_s_events_less_than_g_apart_and_count_them_on_the_first():
    batch = _accepted(["ua", "ua", "dk", "ua", "ua"], [0, 59_999, 10, 160_000, 119_999],
                      [None, "error", None, "info", None])
    runs = session_runs.with_runs(batch, G)
    # 119.999 s is G after 59.999 s: a new run, whose first event (the last row) carries it
    assert runs[session_runs.EVENTS].to_pylist() == [2, 0, 1, 0, 2]
    assert runs[session_runs.LAST].to_pylist() == [59_999, None, 10, None, 160_000]
    assert runs["session_run_error"].to_pylist() == [1, None, 0, None, 0]
    assert runs["session_run_info"].to_pylist() == [0, None, 0, None, 1]
    assert runs[session_runs.GAP].to_pylist() == [G] * 5


@settings(max_examples=300, deadline=None)
# Times on a 10-s grid, so that gaps of exactly G (which start a new session) are common.
@given(st.lists(st.tuples(st.lists(st.tuples(st.sampled_from(["ua", "ub", "dk", "dl"]),
                                             st.integers(0, 40).map(lambda n: n * 10_000),
                                             st.sampled_from([None, "info", "error"])), max_size=25),
                          st.integers(0, 120_000)), min_size=1, max_size=6))
def test_runs_taken_whole_give_the_sessions_and_stragglers_their_events_give(batches):
    by_runs: sessions.SessionBucket = {}
    by_events: sessions.SessionBucket = {}
    watermark = 0
    for batch, advance in batches:
        watermark += advance
        accepted = session_runs.with_runs(_accepted([k for k, _, _ in batch], [t for _, t, _ in batch],
                                                    [lvl for _, _, lvl in batch]), G)
        kinds, names = (c.to_numpy(zero_copy_only=False) for c in session_runs.session_keys(accepted))
        session = np.array([f"{k}\x1e{n}" for k, n in zip(kinds, names, strict=True)], dtype=object)
        events = _events([t for _, t, _ in batch])
        events = Events(events.t, events.value, np.array([{"info": 1, "error": 3}.get(lvl, -1) for _, _, lvl in batch],
                                                         np.int8),
                        np.array([lvl is not None for _, _, lvl in batch], bool), events.partition, events.offset,
                        events.id, events.device)
        _, dropped = sessions.add_bucket_events(by_events, session, events, watermark, G)
        expected = sorted(zip(dropped.events.offset.tolist(), dropped.window_start.tolist(),
                              dropped.window_end.tolist(), strict=True))

        head = np.asarray(accepted[session_runs.EVENTS]) > 0
        counts = sessions.run_counts(np.asarray(accepted[session_runs.EVENTS]), np.column_stack(
            [np.asarray(accepted[c].fill_null(0)) for c in session_runs.LEVEL_COUNTS]))[head]
        first = events.t[head]
        last = np.asarray(accepted[session_runs.LAST].fill_null(0))[head]
        run_keys, at, start, end = sessions.add_bucket_runs(by_runs, session[head], first, last, counts, watermark, G)
        kind_of, name_of = zip(*[k.split("\x1e") for k in run_keys.tolist()], strict=True) if len(at) else ((), ())
        expanded = session_runs.events_of_runs(pa.table({
            "app": pa.array(["shop"] * len(at), pa.string()), "kind": pa.array(kind_of, pa.string()),
            "name": pa.array(name_of, pa.string()),
            "first_ms": first[at], "last_ms": last[at], "start": start, "end": end}), accepted)
        assert sorted(zip(expanded["offset"].to_pylist(), expanded["start"].to_pylist(), expanded["end"].to_pylist(),
                          strict=True)) == expected
        _emit_and_compare(by_runs, by_events, watermark)


def test_a_batch_file_holds_the_rows_keyed_windows_reads_first_marked_for_the_settings_that_chose_them():
    config = load_config(environ={}, stream={"sliding_log_levels": ["error"], "sliding_series": [
        {"app": "*", "kind": "metric", "name": "latency"}, {"app": "shop", "kind": "log", "name": "app.db"}]})
    batch = _accepted(["ua"] * 6, [0, 1_000, 2_000, 3_000, 5_000, 4_000], [None, None, "error", "info", "info", None])
    batch = batch.set_column(batch.schema.get_field_index("app"), "app", pa.array(["shop"] * 4 + ["blog", "blog"]))
    batch = batch.append_column("kind", pa.array(["metric", "metric", "log", "log", "log", "metric"]))
    batch = batch.append_column("name", pa.array(["cpu", "cpu", "app.http", "app.db", "app.db", "latency"]))
    # a run per app, whose head is its first event (e0, e5); the error log e2; app.db of shop only (e3, not e4);
    # latency of any app (e5)
    first, rest = keyed_rows.row_groups(session_runs.with_runs(batch, G), config)
    assert first["id"].to_pylist() == ["e0", "e2", "e3", "e5"]
    assert rest["id"].to_pylist() == ["e1", "e4"]
    assert first[keyed_rows.KEYED_ROW].to_pylist() == [True] * 4
    assert rest[keyed_rows.KEYED_ROW].to_pylist() == [False] * 2
    fingerprint = keyed_rows.selection(config)
    assert set(first[keyed_rows.SELECTION].to_pylist() + rest[keyed_rows.SELECTION].to_pylist()) == {fingerprint}
    # the fingerprint names what decides the marks, and nothing else
    for changed in ({"session_gap_s": 60}, {"sliding_log_levels": ["error", "critical"]}, {"sliding_series": []}):
        other = config.model_copy(update={"stream": config.stream.model_copy(update=changed)})
        assert keyed_rows.selection(other) != fingerprint
    unrelated = config.model_copy(update={"stream": config.stream.model_copy(update={"sliding_window_s": 10})})
    assert keyed_rows.selection(unrelated) == fingerprint
