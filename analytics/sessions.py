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
import pandas as pd

from analytics.sliding import level_codes
from analytics.windows import LEVEL_COLUMNS

COUNT_COLUMNS = ("event_count", "metric_count", "log_count", *[f"level_{lvl}" for lvl in LEVEL_COLUMNS])


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


def _event_counts(events: pd.DataFrame) -> np.ndarray:
    counts = np.zeros((len(events), len(COUNT_COLUMNS)), dtype=np.int64)
    counts[:, 0] = 1
    kinds = events["kind"].to_numpy()
    counts[:, 1] = kinds == "metric"
    counts[:, 2] = kinds == "log"
    codes = level_codes(events["level"])
    for code in range(len(LEVEL_COLUMNS)):
        counts[:, 3 + code] = codes == code
    return counts


def add_events(state: SessionState, events: pd.DataFrame, watermark: int, gap_ms: int) -> pd.DataFrame:
    """Take a batch's events of one key (columns ``t``, ``kind``, ``level``, ``partition``, ``offset``, ``id``,
    ``device``). Returns the dropped stragglers with ``window_start``/``window_end`` of the session each would
    have belonged to."""
    events = events.sort_values("t", kind="stable").reset_index(drop=True)
    new_counts = _event_counts(events)
    # Intervals: (first, last, source, index); source 0 = closed session, 1 = open session, 2 = new event.
    # An open session the watermark has reached is closed already, even if its timer fires only after this input.
    due = state.open_last + gap_ms <= watermark
    intervals = ([(int(f), int(la), 0, -1) for f, la in zip(state.closed_first, state.closed_last, strict=True)]
                 + [(int(state.open_first[i]), int(state.open_last[i]), 0 if due[i] else 1, i)
                    for i in range(len(state.open_first))]
                 + [(int(t), int(t), 2, i) for i, t in enumerate(events["t"])])
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
    dropped_rows: list[tuple[int, int, int]] = []   # (event index, window start, window end)
    for run in runs:
        fresh = [i for _, _, source, i in run if source == 2]
        if not fresh:
            continue
        closed = [(f, last) for f, last, source, _ in run if source == 0]
        first = min(f for f, _, _, _ in run)
        last = max(la for _, la, _, _ in run)
        if closed:
            f, la = closed[0]
            dropped_rows += [(i, f, la + gap_ms) for i in fresh]
        elif last + gap_ms <= watermark:
            dropped_rows += [(i, first, last + gap_ms) for i in fresh]
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
    idx = [i for i, _, _ in dropped_rows]
    dropped = events.loc[idx, ["t", "partition", "offset", "id", "device"]].reset_index(drop=True)
    dropped["window_start"] = [s for _, s, _ in dropped_rows]
    dropped["window_end"] = [e for _, _, e in dropped_rows]
    return dropped


def emit_due(state: SessionState, watermark: int, gap_ms: int, memory_ms: int) -> pd.DataFrame:
    """Emit the open sessions the watermark has closed (``last + G <= W``); forget closed sessions that ended
    more than ``memory_ms`` before the watermark. Returns ``session_start``, ``last_event_time`` and the
    COUNT_COLUMNS per session."""
    due = state.open_last + gap_ms <= watermark
    out = pd.DataFrame(state.open_counts[due], columns=list(COUNT_COLUMNS))
    out.insert(0, "session_start", state.open_first[due])
    out.insert(1, "last_event_time", state.open_last[due])
    closed_first = np.concatenate([state.closed_first, state.open_first[due]])
    closed_last = np.concatenate([state.closed_last, state.open_last[due]])
    remember = closed_last + gap_ms + memory_ms > watermark
    state.closed_first, state.closed_last = closed_first[remember], closed_last[remember]
    state.open_first, state.open_last = state.open_first[~due], state.open_last[~due]
    state.open_counts = state.open_counts[~due]
    return out
