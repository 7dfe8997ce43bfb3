"""Sliding windows (BRIEF §2): for each accepted event e of a series, the trailing window ``(t_e - L, t_e]``.

Pure logic over one series' state; ``analytics.keyed.query`` runs it inside Spark's ``transformWithStateInPandas``
with one event-time timer per series. The state is a time buffer of the accepted events that can still fall in
an open window (``t > watermark - L``) plus the events whose own window is not emitted yet (pending).

Rules (BRIEF §3), with W the watermark of the micro-batch:
- an arriving event with ``t <= W`` has a closed window of its own: it is a dropped straggler, but it still
  counts in windows that are open (``t_e > W``), so it joins the buffer;
- a pending window is emitted once ``W >= t_e``, over the buffered events that arrived while it was open
  (arrivals of the emitting batch with ``t <= W`` came after it closed and are left out);
- all windows due in one batch are computed together from one sorted buffer: counts and sums from prefix sums,
  min and max from a sparse table, so a firing costs O(n log n) for the whole buffer, not O(n) per window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from analytics.keyed.events import Events
from analytics.vocabulary import LEVEL_FIELDS


def _empty(dtype: type) -> np.ndarray:
    return np.empty(0, dtype=dtype)


@dataclass
class SlidingState:
    """Buffer (``t``, ``value``, ``level``, ``arrived_wm``) and pending events of one series."""

    t: np.ndarray = field(default_factory=lambda: _empty(np.int64))
    value: np.ndarray = field(default_factory=lambda: _empty(np.float64))      # NaN for logs
    level: np.ndarray = field(default_factory=lambda: _empty(np.int8))         # index in LEVEL_FIELDS or -1
    arrived_wm: np.ndarray = field(default_factory=lambda: _empty(np.int64))   # watermark when it arrived
    pending_t: np.ndarray = field(default_factory=lambda: _empty(np.int64))
    pending_partition: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    pending_offset: np.ndarray = field(default_factory=lambda: _empty(np.int64))
    pending_ids: list[str] = field(default_factory=list)

    @property
    def next_due(self) -> int | None:
        """The event time of the next window to emit (the timer to set)."""
        return int(self.pending_t.min()) if len(self.pending_t) else None

    @property
    def empty(self) -> bool:
        return not len(self.t) and not len(self.pending_t)


def add_events(state: SlidingState, events: Events, watermark: int, length_ms: int) -> Events:
    """Take a batch's events of one series; returns the dropped stragglers (own window already closed)."""
    late = events.t <= watermark
    useful = events.t > watermark - length_ms          # may still fall in a window that is open
    state.t = np.concatenate([state.t, events.t[useful]])
    state.value = np.concatenate([state.value, events.value[useful]])
    state.level = np.concatenate([state.level, events.level[useful]])
    state.arrived_wm = np.concatenate([state.arrived_wm, np.full(int(useful.sum()), watermark, np.int64)])
    on_time = ~late
    state.pending_t = np.concatenate([state.pending_t, events.t[on_time]])
    state.pending_partition = np.concatenate([state.pending_partition, events.partition[on_time]])
    state.pending_offset = np.concatenate([state.pending_offset, events.offset[on_time]])
    state.pending_ids.extend(events.id[on_time].tolist())
    return events.take(late)


def _sparse_table(values: np.ndarray, op: np.ufunc) -> list[np.ndarray]:
    table = [values]
    span = 1
    while 2 * span <= len(values):
        prev = table[-1]
        table.append(op(prev[:-span], prev[span:]))
        span *= 2
    return table


def _range_query(table: list[np.ndarray], op: np.ufunc, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """op over values[lo:hi] for each (lo, hi) with hi > lo."""
    k = np.floor(np.log2(hi - lo)).astype(np.int64)
    out = np.empty(len(lo), dtype=np.float64)
    for level in np.unique(k):
        sel = k == level
        row = table[level]
        out[sel] = op(row[lo[sel]], row[hi[sel] - (1 << level)])
    return out


def emit_due(state: SlidingState, watermark: int, length_ms: int) -> dict[str, np.ndarray]:
    """Emit every pending window with ``t_e <= watermark`` and expire what no open window can still use.

    Returns columns, one entry per emitted window: ``t`` (= t_e), ``partition``, ``offset``, ``id``,
    ``event_count``, ``value_count``, ``sum``, ``min``, ``max`` and ``level_<name>`` counts (NaN min/max when the
    window has no values).
    """
    due = state.pending_t <= watermark
    te = state.pending_t[due]
    out: dict[str, np.ndarray] = {
        "t": te, "partition": state.pending_partition[due], "offset": state.pending_offset[due],
        "id": np.array(state.pending_ids, dtype=object)[due] if state.pending_ids else np.empty(0, object),
    }
    if len(te):
        usable = state.arrived_wm < watermark
        order = np.argsort(state.t[usable], kind="stable")
        ts, vals, levels = state.t[usable][order], state.value[usable][order], state.level[usable][order]
        lo = np.searchsorted(ts, te - length_ms, side="right")
        hi = np.searchsorted(ts, te, side="right")
        out["event_count"] = hi - lo
        has_value = ~np.isnan(vals)
        counts = np.concatenate([[0], np.cumsum(has_value)])
        out["value_count"] = counts[hi] - counts[lo]
        # Extended precision keeps prefix-sum differences accurate when the buffer sum dwarfs a window's.
        sums = np.concatenate([[0], np.cumsum(np.where(has_value, vals, 0.0).astype(np.longdouble))])
        out["sum"] = (sums[hi] - sums[lo]).astype(np.float64)
        with_values = out["value_count"] > 0
        mins = np.full(len(te), np.nan)
        maxs = np.full(len(te), np.nan)
        if with_values.any():
            low_table = _sparse_table(np.where(has_value, vals, np.inf), np.minimum)
            high_table = _sparse_table(np.where(has_value, vals, -np.inf), np.maximum)
            mins[with_values] = _range_query(low_table, np.minimum, lo[with_values], hi[with_values])
            maxs[with_values] = _range_query(high_table, np.maximum, lo[with_values], hi[with_values])
        out["min"], out["max"] = mins, maxs
        for code, level_field in enumerate(LEVEL_FIELDS):
            c = np.concatenate([[0], np.cumsum(levels == code)])
            out[level_field] = c[hi] - c[lo]
    keep = ~due
    state.pending_t, state.pending_partition = state.pending_t[keep], state.pending_partition[keep]
    state.pending_offset = state.pending_offset[keep]
    state.pending_ids = [i for i, k in zip(state.pending_ids, keep, strict=True) if k]
    alive = state.t > watermark - length_ms
    state.t, state.value, state.level = state.t[alive], state.value[alive], state.level[alive]
    state.arrived_wm = state.arrived_wm[alive]
    return out
