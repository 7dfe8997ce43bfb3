"""The sliding and session rules of the ``keyed_windows`` query over its processor's state, run in Spark's Python
workers: (de)serialises each key's state, calls the pure rules (``analytics.keyed.sliding``,
``analytics.keyed.sessions``) and shapes their output rows (``analytics.keyed.schema``). The processor
(``analytics.keyed.processor``) imports this module only where rows are handled: Spark also unpickles the processor
in a driver-side process at every start of the query, which needs none of these imports.

The logic meets Spark's state through three small interfaces, ``StateRow``, ``Timers`` and ``BatchClock``, which
Spark's own objects (``ValueState``, ``StatefulProcessorHandle``, ``TimerValues``) satisfy as they are; the tests
drive the logic over an in-memory double of them (``tests/support/keyed_state.py``), with Spark's call order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import pandas as pd

from analytics.keyed import sessions, sliding
from analytics.keyed.events import Events
from analytics.keyed.schema import (
    DROPPED_RUN,
    ID_SEPARATOR,
    OPEN_SESSION,
    OPEN_SESSION_GONE,
    OUTPUT_SCHEMA,
    RUN_EVENTS,
    RUN_LAST,
    RUN_LEVELS,
    SESSION_KEY,
    SLIDING,
)


class StateRow(Protocol):
    """One state row of the current key (Spark's ``ValueState``): each call is a round trip to Spark's JVM."""

    def get(self) -> tuple[Any, ...] | None: ...

    def update(self, new_value: tuple[Any, ...]) -> None: ...

    def clear(self) -> None: ...


class Timers(Protocol):
    """The current key's event-time timers (Spark's ``StatefulProcessorHandle``, by its method names)."""

    def registerTimer(self, expiryTimestampMs: int) -> None: ...   # Spark's method names

    def deleteTimer(self, expiryTimestampMs: int) -> None: ...


class BatchClock(Protocol):
    """The micro-batch's watermark (Spark's ``TimerValues``)."""

    def getCurrentWatermarkInMs(self) -> int: ...


_NUMPY_TYPES = {"string": object, "long": np.int64, "int": np.int32, "double": np.float64}
_MISSING = {object: None, np.float64: np.nan}   # and 0 for integer columns
# Columns a row type does not use are 0 (counts) or NaN; the writer reads only the columns of each row type.
OUTPUT_FIELDS = [(c.split()[0], _NUMPY_TYPES[c.split()[1]]) for c in OUTPUT_SCHEMA.split(", ")]


def _output(n: int, columns: dict[str, Any]) -> pd.DataFrame:
    """An output frame of ``n`` rows; ``columns`` holds arrays or scalars (repeated). Built from numpy arrays
    with plain ``object`` strings: pandas' Arrow-backed strings reach PySpark's serializer as ChunkedArrays, which
    it rejects, and per-key frames must be cheap (this runs once per key and batch)."""
    data = {}
    for name, dtype in OUTPUT_FIELDS:
        value = columns.get(name)
        if isinstance(value, np.ndarray):
            data[name] = value.astype(dtype, copy=False)
        else:
            data[name] = np.full(n, _MISSING.get(dtype, 0) if value is None else value, dtype=dtype)
    return pd.DataFrame(data, copy=False)


class KeyedWindowsLogic:
    """The sliding and session rules over a :class:`~analytics.keyed.processor.KeyedWindowsProcessor`'s state, in
    Spark's Python workers (created there at the first rows or timer, so that only the workers import it)."""

    def __init__(self, timers: Timers, sliding_state: StateRow, session_state: StateRow,
                 sliding_length_ms: int, session_gap_ms: int, session_memory_ms: int) -> None:
        self.timers = timers
        self.sliding_state = sliding_state
        self.session_state = session_state
        self.sliding_length_ms = sliding_length_ms
        self.session_gap_ms = session_gap_ms
        self.session_memory_ms = session_memory_ms

    # State (de)serialization: numpy arrays as raw bytes, one state row per key ---------------------------------
    # Each state call is a round trip to Spark's JVM, the largest cost of the query after the input itself
    # (docs/performance.md#the-python-stateful-operator): a state is read with ``get`` alone (None when absent),
    # and timers are not kept in state.
    def _load_sliding(self) -> sliding.SlidingState:
        stored = self.sliding_state.get()
        if stored is None:
            return sliding.SlidingState()
        t, value, level, arrived, p_t, p_part, p_off, ids = stored
        return sliding.SlidingState(
            t=np.frombuffer(t, np.int64).copy(), value=np.frombuffer(value, np.float64).copy(),
            level=np.frombuffer(level, np.int8).copy(), arrived_wm=np.frombuffer(arrived, np.int64).copy(),
            pending_t=np.frombuffer(p_t, np.int64).copy(), pending_partition=np.frombuffer(p_part, np.int32).copy(),
            pending_offset=np.frombuffer(p_off, np.int64).copy(),
            pending_ids=ids.split(ID_SEPARATOR) if ids else [])

    def _save_sliding(self, state: sliding.SlidingState) -> None:
        if state.empty:
            self.sliding_state.clear()
            return
        self.sliding_state.update((
            state.t.tobytes(), state.value.tobytes(), state.level.tobytes(), state.arrived_wm.tobytes(),
            state.pending_t.tobytes(), state.pending_partition.tobytes(), state.pending_offset.tobytes(),
            ID_SEPARATOR.join(state.pending_ids)))

    def _load_sessions(self) -> sessions.SessionBucket:
        return sessions.unpack(self.session_state.get())

    def _sessions_due(self, bucket: sessions.SessionBucket) -> int | None:
        return sessions.bucket_next_due(bucket, self.session_gap_ms, self.session_memory_ms)

    def _save_sessions(self, bucket: sessions.SessionBucket) -> None:
        if sessions.bucket_empty(bucket):
            self.session_state.clear()
        else:
            self.session_state.update(sessions.pack(bucket))

    def _move_timer(self, registered: int | None, due: int | None) -> None:
        """Move the key's one timer from ``registered`` to ``due``.

        The registered timer is always the stored state's next due time (every state write is followed by this
        call, and a timer that fired is gone), so it is computed from the state as loaded instead of being kept
        in a state of its own: three round trips fewer per key and batch."""
        if due == registered:
            return
        if registered is not None:
            self.timers.deleteTimer(registered)
        if due is not None:
            self.timers.registerTimer(due)

    # Spark's callbacks, through the processor ---------------------------------------------------------------
    def handle_input_rows(self, key: Any, rows: Iterator[pd.DataFrame],
                          timer_values: BatchClock) -> Iterator[pd.DataFrame]:
        key = _unpack_key(key)
        frames = list(rows)
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        events = Events.from_input(frame)
        watermark = timer_values.getCurrentWatermarkInMs()
        if key[0] == SLIDING:
            state = self._load_sliding()
            registered = state.next_due
            late = sliding.add_events(state, events, watermark, self.sliding_length_ms)
            self._save_sliding(state)
            self._move_timer(registered, state.next_due)
            if len(late):
                yield self._stragglers(key, late, late.t - self.sliding_length_ms, late.t, watermark)
        else:
            # Each row is a run of a session key's events (analytics.keyed.runs): its first and last time and
            # its counts. A dropped run goes out as one row, which the writer expands into its events' stragglers.
            bucket = self._load_sessions()
            registered = self._sessions_due(bucket)
            first = events.t
            last = frame[RUN_LAST].to_numpy(np.int64)
            session_keys = frame["session"].to_numpy(object)
            before = sessions.open_before(bucket, session_keys)
            dropped_keys, dropped_at, start, end = sessions.add_bucket_runs(
                bucket, session_keys, first, last, _run_counts(frame), watermark, self.session_gap_ms)
            opened = sessions.open_changes(bucket, before, watermark, self.session_gap_ms)
            self._save_sessions(bucket)
            self._move_timer(registered, self._sessions_due(bucket))
            yield from self._open_sessions(key, opened, watermark)
            if len(dropped_at):
                apps, kinds, names = _session_keys(key, dropped_keys.tolist())
                # The head's Kafka partition and the run's size let the writer find the run's events within
                # that partition when it was formed there (analytics.keyed.runs.events_of_runs).
                yield _output(len(dropped_at), {
                    **self._key_columns(key, DROPPED_RUN, watermark), "app": apps, "kind": kinds, "name": names,
                    "window_start_ms": start, "window_end_ms": end, "event_time_ms": first[dropped_at],
                    RUN_LAST: last[dropped_at], "source_partition": frame["partition"].to_numpy(np.int32)[dropped_at],
                    "event_count": frame[RUN_EVENTS].to_numpy(np.int64)[dropped_at]})

    def handle_expired_timer(self, key: Any, timer_values: BatchClock) -> Iterator[pd.DataFrame]:
        key = _unpack_key(key)
        watermark = timer_values.getCurrentWatermarkInMs()
        # The timer that fired is gone: none is registered until ``_move_timer`` registers the next.
        if key[0] == SLIDING:
            state = self._load_sliding()
            windows = sliding.emit_due(state, watermark, self.sliding_length_ms)
            self._save_sliding(state)
            self._move_timer(None, state.next_due)
            n = len(windows["t"])
            if n:
                yield _output(n, {
                    **self._key_columns(key, "window", watermark), **windows,
                    "window_start_ms": windows["t"] - self.sliding_length_ms, "window_end_ms": windows["t"],
                    "event_time_ms": windows["t"], "source_partition": windows["partition"],
                    "source_offset": windows["offset"], "event_id": windows["id"]})
        else:
            bucket = self._load_sessions()
            parts = []
            for session_key, state in bucket.items():
                due = state.next_due(self.session_gap_ms, self.session_memory_ms)
                if due is not None and due <= watermark:
                    emitted = sessions.emit_due(state, watermark, self.session_gap_ms, self.session_memory_ms)
                    if len(emitted["session_start"]):
                        parts.append((session_key, emitted))
            bucket = {k: v for k, v in bucket.items() if not v.empty}
            self._save_sessions(bucket)
            self._move_timer(None, self._sessions_due(bucket))
            if parts:
                emitted = {c: np.concatenate([e[c] for _, e in parts]) for c in parts[0][1]}
                apps, kinds, names = _session_keys(key, [k for k, e in parts for _ in range(len(e["session_start"]))])
                yield _output(len(kinds), {
                    **self._key_columns(key, "window", watermark), **emitted, "app": apps, "kind": kinds,
                    "name": names,
                    "window_start_ms": emitted["session_start"],
                    "window_end_ms": emitted["last_event_time"] + self.session_gap_ms,
                    "event_time_ms": emitted["last_event_time"]})

    # Output rows ---------------------------------------------------------------------------------------------
    def _open_sessions(self, key: Any, opened: sessions.OpenSessions, watermark: int) -> Iterator[pd.DataFrame]:
        """Sessions in progress: each changed open session as it stands, and the starts no longer open."""
        if len(opened.keys):
            apps, kinds, names = _session_keys(key, opened.keys.tolist())
            yield _output(len(opened.keys), {
                **self._key_columns(key, OPEN_SESSION, watermark), "app": apps, "kind": kinds, "name": names,
                "window_start_ms": opened.first, "window_end_ms": opened.last + self.session_gap_ms,
                "event_time_ms": opened.last,
                **{c: opened.counts[:, i] for i, c in enumerate(sessions.COUNT_COLUMNS)}})
        if len(opened.gone_keys):
            apps, kinds, names = _session_keys(key, opened.gone_keys.tolist())
            yield _output(len(opened.gone_keys), {
                **self._key_columns(key, OPEN_SESSION_GONE, watermark), "app": apps, "kind": kinds, "name": names,
                "window_start_ms": opened.gone_first, "window_end_ms": opened.gone_first + self.session_gap_ms,
                "event_time_ms": opened.gone_first})

    @staticmethod
    def _key_columns(key: Any, row_type: str, watermark: int) -> dict[str, Any]:
        family, app, kind, name, tags = key
        return {"row_type": row_type, "window_kind": family, "app": app, "kind": kind, "name": name,
                "series_tags": tags, "watermark_ms": watermark}

    def _stragglers(self, key: Any, late: Events, start: np.ndarray, end: np.ndarray,
                    watermark: int) -> pd.DataFrame:
        return _output(len(late), {
            **self._key_columns(key, "straggler", watermark), "window_start_ms": start, "window_end_ms": end,
            "event_time_ms": late.t, "source_partition": late.partition, "source_offset": late.offset,
            "event_id": late.id, "device": late.device, "lateness_ms": watermark - late.t})


def _run_counts(frame: pd.DataFrame) -> np.ndarray:
    """A session row's counts (``sessions.COUNT_COLUMNS``) from its run columns."""
    return sessions.run_counts(frame[RUN_EVENTS].to_numpy(np.int64),
                               np.column_stack([frame[c].to_numpy(np.int64) for c in RUN_LEVELS]))


def _session_keys(key: tuple[str, ...], joined: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(apps, key kinds, keys) of a bucket's sessions, for the output's ``app``, ``kind`` and ``name`` columns. A
    bucket of the per-app layout has its app in the operator key and "<kind>\x1e<key>" session keys; a shared one
    (empty app) has JSON [app, kind, key] session keys (``analytics.keyed.layout``)."""
    app = key[1]
    split = [[app, *k.split(SESSION_KEY, 1)] for k in joined] if app else [json.loads(k) for k in joined]
    apps, kinds, names = (np.array([s[i] for s in split], dtype=object) for i in range(3))
    return apps, kinds, names


def _unpack_key(key: tuple[str]) -> tuple[str, str, str, str, str]:
    """(family, app, kind, name, series_tags) from the grouping key (once per key and batch, not per row)."""
    family, app, kind, name, tags = json.loads(key[0])
    return family, app, kind, name, tags
