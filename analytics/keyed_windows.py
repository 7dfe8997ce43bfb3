"""Sliding and session windows as one Spark stateful query (``transformWithStateInPandas``, RocksDB state).

Both need per-key, time-sorted state and event-time timers, which Spark's built-in aggregations do not offer
with the BRIEF's rules, so one stateful processor serves two key families:

- ``sliding``: key (app, kind, name, series_tags) of the configured series -> ``analytics.sliding``
- ``session``: key (app, bucket of the session key), one row per run       -> ``analytics.sessions``
  (session key = user, or device without a user; ``stream.session_buckets`` buckets share a state row and a timer;
  a run is a batch's events of one session key less than G apart, marked by ``accept``: ``analytics.session_runs``)

Both families share one read of the accepted events. The processor sees every accepted event of a sliding series
and every session run, late ones included (its input time column carries no watermark marker, so Spark does not
pre-filter), and applies the watermark rules itself with the watermark Spark hands it; each key keeps one timer at
the next time it needs the watermark. Output rows are windows, dropped stragglers and dropped session runs (which
the writer expands into their events' stragglers), told apart by ``row_type``.

The processor (``analytics.keyed_processor``) runs the logic here (``KeyedWindowsLogic``), which its module imports
only where rows are handled: Spark also unpickles the processor in a driver-side process at every start of the
query, which needs none of this module's imports.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import StatefulProcessorHandle, TimerValues, ValueState

from analytics import keyed_rows, session_runs, sessions, sliding
from analytics.keyed_events import NO_LEVEL, Events
from analytics.keyed_processor import KeyedWindowsProcessor
from analytics.windows import LEVEL_COLUMNS, LEVEL_FIELDS, event_time_ms, with_watermark
from eventide.config import Config

KEYED_WINDOWS_QUERY = "keyed_windows"
SLIDING, SESSION = "sliding", "session"
# The grouping key is one column, a JSON array [family, app, kind, name, series_tags], and the payload is as
# narrow as the logic allows: every column crosses into Python row by row in PySpark's transformWithStateInPandas
# serializer, which is most of this query's cost (docs/benchmarks.md); 16 columns cost ~2x what 9 do.
KEY = "key"
OUTPUT_SCHEMA = ", ".join([
    "row_type string", "window_kind string", "app string", "kind string", "name string", "series_tags string",
    "window_start_ms long", "window_end_ms long", "event_time_ms long", "source_partition int",
    "source_offset long", "event_id string", "device string", "watermark_ms long", "lateness_ms long",
    "event_count long", "value_count long", "sum double", "min double", "max double", "metric_count long",
    "log_count long", *[f"{c} long" for c in LEVEL_FIELDS], "run_last_ms long",
])
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


# A session row stands for a run of its key's events (analytics.session_runs); these input columns carry the run.
RUN_LAST, RUN_EVENTS = "run_last_ms", "run_events"
RUN_LEVELS = tuple(f"run_{level}" for level in LEVEL_COLUMNS)
DROPPED_RUN = "dropped_run"   # output row: a run of session events dropped whole, expanded by the writer
_SESSION_KEY = "\x1e"   # joins key kind (user | device) and key in a bucket's session keys
_ID_SEPARATOR = "\x1f"


class KeyedWindowsLogic:
    """The sliding and session rules over a :class:`~analytics.keyed_processor.KeyedWindowsProcessor`'s state, in
    Spark's Python workers (created there at the first rows or timer, so that only the workers import it)."""

    def __init__(self, handle: StatefulProcessorHandle, sliding_state: ValueState, session_state: ValueState,
                 sliding_length_ms: int, session_gap_ms: int, session_memory_ms: int) -> None:
        self.handle = handle
        self.sliding_state = sliding_state
        self.session_state = session_state
        self.sliding_length_ms = sliding_length_ms
        self.session_gap_ms = session_gap_ms
        self.session_memory_ms = session_memory_ms

    # State (de)serialization: numpy arrays as raw bytes, one state row per key ---------------------------------
    # Each state call is a round trip to Spark's JVM, the largest cost of the query after the input itself
    # (docs/benchmarks.md): a state is read with ``get`` alone (None when absent), and timers are not kept in state.
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
            pending_ids=ids.split(_ID_SEPARATOR) if ids else [])

    def _save_sliding(self, state: sliding.SlidingState) -> None:
        if state.empty:
            self.sliding_state.clear()
            return
        self.sliding_state.update((
            state.t.tobytes(), state.value.tobytes(), state.level.tobytes(), state.arrived_wm.tobytes(),
            state.pending_t.tobytes(), state.pending_partition.tobytes(), state.pending_offset.tobytes(),
            _ID_SEPARATOR.join(state.pending_ids)))

    def _load_sessions(self) -> sessions.SessionBucket:
        return sessions.unpack(self.session_state.get())

    def _sessions_due(self, bucket: sessions.SessionBucket) -> int | None:
        return sessions.bucket_next_due(bucket, self.session_gap_ms, self.session_memory_ms)

    def _save_sessions(self, bucket: sessions.SessionBucket) -> None:
        if all(state.empty for state in bucket.values()):
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
            self.handle.deleteTimer(registered)
        if due is not None:
            self.handle.registerTimer(due)

    # Spark's callbacks, through the processor ---------------------------------------------------------------
    def handle_input_rows(self, key: Any, rows: Iterator[pd.DataFrame],
                          timer_values: TimerValues) -> Iterator[pd.DataFrame]:
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
            # Each row is a run of a session key's events (analytics.session_runs): its first and last time and
            # its counts. A dropped run goes out as one row, which the writer expands into its events' stragglers.
            bucket = self._load_sessions()
            registered = self._sessions_due(bucket)
            first = events.t
            last = frame[RUN_LAST].to_numpy(np.int64)
            dropped_keys, dropped_at, start, end = sessions.add_bucket_runs(
                bucket, frame["session"].to_numpy(object), first, last, _run_counts(frame), watermark,
                self.session_gap_ms)
            self._save_sessions(bucket)
            self._move_timer(registered, self._sessions_due(bucket))
            if len(dropped_at):
                kinds, names = self._session_keys(dropped_keys.tolist())
                yield _output(len(dropped_at), {
                    **self._key_columns(key, DROPPED_RUN, watermark), "kind": kinds, "name": names,
                    "window_start_ms": start, "window_end_ms": end, "event_time_ms": first[dropped_at],
                    RUN_LAST: last[dropped_at]})

    def handle_expired_timer(self, key: Any, timer_values: TimerValues) -> Iterator[pd.DataFrame]:
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
                kinds, names = self._session_keys([k for k, e in parts for _ in range(len(e["session_start"]))])
                yield _output(len(kinds), {
                    **self._key_columns(key, "window", watermark), **emitted, "kind": kinds, "name": names,
                    "window_start_ms": emitted["session_start"],
                    "window_end_ms": emitted["last_event_time"] + self.session_gap_ms,
                    "event_time_ms": emitted["last_event_time"]})

    # Output rows ---------------------------------------------------------------------------------------------
    @staticmethod
    def _session_keys(joined: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(key kinds, keys) of sessions in the output's ``kind`` and ``name`` columns."""
        split = [k.split(_SESSION_KEY, 1) for k in joined]
        return np.array([k for k, _ in split], dtype=object), np.array([n for _, n in split], dtype=object)

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


def _unpack_key(key: tuple[str]) -> tuple[str, str, str, str, str]:
    """(family, app, kind, name, series_tags) from the grouping key (once per key and batch, not per row)."""
    family, app, kind, name, tags = json.loads(key[0])
    return family, app, kind, name, tags


def keyed_windows(events: DataFrame, config: Config) -> DataFrame:
    """The query's result: sliding windows, sessions and dropped stragglers (``row_type``)."""
    stream = config.stream
    read_filter, columns = _input_columns(config)
    # Skips reading the rows it would not take anyway (analytics.keyed_rows); the rules below still choose.
    keyed = with_watermark(events.where(read_filter), config).select(*columns)
    processor = KeyedWindowsProcessor(stream.sliding_window_s * 1000, stream.session_gap_s * 1000,
                                      stream.session_memory_s * 1000)
    return keyed.groupBy(KEY).transformWithStateInPandas(
        processor, OUTPUT_SCHEMA, "Append", "EventTime")


_INPUT_COLUMNS: dict[tuple[int, int, int], tuple[Column, tuple[Column, ...]]] = {}


def _input_columns(config: Config) -> tuple[Column, tuple[Column, ...]]:
    """(the rows of a file to read, the processor's input columns), built once per process and the settings that
    decide them: built anew they took ~0.2 s of calls into Spark's JVM at every start of the query
    (docs/benchmarks.md). Columns are unresolved expressions, valid for any DataFrame and session of the JVM."""
    key = (keyed_rows.selection(config), config.stream.session_gap_s, config.stream.session_buckets)
    if key not in _INPUT_COLUMNS:
        _INPUT_COLUMNS[key] = (keyed_rows.read_filter(config), _build_input_columns(config))
    return _INPUT_COLUMNS[key]


def _build_input_columns(config: Config) -> tuple[Column, ...]:
    levels = F.array(*[F.lit(level) for level in LEVEL_COLUMNS])
    payload = [
        # A plain long, not the watermarked timestamp: Spark would otherwise drop late rows before the processor.
        event_time_ms().alias("t"),
        # The level's index in LEVEL_COLUMNS, NO_LEVEL for metrics (accepted logs always carry a known level).
        F.when(F.col("kind") == "log", F.array_position(levels, F.col("level")) - 1)
        .otherwise(F.lit(NO_LEVEL)).cast("byte").alias("level_code"),
        "metric_value", "partition", "offset", "id", "device",
    ]
    # A file published with runs of this gap has one session row per run (its head); any other file (published
    # before runs, or with another gap) has each event stand for a run of its own.
    has_runs = F.coalesce(F.col(session_runs.GAP) == config.stream.session_gap_s * 1000, F.lit(False))
    payload += [
        F.coalesce(F.when(has_runs, F.col(session_runs.LAST)).otherwise(event_time_ms()), F.lit(0))
        .alias(RUN_LAST),
        F.coalesce(F.when(has_runs, F.col(session_runs.EVENTS)).otherwise(F.lit(1)), F.lit(0)).alias(RUN_EVENTS),
        *[F.coalesce(F.when(has_runs, F.col(stored)).otherwise((F.col("level") == level).cast("int")), F.lit(0))
          .alias(name) for level, stored, name in zip(LEVEL_COLUMNS, session_runs.LEVEL_COUNTS, RUN_LEVELS,
                                                       strict=True)],
    ]
    is_run_head = ~has_runs | (F.col(session_runs.EVENTS) > 0)
    has_user = F.col("user").isNotNull()
    user_kind, device_kind = session_runs.SESSION_KINDS
    session_kind = F.when(has_user, F.lit(user_kind)).otherwise(F.lit(device_kind))
    session_key = F.coalesce("user", "device")
    bucket = F.pmod(F.xxhash64(session_kind, session_key), F.lit(config.stream.session_buckets))

    def entry(family: str, kind: Column, name: Column, tags: Column, session: Column) -> Column:
        key = F.to_json(F.array(F.lit(family), F.col("app"), kind, name, tags))
        return F.struct(key.alias(KEY), session.alias("session"))

    session_entry = entry(SESSION, F.lit(""), bucket.cast("string"), F.lit(""),
                          F.concat(session_kind, F.lit(_SESSION_KEY), session_key))
    sliding_entry = entry(SLIDING, F.col("kind"), F.col("name"), F.col("series_tags"), F.lit(""))
    # A run's head has a session entry, events of sliding series a sliding one: one read of the batch for both.
    entries = F.filter(F.array(F.when(is_run_head, session_entry),
                               F.when(keyed_rows.sliding_series(config), sliding_entry)),
                       lambda entry: entry.isNotNull())
    return (*[F.col(c) if isinstance(c, str) else c for c in payload], F.inline(entries))
