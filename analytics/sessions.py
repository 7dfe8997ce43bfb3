"""Session windows (BRIEF §2): per (app, user), or (app, device) for events without a user, a maximal run of
events each less than G after the previous; the session is ``[first, last + G)``, emitted once the watermark
reaches ``last + G``.

Pure logic over one session key's state; ``analytics.keyed_windows`` runs it inside Spark's
``transformWithStateInPandas`` with an event-time timer at the earliest open session's end. Spark's own
``session_window`` is not used because its rules differ from the brief at the edges: it merges events exactly G
apart, and it accepts an event whose session was already emitted as the start of a second, overlapping session.

Rules for a micro-batch with watermark W (BRIEF §3: a contribution to a window that is already closed is dropped):
- the batch's events, the open sessions and the recently closed sessions are merged into runs (a gap < G joins);
- a run that touches a closed session (emitted, or reached by W) cannot change it: its new events are dropped
  stragglers attributed to that session;
- a run that is already closed by W (``last + G <= W``) is dropped as a whole, attributed to the session it would
  have formed;
- any other run becomes (or extends) an open session.
Closed sessions are remembered for ``stream.session_memory_s`` after they end; after that an event that would
have joined one is still dropped (its own session is closed too, by far) but is attributed to the session the
late events form by themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from analytics.keyed_events import Events
from analytics.windows import LEVEL_COLUMNS, LEVEL_FIELDS

COUNT_COLUMNS = ("event_count", "metric_count", "log_count", *LEVEL_FIELDS)


def _empty_counts() -> np.ndarray:
    return np.zeros((0, len(COUNT_COLUMNS)), dtype=np.int64)


@dataclass
class SessionState:
    open_first: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    open_last: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    open_counts: np.ndarray = field(default_factory=_empty_counts)
    closed_first: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    closed_last: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    def next_due(self, gap_ms: int, memory_ms: int) -> int | None:
        """When the state next needs the watermark: the earliest open session end, else the earliest time a
        closed session can be forgotten."""
        if len(self.open_last):
            return int(self.open_last.min()) + gap_ms
        if len(self.closed_last):
            return int(self.closed_last.min()) + gap_ms + memory_ms
        return None

    @property
    def empty(self) -> bool:
        return not len(self.open_last) and not len(self.closed_last)


@dataclass(frozen=True)
class Dropped:
    """Dropped stragglers and the session each would have belonged to."""

    events: Events
    window_start: np.ndarray
    window_end: np.ndarray


def _event_counts(events: Events) -> np.ndarray:
    counts = np.zeros((len(events), len(COUNT_COLUMNS)), dtype=np.int64)
    counts[:, 0] = 1
    counts[:, 1] = ~events.is_log
    counts[:, 2] = events.is_log
    for code in range(len(LEVEL_COLUMNS)):
        counts[:, 3 + code] = events.level == code
    return counts


def add_events(state: SessionState, events: Events, watermark: int, gap_ms: int) -> Dropped:
    """Take a batch's events of one key; returns the dropped stragglers."""
    new_counts = _event_counts(events)
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
    return Dropped(events.take(np.array(dropped_index, dtype=np.int64)), np.array(dropped_start, np.int64),
                   np.array(dropped_end, np.int64))


def emit_due(state: SessionState, watermark: int, gap_ms: int, memory_ms: int) -> dict[str, np.ndarray]:
    """Emit the open sessions the watermark has closed (``last + G <= W``); forget closed sessions that ended
    more than ``memory_ms`` before the watermark. Returns columns ``session_start``, ``last_event_time`` and the
    COUNT_COLUMNS, one entry per emitted session."""
    due = state.open_last + gap_ms <= watermark
    out = {"session_start": state.open_first[due], "last_event_time": state.open_last[due]}
    counts = state.open_counts[due]
    out.update({name: counts[:, i] for i, name in enumerate(COUNT_COLUMNS)})
    closed_first = np.concatenate([state.closed_first, state.open_first[due]])
    closed_last = np.concatenate([state.closed_last, state.open_last[due]])
    remember = closed_last + gap_ms + memory_ms > watermark
    state.closed_first, state.closed_last = closed_first[remember], closed_last[remember]
    state.open_first, state.open_last = state.open_first[~due], state.open_last[~due]
    state.open_counts = state.open_counts[~due]
    return out


# A bucket of session keys shares one state row and one timer: most keys see a few events per batch, and a state
# row or timer per key would cost Spark round trips per key that dwarf the work.
SessionBucket = dict[str, SessionState]
_KEY_SEPARATOR = "\x1f"


def pack(bucket: SessionBucket) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes, str]:
    """Serialize a bucket: per-session arrays tagged with their key's index, and the keys."""
    keys = [k for k, s in bucket.items() if not s.empty]
    states = [bucket[k] for k in keys]

    def cat(arrays: list[np.ndarray], dtype: type) -> bytes:
        if not arrays:
            return b""
        return np.concatenate(arrays).astype(dtype, copy=False).tobytes()

    open_key = [np.full(len(s.open_first), i, np.int32) for i, s in enumerate(states)]
    closed_key = [np.full(len(s.closed_first), i, np.int32) for i, s in enumerate(states)]
    return (cat(open_key, np.int32), cat([s.open_first for s in states], np.int64),
            cat([s.open_last for s in states], np.int64), cat([s.open_counts for s in states], np.int64),
            cat(closed_key, np.int32), cat([s.closed_first for s in states], np.int64),
            cat([s.closed_last for s in states], np.int64), _KEY_SEPARATOR.join(keys))


def unpack(packed: tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes, str] | None) -> SessionBucket:
    if packed is None:
        return {}
    o_key, o_first, o_last, o_counts, c_key, c_first, c_last, keys = packed
    names = keys.split(_KEY_SEPARATOR) if keys else []
    width = len(COUNT_COLUMNS)
    o_key_a, c_key_a = np.frombuffer(o_key, np.int32), np.frombuffer(c_key, np.int32)
    o_first_a, o_last_a = np.frombuffer(o_first, np.int64), np.frombuffer(o_last, np.int64)
    o_counts_a = np.frombuffer(o_counts, np.int64).reshape(-1, width)
    c_first_a, c_last_a = np.frombuffer(c_first, np.int64), np.frombuffer(c_last, np.int64)
    # pack() writes each key's sessions contiguously, in key order.
    o_bounds = np.searchsorted(o_key_a, np.arange(len(names) + 1))
    c_bounds = np.searchsorted(c_key_a, np.arange(len(names) + 1))
    bucket = {}
    for i, name in enumerate(names):
        o, c = slice(o_bounds[i], o_bounds[i + 1]), slice(c_bounds[i], c_bounds[i + 1])
        bucket[name] = SessionState(o_first_a[o].copy(), o_last_a[o].copy(), o_counts_a[o].copy(),
                                    c_first_a[c].copy(), c_last_a[c].copy())
    return bucket


def bucket_next_due(bucket: SessionBucket, gap_ms: int, memory_ms: int) -> int | None:
    dues = [d for s in bucket.values() if (d := s.next_due(gap_ms, memory_ms)) is not None]
    return min(dues) if dues else None
