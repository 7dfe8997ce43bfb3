"""Sliding and session windows as one Spark stateful query (``transformWithStateInPandas``, RocksDB state).

Both need per-key, time-sorted state and event-time timers, which Spark's built-in aggregations do not offer
with the BRIEF's rules, so one stateful processor serves two key families:

- ``sliding``: key (app, kind, name, series_tags) of the configured series -> ``analytics.keyed.sliding``
- ``session``: key (bucket of the session key), one row per run             -> ``analytics.keyed.sessions``
  (session key = app with user, or with device when there is no user; ``stream.session_buckets`` buckets share a
  state row and a timer each, laid out as the checkpoint records: ``analytics.keyed.layout``; a run is a batch's
  events of one session key less than G apart, marked by ``accept``: ``analytics.keyed.runs``)

Both families share one read of the accepted events. The processor sees every accepted event of a sliding series
and every session run, late ones included (its input time column carries no watermark marker, so Spark does not
pre-filter), and applies the watermark rules itself with the watermark Spark hands it; each key keeps one timer at
the next time it needs the watermark. Output rows are windows, dropped stragglers and dropped session runs (which
the writer expands into their events' stragglers), told apart by ``row_type``.

This module declares the query; the processor (``analytics.keyed.processor``) runs the worker-side logic
(``analytics.keyed.logic``).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analytics.event_time import event_time_ms, with_watermark
from analytics.keyed import rows as keyed_rows
from analytics.keyed import runs as session_runs
from analytics.keyed.events import NO_LEVEL
from analytics.keyed.layout import SessionLayout
from analytics.keyed.processor import KeyedWindowsProcessor
from analytics.keyed.schema import KEY, OUTPUT_SCHEMA, RUN_EVENTS, RUN_LAST, RUN_LEVELS, SESSION, SESSION_KEY, SLIDING
from analytics.vocabulary import LEVEL_COLUMNS
from eventide.config import Config


def keyed_windows(events: DataFrame, config: Config, layout: SessionLayout) -> DataFrame:
    """The query's result: sliding windows, sessions and dropped stragglers (``row_type``); sessions kept in the
    checkpoint's ``layout``."""
    stream = config.stream
    read_filter, columns = _input_columns(config, layout)
    # Skips reading the rows it would not take anyway (analytics.keyed.rows); the rules below still choose.
    keyed = with_watermark(events.where(read_filter), config).select(*columns)
    processor = KeyedWindowsProcessor(stream.sliding_window_s * 1000, stream.session_gap_s * 1000,
                                      stream.session_memory_s * 1000)
    return keyed.groupBy(KEY).transformWithStateInPandas(
        processor, OUTPUT_SCHEMA, "Append", "EventTime")


_INPUT_COLUMNS: dict[tuple[int, int, SessionLayout], tuple[Column, tuple[Column, ...]]] = {}


def _input_columns(config: Config, layout: SessionLayout) -> tuple[Column, tuple[Column, ...]]:
    """(the rows of a file to read, the processor's input columns), built once per process and the settings that
    decide them: built anew they cost thousands of calls into Spark's JVM at every start of the query
    (docs/performance.md#query-columns-built-once-per-process). Columns are unresolved expressions, valid for any
    DataFrame and session of the JVM."""
    key = (keyed_rows.selection(config), config.stream.session_gap_s, layout)
    if key not in _INPUT_COLUMNS:
        _INPUT_COLUMNS[key] = (keyed_rows.read_filter(config), _build_input_columns(config, layout))
    return _INPUT_COLUMNS[key]


def _build_input_columns(config: Config, layout: SessionLayout) -> tuple[Column, ...]:
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

    def entry(family: str, app: Column, kind: Column, name: Column, tags: Column, session: Column) -> Column:
        key = F.to_json(F.array(F.lit(family), app, kind, name, tags))
        return F.struct(key.alias(KEY), session.alias("session"))

    buckets = F.lit(layout.buckets)
    if layout.per_app:
        # The app is in the operator key, the session key is "<kind>\x1e<key>" (analytics.keyed.logic reads both).
        bucket = F.pmod(F.xxhash64(session_kind, session_key), buckets)
        session_entry = entry(SESSION, F.col("app"), F.lit(""), bucket.cast("string"), F.lit(""),
                              F.concat(session_kind, F.lit(SESSION_KEY), session_key))
    else:
        # The operator key's app is empty: each session key is the JSON array [app, kind, key].
        bucket = F.pmod(F.xxhash64(F.col("app"), session_kind, session_key), buckets)
        session_entry = entry(SESSION, F.lit(""), F.lit(""), bucket.cast("string"), F.lit(""),
                              F.to_json(F.array(F.col("app"), session_kind, session_key)))
    sliding_entry = entry(SLIDING, F.col("app"), F.col("kind"), F.col("name"), F.col("series_tags"), F.lit(""))
    # A run's head has a session entry, events of sliding series a sliding one: one read of the batch for both.
    entries = F.filter(F.array(F.when(is_run_head, session_entry),
                               F.when(keyed_rows.sliding_series(config), sliding_entry)),
                       lambda entry: entry.isNotNull())
    return (*[F.col(c) if isinstance(c, str) else c for c in payload], F.inline(entries))
