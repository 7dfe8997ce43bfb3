"""Dashboard page data queries over a 24 h range: how long each page waits for the store per render.

Serves a temporary embedded store (``python -m store.server`` over a fresh chDB directory, migrated, on a free
port), fills it with 24 h of what the stream job and the alert evaluator write for 50 series (5 apps x 8 metric +
2 log names; tumbling windows with real KLL/HLL sketches, hopping windows, stragglers, corrections, dead letters,
sessions, sliding windows, device clocks, pipeline progress, alerts), then renders each page's data N times the way
the page does: the same ``dashboard.queries`` / ``store.pipeline`` calls with the same arguments, one
``store.client.connect`` per ``common.store`` block of the page and side by side where the page runs them side by
side (``common.fetch`` = ``queries.concurrently``), so a render's time is what the page waits for. Per call, the
median time of the slowest calls (overlapping calls each count their own wait). Plotly/Streamlit rendering is not
included; Kafka (consumer lag) is skipped.

    .venv/bin/python -m bench.dashboard_queries --repeat 20
    .venv/bin/python -m bench.dashboard_queries --tumbling 10,60   # the default config's windows (6x the rows)
    .venv/bin/python -m bench.dashboard_queries --hours 168        # a week stored, the pages still show 24 h

Log search (issue 38), ``--log-lines N`` (``--logs-only`` skips the pages above): N log lines of the same 5 apps and
2 loggers, levels by ``LEVEL_P``, in the ``logs`` table, then the Logs page's searches through
``dashboard.log_search`` (the functions the page calls), each ``--repeat`` times alone and as the page renders it
(its pickers, then the lines beside the count of all matches): (a) a common and a rare word over the last hour, (b)
a phrase, (c) a word with an app and a level, (d) the message patterns of the last 15 min, and, beyond those, the
same over wider ranges. Messages come from 340 templates (31 common and 3 rare shapes x 10 components; Zipf-like
shares within a level, the rare ones at 1e-4 to 2e-6 of the lines) with numbers, durations, UUIDs, trace ids, IPs
and users filled in; tags region/route/status (status by level); 1,000 users and 20 devices per app, UUIDv7 event
ids. The lines cover ``--log-hours`` (default 24 h) evenly, so 10M lines put 417k in the last hour (116 a second,
about 7x the log rate of the page bench's 10 log series): a last-hour search then scans a demanding share, where 10M
lines over the 7-day retention would leave 60k an hour. The history goes in as Arrow blocks of 1M lines; the last
hour one 5 s micro-batch per insert, as the job writes it, so the newest lines sit in the small parts background
merges have not caught up with. Each search is timed as written and after ``OPTIMIZE TABLE logs FINAL`` (one part
per day); ``--log-variants hourly`` also times a copy of the table with the hour first in
its key. What a call reads comes from the store's ``system.events`` counters around one call and from ``EXPLAIN
indexes = 1``.

    .venv/bin/python -m bench.dashboard_queries --logs-only --log-lines 10000000 --log-variants hourly
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from clickhouse_connect.driver.client import Client
from datasketches import hll_sketch, hll_union, kll_doubles_sketch

from analytics.vocabulary import ACCEPT_QUERY, KEYED_WINDOWS_QUERY
from dashboard import queries
from dashboard.log_search import LogQuery, count_lines, distinct_values, message_patterns, search_lines
from eventide.config import Config, load_config
from eventide.envelope import LEVELS
from stack.services import free_port
from store import pipeline
from store.client import connect
from store.migrations import apply_migrations
from store.range_query import SeriesKey
from store.server import child as served_store

REPO = Path(__file__).resolve().parent.parent
METRICS = ("latency_ms", "db_query_ms", "cart_value", "queue_depth", "payload_bytes", "cpu_pct", "mem_mb", "retries")
LOGS = ("app.server", "app.worker")
LEVEL_P = (0.10, 0.70, 0.12, 0.07, 0.01)       # debug … critical: a fifth of log lines at warning or above
SLIDING_LEVELS = ("warning", "error", "critical")
TS = pa.timestamp("ms", tz="UTC")
DAY_MINUTES = 24 * 60


@dataclass(frozen=True)
class Load:
    """What ``hours`` of a 5-app deployment leave in the store (defaults: the issue's 50 series of 1-min windows)."""

    apps: int = 5
    tumbling_s: tuple[int, ...] = (60,)
    hopping: tuple[int, int] | None = (300, 60)       # (length, hop) s, as in eventide.toml
    hours: int = 24
    events_per_minute: int = 100                      # per series: a 60 s window holds ~100 values
    users_per_app: int = 1000
    devices_per_app: int = 20
    trigger_s: int = 5                                # micro-batch interval: device_clocks and progress rows
    versions: int = 1                                 # writes per window (corrections re-publish windows)
    late_ratio: float = 0.001                         # events dropped as stragglers
    dead_ratio: float = 0.0005                        # records dead-lettered
    corrected_ratio: float = 0.03                     # windows re-published with late events

    @property
    def series(self) -> list[SeriesKey]:
        return [SeriesKey(f"app-{a}", kind, name) for a in range(self.apps)
                for kind, names in (("metric", METRICS), ("log", LOGS)) for name in names]


@dataclass
class _Windows:
    """One series' windows of one length, column-wise, with their sketches (to merge into coarser ones)."""

    start_ms: np.ndarray
    length_s: int
    counts: np.ndarray
    values: list[kll_doubles_sketch | None]
    users: list[hll_sketch]
    devices: list[hll_sketch]
    sums: np.ndarray
    mins: np.ndarray
    maxs: np.ndarray
    levels: np.ndarray                               # (windows, 5)


def _finest(series: SeriesKey, load: Load, t0_ms: int, length_s: int, rng: np.random.Generator,
            users: list[str], devices: list[str]) -> _Windows:
    n = load.hours * 3600 // length_s
    counts = rng.poisson(load.events_per_minute * length_s / 60, n)
    metric = series.kind == "metric"
    values: list[kll_doubles_sketch | None] = []
    user_sk, device_sk = [], []
    sums, mins, maxs = np.zeros(n), np.full(n, np.nan), np.full(n, np.nan)
    levels = np.zeros((n, len(LEVELS)), dtype=np.int64)
    for i, c in enumerate(counts):
        u, d = hll_sketch(12), hll_sketch(12)
        for k in rng.integers(0, len(users), c):
            u.update(users[k])
        for k in rng.integers(0, len(devices), c):
            d.update(devices[k])
        user_sk.append(u)
        device_sk.append(d)
        if metric and c:
            v = rng.lognormal(3, 1, c)
            sketch = kll_doubles_sketch(200)
            sketch.update(v)
            values.append(sketch)
            sums[i], mins[i], maxs[i] = v.sum(), v.min(), v.max()
        else:
            values.append(None)
            if not metric:
                levels[i] = rng.multinomial(c, LEVEL_P)
    starts = t0_ms + np.arange(n, dtype=np.int64) * length_s * 1000
    return _Windows(starts, length_s, counts, values, user_sk, device_sk, sums, mins, maxs, levels)


def _merged(fine: _Windows, groups: list[range], starts: np.ndarray, length_s: int) -> _Windows:
    """Windows made of the given groups of finer windows: sketches merged, sums added (what the job would get)."""
    values, users, devices = [], [], []
    for g in groups:
        kll: kll_doubles_sketch | None = None
        for i in g:
            s = fine.values[i]
            if s is not None:
                if kll is None:
                    kll = kll_doubles_sketch(200)
                kll.merge(s)
        values.append(kll)
        for target, source in ((users, fine.users), (devices, fine.devices)):
            union = hll_union(12)
            for i in g:
                union.update(source[i])
            target.append(union.get_result())
    idx = [list(g) for g in groups]
    return _Windows(starts, length_s, np.array([fine.counts[i].sum() for i in idx]), values, users, devices,
                    np.array([fine.sums[i].sum() for i in idx]),
                    np.array([np.nanmin(fine.mins[i]) if not np.isnan(fine.mins[i]).all() else np.nan for i in idx]),
                    np.array([np.nanmax(fine.maxs[i]) if not np.isnan(fine.maxs[i]).all() else np.nan for i in idx]),
                    np.array([fine.levels[i].sum(axis=0) for i in idx]))


def _window_table(series: SeriesKey, w: _Windows, kind: str, hop_s: int, version: int, written: datetime) -> pa.Table:
    n = len(w.start_ms)
    length_ms = w.length_s * 1000
    q = {col: [s.get_quantile(r, inclusive=True) if s is not None else None for s in w.values]
         for col, r in (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999))}
    value_count = np.array([s.n if s is not None else 0 for s in w.values], dtype=np.uint64)
    has = value_count > 0
    cols: dict[str, Any] = {
        "window_kind": [kind] * n, "window_length_ms": np.full(n, length_ms, np.uint64),
        "window_hop_ms": np.full(n, hop_s * 1000, np.uint64),
        "window_start": pa.array(w.start_ms, TS), "window_end": pa.array(w.start_ms + length_ms, TS),
        "app": [series.app] * n, "kind": [series.kind] * n, "name": [series.name] * n, "series_tags": [""] * n,
        "event_count": w.counts.astype(np.uint64), "value_count": value_count, "sum": w.sums,
        "min": pa.array(w.mins, mask=~has), "max": pa.array(w.maxs, mask=~has),
        "mean": pa.array(np.divide(w.sums, value_count, out=np.zeros(n), where=has), mask=~has),
        "rate": w.counts / w.length_s, **{col: pa.array(v, pa.float64()) for col, v in q.items()},
        "distinct_users": np.array([round(s.get_estimate()) for s in w.users], dtype=np.uint64),
        "distinct_devices": np.array([round(s.get_estimate()) for s in w.devices], dtype=np.uint64),
        "value_sketch": pa.array([s.serialize() if s is not None else b"" for s in w.values], pa.binary()),
        "users_sketch": pa.array([s.serialize_compact() for s in w.users], pa.binary()),
        "devices_sketch": pa.array([s.serialize_compact() for s in w.devices], pa.binary()),
        **{f"level_{lvl}": w.levels[:, i].astype(np.uint64) for i, lvl in enumerate(LEVELS)},
        "version": np.full(n, version, np.uint64), "written_at": pa.array([written] * n, TS),
    }
    return pa.table(cols)


def _windows(load: Load, t0_ms: int, rng: np.random.Generator) -> Iterator[tuple[str, pa.Table]]:
    """Per series: each tumbling length and the hopping windows, coarser ones merged from the finest."""
    finest = min(load.tumbling_s)
    written = datetime.now(UTC)
    for series in load.series:
        app = series.app
        users = [f"{app}-user-{u}" for u in range(load.users_per_app)]
        devices = [f"{app}-device-{d}" for d in range(load.devices_per_app)]
        fine = _finest(series, load, t0_ms, finest, rng, users, devices)
        per_s = fine.length_s
        sets: list[tuple[str, int, _Windows]] = [("tumbling", finest, fine)]
        for length in sorted(load.tumbling_s)[1:]:
            m = length // per_s
            groups = [range(i, i + m) for i in range(0, len(fine.counts), m)]
            sets.append(("tumbling", length, _merged(fine, groups, fine.start_ms[::m], length)))
        if load.hopping and series.kind == "metric":       # hopping windows are configured for metrics here
            length, hop = load.hopping
            m, step = length // per_s, hop // per_s
            starts = range(0, len(fine.counts) - m + 1, step)
            sets.append(("hopping", hop, _merged(fine, [range(i, i + m) for i in starts],
                                                  fine.start_ms[list(starts)], length)))
        for version in range(1, load.versions + 1):
            for kind, hop, w in sets:
                yield "window_aggregates", _window_table(series, w, kind, hop, version, written)


def _ms(t: np.ndarray) -> pa.Array:
    return pa.array(t.astype(np.int64), TS)


def _events_total(load: Load) -> int:
    return len(load.series) * load.hours * 60 * load.events_per_minute


def _other_tables(load: Load, t0_ms: int, rng: np.random.Generator) -> Iterator[tuple[str, pa.Table]]:
    """Everything but windows, sized in proportion to the events of the load."""
    span_ms = load.hours * 3_600_000
    series = load.series
    events = _events_total(load)

    # Stragglers: each late event loses its tumbling window of every length and every hopping window holding it.
    late = int(events * load.late_ratio)
    which = rng.integers(0, len(series), late)
    at = t0_ms + rng.integers(0, span_ms, late)
    lateness = (30_000 + rng.exponential(30_000, late)).astype(np.int64)
    detected = at + lateness + rng.integers(0, load.trigger_s * 1000, late)
    parts = []
    kinds = [("tumbling", L * 1000, L * 1000, 0) for L in load.tumbling_s]
    if load.hopping:
        kinds += [("hopping", load.hopping[0] * 1000, load.hopping[1] * 1000, k)
                  for k in range(load.hopping[0] // load.hopping[1])]
    for kind, length, hop, k in kinds:
        start = (at // hop - k) * hop
        parts.append(pd.DataFrame({"window_kind": kind, "window_length_ms": length, "window_hop_ms": hop,
                                   "idx": np.arange(late), "window_start": start, "window_end": start + length}))
    frame = pd.concat(parts)
    i = frame["idx"].to_numpy()
    yield "stragglers", pa.table({
        "window_kind": frame["window_kind"].tolist(), "window_length_ms": frame["window_length_ms"].to_numpy(),
        "window_hop_ms": frame["window_hop_ms"].to_numpy(), "app": [series[s].app for s in which[i]],
        "kind": [series[s].kind for s in which[i]], "name": [series[s].name for s in which[i]],
        "series_tags": [""] * len(i), "window_start": _ms(frame["window_start"].to_numpy()),
        "window_end": _ms(frame["window_end"].to_numpy()), "source_partition": (i % 4).astype(np.int32),
        "source_offset": i.astype(np.int64), "event_id": [f"e-{k}" for k in i],
        "device": [f"device-{k % load.devices_per_app}" for k in i], "corrected_event_time": _ms(at[i]),
        "watermark": _ms(at[i] + lateness[i]), "lateness_ms": lateness[i], "query_name": ["windows"] * len(i),
        "batch_id": (detected[i] - t0_ms) // (load.trigger_s * 1000), "detected_at": _ms(detected[i])})

    # Corrections: a share of the finest tumbling windows re-published once with a few late events.
    finest = min(load.tumbling_s) * 1000
    n = int(len(series) * span_ms // finest * load.corrected_ratio)
    which = rng.integers(0, len(series), n)
    start = t0_ms + rng.integers(0, span_ms // finest, n) * finest
    detected = start + finest + rng.integers(0, 30_000, n)
    yield "corrections", pa.table({
        "window_kind": ["tumbling"] * n, "window_length_ms": np.full(n, finest, np.uint64),
        "window_hop_ms": np.full(n, finest, np.uint64), "app": [series[s].app for s in which],
        "kind": [series[s].kind for s in which], "name": [series[s].name for s in which], "series_tags": [""] * n,
        "window_start": _ms(start), "window_end": _ms(start + finest),
        "batch_id": (detected - t0_ms) // (load.trigger_s * 1000), "late_events": rng.integers(1, 6, n),
        "max_lateness_ms": rng.integers(0, 30_000, n), "detected_at": _ms(detected)})

    n = int(events * load.dead_ratio)
    detected = np.sort(t0_ms + rng.integers(0, span_ms, n))
    yield "dead_letters", pa.table({
        "source_topic": ["eventide.events"] * n, "source_partition": (np.arange(n) % 4).astype(np.int32),
        "source_offset": np.arange(n, dtype=np.int64), "kafka_timestamp": _ms(detected - 1000),
        "reason": [("unparseable JSON", "missing field: value", "unknown kind")[k % 3] for k in range(n)],
        "raw": ['{"v":1,"kind":'] * n, "raw_bytes": np.full(n, 14, np.uint64), "detected_at": _ms(detected)})

    # Sessions: every user about once an hour.
    n = load.apps * load.users_per_app * load.hours
    end = t0_ms + rng.integers(0, span_ms, n)
    duration = rng.exponential(600_000, n).astype(np.int64)
    count = 1 + rng.poisson(40, n)
    apps, users = rng.integers(0, load.apps, n), rng.integers(0, load.users_per_app, n)
    last = end - 300_000
    yield "sessions", pa.table({
        "gap_ms": np.full(n, 300_000, np.uint64), "app": [f"app-{a}" for a in apps], "key_kind": ["user"] * n,
        "session_key": [f"app-{a}-user-{u}" for a, u in zip(apps, users, strict=True)],
        "session_start": _ms(last - duration), "session_end": _ms(end), "last_event_time": _ms(last),
        "duration_ms": duration.astype(np.uint64), "event_count": count.astype(np.uint64),
        "metric_count": (count * 0.8).astype(np.uint64), "log_count": (count - (count * 0.8).astype(int)),
        **{f"level_{lvl}": np.zeros(n, np.uint64) for lvl in LEVELS}, "version": np.ones(n, np.uint64),
        "written_at": _ms(end)})

    # Sliding windows: one per log event at warning or above (the default sliding series).
    log_series = [s for s in series if s.kind == "log"]
    n = int(len(log_series) * load.hours * 60 * load.events_per_minute * sum(LEVEL_P[2:]))
    which = rng.integers(0, len(log_series), n)
    end = np.sort(t0_ms + rng.integers(0, span_ms, n))
    errors = rng.poisson(3, n)
    yield "sliding_windows", pa.table({
        "window_length_ms": np.full(n, 300_000, np.uint64), "app": [log_series[s].app for s in which],
        "kind": ["log"] * n, "name": [log_series[s].name for s in which], "series_tags": [""] * n,
        "window_start": _ms(end - 300_000), "window_end": _ms(end),
        "source_partition": (np.arange(n) % 4).astype(np.int32), "source_offset": np.arange(n, dtype=np.int64),
        "event_id": [f"s-{k}" for k in range(n)], "event_count": (errors + 5).astype(np.uint64),
        "value_count": np.zeros(n, np.uint64), "sum": np.zeros(n), "min": pa.nulls(n, pa.float64()),
        "max": pa.nulls(n, pa.float64()), "mean": pa.nulls(n, pa.float64()), "rate": (errors + 5) / 300,
        "level_debug": np.zeros(n, np.uint64), "level_info": np.zeros(n, np.uint64),
        "level_warning": np.full(n, 5, np.uint64), "level_error": errors.astype(np.uint64),
        "level_critical": np.zeros(n, np.uint64), "version": np.ones(n, np.uint64), "written_at": _ms(end)})

    # Device clocks: every device in every micro-batch of the accept query (a day per insert).
    batches = load.hours * 3600 // load.trigger_s
    devices = [(f"app-{a}", f"app-{a}-device-{d}") for a in range(load.apps) for d in range(load.devices_per_app)]
    offset = rng.normal(0, 5_000, len(devices))
    per_day = 86_400 // load.trigger_s
    for first in range(0, batches, per_day):
        batch = np.tile(np.arange(first, min(first + per_day, batches)), len(devices))
        dev = np.repeat(np.arange(len(devices)), len(batch) // len(devices))
        avg = offset[dev] + rng.normal(0, 50, len(dev))
        received = t0_ms + batch * load.trigger_s * 1000 + 4_000
        yield "device_clocks", pa.table({
            "app": [devices[d][0] for d in dev], "device": [devices[d][1] for d in dev],
            "batch_id": batch.astype(np.uint64),
            "events": rng.poisson(len(series) * load.events_per_minute / 12 / len(devices), len(dev)).astype(
                np.uint64),
            "offset_min_ms": (avg - 40).astype(np.int64), "offset_max_ms": (avg + 40).astype(np.int64),
            "offset_avg_ms": avg, "last_received": _ms(received), "recorded_at": _ms(received + 500)})

    # Pipeline progress: every micro-batch of the three queries, with Spark's sources JSON.
    at = t0_ms + np.arange(batches, dtype=np.int64) * load.trigger_s * 1000
    for query in (pipeline.WINDOWS_QUERY, KEYED_WINDOWS_QUERY, ACCEPT_QUERY):
        sources = [json.dumps([{"description": "KafkaV2[Subscribe[eventide.events]]",
                                "endOffset": {"eventide.events": {str(p): int(b) * 500 + p for p in range(4)}}}])
                   for b in range(batches)]
        mark = at - 30_000 if query != ACCEPT_QUERY else np.zeros(batches, np.int64)   # accept has no watermark
        yield "pipeline_progress", pa.table({
            "query_name": [query] * batches, "query_id": ["q"] * batches, "run_id": ["r"] * batches,
            "batch_id": np.arange(batches, dtype=np.uint64), "batch_timestamp": _ms(at), "watermark": _ms(mark),
            "input_rows": np.full(batches, 2000, np.uint64), "input_rows_per_second": np.full(batches, 400.0),
            "processed_rows_per_second": np.full(batches, 4000.0), "rows_dropped_by_watermark": np.zeros(
                batches, np.uint64), "state_rows": np.full(batches, 200, np.uint64),
            "state_memory_bytes": np.full(batches, 40 << 20, np.uint64), "duration_ms": np.full(batches, 900,
                                                                                                 np.uint64),
            "durations": ['{"addBatch": 700}'] * batches, "sources": sources, "recorded_at": _ms(at + 900)})

    # Alerts: 2 rules, each over 5 series (one per app), a transition every ~15 min each.
    rules = [("p99", s) for s in series if s.name == "latency_ms"] + [("errors", s) for s in series
                                                                      if s.name == "app.server"]
    end_ms = t0_ms + span_ms
    yield "alert_states", pa.table({
        "rule": [r for r, _ in rules], "series": [s.label for _, s in rules],
        "state": [("ok", "firing", "pending")[i % 3] for i in range(len(rules))],
        "breaches": np.ones(len(rules), np.uint32), "evaluated_until": _ms(np.full(len(rules), end_ms - 60_000)),
        "since": _ms(np.full(len(rules), end_ms - 600_000)), "value": np.full(len(rules), 120.0),
        "threshold": np.full(len(rules), 100.0), "severity": ["warning"] * len(rules),
        "updated_at": _ms(np.full(len(rules), end_ms))})
    n = len(rules) * load.hours * 4
    window_end = np.sort(t0_ms + rng.integers(0, span_ms // 60_000, n) * 60_000)
    pick = rng.integers(0, len(rules), n)
    states = [("pending", "firing", "resolved", "ok")[k % 4] for k in range(n)]
    yield "alert_transitions", pa.table({
        "transition_key": [f"{rules[p][0]}|{rules[p][1].label}|{st}|{w}" for p, st, w in zip(pick, states, window_end,
                                                                                              strict=True)],
        "rule": [rules[p][0] for p in pick], "series": [rules[p][1].label for p in pick], "to_state": states,
        "window_end": _ms(window_end), "value": np.full(n, 120.0), "threshold": np.full(n, 100.0),
        "severity": ["warning"] * n, "notify": np.array([st in ("firing", "resolved") for st in states], np.uint8),
        "recorded_at": _ms(window_end + 5_000)})


def populate(config: Config, load: Load, until: datetime) -> dict[str, int]:
    """Write the load's 24 h ending at ``until`` (whole minutes); returns rows written per table."""
    t0_ms = int(until.timestamp() * 1000) // 60_000 * 60_000 - load.hours * 3_600_000
    rng = np.random.default_rng(1)
    written: dict[str, int] = {}
    with connect(config) as client:
        for source in (_windows(load, t0_ms, rng), _other_tables(load, t0_ms, rng)):
            pending: dict[str, list[pa.Table]] = {}
            for table, data in source:
                pending.setdefault(table, []).append(data)
                # A few large inserts rather than one per series: a handful of parts, as after background merges.
                if sum(t.num_rows for t in pending[table]) >= 100_000:
                    _flush(client, table, pending.pop(table), written)
            for table, parts in pending.items():
                _flush(client, table, parts, written)
    return written


def _flush(client: Client, table: str, parts: list[pa.Table], written: dict[str, int]) -> None:
    data = pa.concat_tables(parts)
    client.insert_arrow(table, data)
    written[table] = written.get(table, 0) + data.num_rows


# Page renders ------------------------------------------------------------------------------------------------


@dataclass
class Render:
    """Times and row counts of one render's calls (summed per call name)."""

    seconds: dict[str, float] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)

    def __call__(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        t = time.perf_counter()
        out = fn(*args)
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t
        self.rows[name] = len(out) if hasattr(out, "__len__") else 1
        return out


def overview(config: Config, r: Render, since: datetime, until: datetime, minutes: int) -> None:
    with connect(config) as client:
        lengths = r("window_lengths_ms", queries.window_lengths_ms, client)
    resolution = queries.overview_resolution_s(lengths, minutes)
    queries.concurrently(config, {
        "rates": lambda c: r("app_rates", queries.app_rates, c, since, until, resolution, min(lengths)),
        "dropped": lambda c: r("dropped_stragglers", queries.dropped_stragglers, c, since, until, resolution),
        "dead": lambda c: r("dead_letter_rate", queries.dead_letter_rate, c, since, until, resolution),
        "duplicates": lambda c: r("duplicates_per_app", queries.duplicates_per_app, c, since, until),
        "marks": lambda c: r("watermarks", pipeline.watermarks, c),
        "states": lambda c: r("alert_states", queries.alert_states, c),
        # consumer_lag's store half; its Kafka half (end offsets from the broker) is not part of this bench.
        "lag": lambda c: r("processed_offsets", pipeline.processed_offsets, c, config.kafka.events_topic)})


def explorer(kind: str, resolution_s: int | None = None) -> Callable[[Config, Render, datetime, datetime, int], None]:
    """The explorer page for the busiest series of the window kind's family (logs for sliding windows)."""
    def render(config: Config, r: Render, since: datetime, until: datetime, minutes: int) -> None:
        with connect(config) as client:
            catalog = r("series_catalog", queries.series_catalog, client)
        chosen = next(s for s in catalog.series if (s.kind == "log") == (kind == "sliding"))
        hopping = catalog.hopping.get(chosen, [])
        with connect(config) as client:
            if kind == "tumbling":
                r("series_buckets", queries.series_buckets, client, chosen, resolution_s, since, until,
                  catalog.lengths_ms)
            elif kind == "hopping":
                r("hopping_windows", queries.hopping_windows, client, chosen, *hopping[0], since, until)
            else:
                r("sliding_windows", queries.sliding_windows, client, chosen, since, until)
    return render


def logs(config: Config, r: Render, since: datetime, until: datetime, minutes: int) -> None:
    with connect(config) as client:
        lengths = r("window_lengths_ms", queries.window_lengths_ms, client)
    resolution = queries.overview_resolution_s(lengths, minutes)
    queries.concurrently(config, {
        "levels": lambda c: r("log_levels", queries.log_levels, c, since, until, resolution, min(lengths)),
        "peaks": lambda c: r("error_burst_peaks", queries.error_burst_peaks, c, since, until, resolution)})


def sessions(config: Config, r: Render, since: datetime, until: datetime, minutes: int) -> None:
    with connect(config) as client:
        lengths = r("window_lengths_ms", queries.window_lengths_ms, client)
    resolution = queries.overview_resolution_s(lengths, minutes)
    queries.concurrently(config, {
        "per_app": lambda c: r("sessions_per_app", queries.sessions_per_app, c, since, until, resolution),
        "shapes": lambda c: r("session_shapes", queries.session_shapes, c, since, until)})


def stragglers(config: Config, r: Render, since: datetime, until: datetime, minutes: int) -> None:
    with connect(config) as client:
        lengths = r("window_lengths_ms", queries.window_lengths_ms, client)
    resolution = queries.overview_resolution_s(lengths, minutes)
    queries.concurrently(config, {
        "dropped": lambda c: r("dropped_stragglers", queries.dropped_stragglers, c, since, until, resolution),
        "lateness": lambda c: r("straggler_lateness", queries.straggler_lateness, c, since, until),
        "worst": lambda c: r("straggler_windows", queries.straggler_windows, c, since, until),
        "clocks": lambda c: r("device_clock_offsets", queries.device_clock_offsets, c, since, until),
        "corrected": lambda c: r("corrections_published", queries.corrections_published, c, since, until,
                                 resolution)})


def alerts(config: Config, r: Render, since: datetime, until: datetime, minutes: int) -> None:
    queries.concurrently(config, {"states": lambda c: r("alert_states", queries.alert_states, c),
                                  "history": lambda c: r("alert_history", queries.alert_history, c, since, until)})


# Log search (issue 38) ---------------------------------------------------------------------------------------


COMPONENTS = ("auth", "cart", "checkout", "payment", "search", "inventory", "session", "cache", "db", "mailer")
# (level, logger, text): every base is written once per component, so patterns are distinct per component. Slots:
# {c} component, {n} small number, {ms} duration, {bytes} size, {uuid}, {hex} trace id, {ip}, {user}, {route},
# {status}, {order}, {attempt}.
LOG_BASES = (
    ("debug", 0, "{c} cache lookup key {hex} hit in {ms} us"),
    ("debug", 0, "{c} parsed request headers for {route} ({n} headers)"),
    ("debug", 0, "{c} sql query took {ms} ms rows={n}"),
    ("debug", 0, "{c} acquired pool connection {n} after {ms} ms"),
    ("debug", 1, "{c} job {uuid} picked from queue at depth {n}"),
    ("debug", 1, "{c} heartbeat sent seq={n}"),
    ("info", 0, "{c} request {route} completed with status {status} in {ms} ms"),
    ("info", 0, "{c} user {user} signed in from {ip}"),
    ("info", 0, "{c} request {route} served {bytes} bytes to {ip}"),
    ("info", 0, "{c} session {uuid} started for user {user}"),
    ("info", 0, "{c} order {order} created by user {user} with {n} items"),
    ("info", 0, "{c} request {route} accepted, trace {hex}"),
    ("info", 1, "{c} job {uuid} finished in {ms} ms"),
    ("info", 1, "{c} batch of {n} events flushed in {ms} ms"),
    ("info", 1, "{c} scheduled task {n} ran, next run in {n} s"),
    ("info", 1, "{c} email queued for user {user} message {uuid}"),
    ("warning", 0, "{c} slow request {route} took {ms} ms (threshold 500 ms)"),
    ("warning", 0, "{c} retrying upstream call to {ip} attempt {attempt} of 5"),
    ("warning", 0, "{c} rate limit close for user {user}: {n} requests in 60 s"),
    ("warning", 0, "{c} response for {route} truncated at {bytes} bytes"),
    ("warning", 1, "{c} queue depth {n} above soft limit"),
    ("warning", 1, "{c} job {uuid} took {ms} ms, longer than expected"),
    ("error", 0, "{c} request {route} failed with status {status}: upstream timeout after {ms} ms"),
    ("error", 0, "{c} connection reset by peer {ip} while writing response"),
    ("error", 0, "{c} payment for order {order} declined: card expired"),
    ("error", 0, "{c} invalid token for user {user}: signature mismatch"),
    ("error", 1, "{c} job {uuid} failed: timeout after {ms} ms, attempt {attempt}"),
    ("error", 1, "{c} could not deliver message {uuid}: connection refused by {ip}"),
    ("critical", 0, "{c} database pool exhausted: {n} waiting, {n} in use"),
    ("critical", 1, "{c} worker {n} crashed: out of memory after {bytes} bytes"),
    ("critical", 1, "{c} disk usage at {n} percent on volume data-{n}"),
)
# Rare lines, as a share of all lines (spread over the components): the words a search looks for after an incident.
LOG_RARE = (
    ("warning", 0, "{c} certificate for api.example.com expires in {n} days", 1e-4),
    ("error", 1, "{c} deadlock detected on table orders, transaction {uuid} rolled back", 1e-5),
    ("critical", 1, "{c} segfault in native module at address 0x{hex}", 2e-6),
)
ROUTES = ("/", "/login", "/logout", "/cart", "/cart/items", "/checkout", "/checkout/pay", "/search", "/products",
          "/products/item", "/orders", "/orders/item", "/account", "/account/settings", "/api/v1/events",
          "/api/v1/metrics", "/health", "/static/app.js", "/images/item", "/recommendations")
REGIONS = ("eu-west", "us-east", "us-west", "ap-south")
STATUS_BY_LEVEL = {"debug": ("200", "200", "200", "304"), "info": ("200", "200", "201", "204"),
                   "warning": ("200", "404", "429", "408"), "error": ("500", "502", "503", "504"),
                   "critical": ("500", "503", "503", "503")}
_SLOT = re.compile(r"\{(\w+)\}")
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


@dataclass(frozen=True)
class LogLoad:
    """``lines`` log lines of the bench's 5 apps spread evenly over the ``hours`` before the bench's end."""

    lines: int
    hours: float = 24.0
    block: int = 1_000_000                 # rows per insert: one Arrow block, as a large micro-batch writes
    apps: int = 5
    users_per_app: int = 1000
    devices_per_app: int = 20
    anonymous: float = 0.15                # lines without a user
    live_minutes: float = 60.0             # the newest lines, written one micro-batch per insert
    trigger_s: int = 5                     # the stream job's micro-batch interval

    @property
    def per_hour(self) -> float:
        return self.lines / self.hours


@dataclass(frozen=True)
class _Template:
    level: str
    logger: int
    parts: tuple[str, ...]                 # literal text around the slots: len(parts) == len(slots) + 1
    slots: tuple[str, ...]


def _templates() -> tuple[list[_Template], np.ndarray]:
    """Every template and its share of the lines: by LEVEL_P per level, Zipf-like within a level, rare ones fixed."""
    rng = np.random.default_rng(38)
    templates: list[_Template] = []
    shares: list[float] = []
    comp_w = 1 / np.arange(1, len(COMPONENTS) + 1)
    comp_w /= comp_w.sum()
    rare_by_level = {lvl: sum(p for lv, _, _, p in LOG_RARE if lv == lvl) for lvl in LEVELS}
    for li, level in enumerate(LEVELS):
        bases = [(lg, text) for lv, lg, text in LOG_BASES if lv == level]
        w = 1 / np.arange(1, len(bases) + 1) ** 0.8
        w = rng.permutation(w / w.sum()) * (LEVEL_P[li] - rare_by_level[level])
        for (logger, text), wb in zip(bases, w, strict=True):
            for c, wc in zip(COMPONENTS, comp_w, strict=True):
                templates.append(_template(level, logger, text, c))
                shares.append(wb * wc)
        for lv, logger, text, p in LOG_RARE:
            if lv == level:
                for c in COMPONENTS:
                    templates.append(_template(level, logger, text, c))
                    shares.append(p / len(COMPONENTS))
    return templates, np.array(shares) / sum(shares)


def _template(level: str, logger: int, text: str, component: str) -> _Template:
    pieces = _SLOT.split(text.replace("{c}", component))
    return _Template(level, logger, tuple(pieces[0::2]), tuple(pieces[1::2]))


def _hex_strings(rng: np.random.Generator, n: int, groups: tuple[int, ...],
                 time_ms: np.ndarray | None = None) -> pa.Array:
    """``n`` random lowercase hex strings in dash-separated groups (a UUID: 8-4-4-4-12), built as one buffer;
    with ``time_ms``, a UUIDv7 (the SDK's ids): 48 bits of the time, then the version 7, then random digits."""
    digits = sum(groups)
    width = digits + len(groups) - 1
    codes = rng.integers(0, 16, (n, digits), dtype=np.uint8)
    if time_ms is not None:
        codes[:, :12] = (time_ms[:, None] >> np.arange(44, -1, -4)) & 0xF
        codes[:, 12] = 7
    nibbles = _HEX[codes]
    out = np.full((n, width), ord("-"), np.uint8)
    at = 0
    for i, g in enumerate(groups):
        out[:, at + i:at + i + g] = nibbles[:, at:at + g]
        at += g
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(out.tobytes())])


def _digits(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values.astype(np.int64)), pa.string())


def _log_block(load: LogLoad, start_ms: int, end_ms: int, n: int, first_offset: int, rng: np.random.Generator,
               templates: list[_Template], shares: np.ndarray) -> pa.Table:
    """``n`` lines with corrected event times in [start_ms, end_ms), in time order (as the job appends them)."""
    t = np.sort(rng.integers(start_ms, end_ms, n))
    app = rng.integers(0, load.apps, n)
    device = app * load.devices_per_app + rng.integers(0, load.devices_per_app, n)
    user = app * load.users_per_app + rng.integers(0, load.users_per_app, n)
    anonymous = rng.random(n) < load.anonymous
    which = rng.choice(len(templates), n, p=shares)
    level_of = np.array([LEVELS.index(tp.level) for tp in templates])
    logger_of = np.array([tp.logger for tp in templates])
    level = level_of[which]
    route = rng.integers(0, len(ROUTES), n)
    status_pick = rng.integers(0, 4, n)
    status_table = pa.array([s for lvl in LEVELS for s in STATUS_BY_LEVEL[lvl]])
    status = pc.take(status_table, pa.array(level * 4 + status_pick))
    routes, apps = pa.array(ROUTES), pa.array([f"app-{a}" for a in range(load.apps)])
    devices = pa.array([f"app-{a}-device-{d}" for a in range(load.apps) for d in range(load.devices_per_app)])
    users = pa.array([f"app-{a}-user-{u}" for a in range(load.apps) for u in range(load.users_per_app)] + [""])
    user_col = pc.take(users, pa.array(np.where(anonymous, len(users) - 1, user)))
    route_col = pc.take(routes, pa.array(route))

    # Messages, one template group at a time (each slot a vectorised column), put back into time order.
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(len(templates) + 1))
    pieces = []
    for k, tp in enumerate(templates):
        rows = order[bounds[k]:bounds[k + 1]]
        if not len(rows):
            continue
        m = len(rows)
        args: list[Any] = [tp.parts[0]]
        for slot, text in zip(tp.slots, tp.parts[1:], strict=True):
            args += [_slot(slot, rows, m, rng, user_col, route_col, status), text]
        pieces.append(pc.binary_join_element_wise(*args, "") if tp.slots else pa.array([tp.parts[0]] * m))
    message = pc.take(pa.concat_arrays(pieces), pa.array(np.argsort(order)))

    offset = rng.normal(0, 5_000, load.apps * load.devices_per_app).astype(np.int64)   # device clock offsets
    region = rng.integers(0, len(REGIONS), n)
    keys = pa.array(["region", "route", "status"] * n)
    items = pc.take(pa.concat_arrays([pc.take(pa.array(REGIONS), pa.array(region)), route_col, status]),
                    pa.array(np.stack([np.arange(n), n + np.arange(n), 2 * n + np.arange(n)], axis=1).ravel()))
    tags = pa.MapArray.from_arrays(pa.array(np.arange(0, 3 * n + 1, 3, dtype=np.int32)), keys, items)
    return pa.table({
        "corrected_event_time": _ms(t), "event_time": _ms(t - offset[device]),
        "received_time": _ms(t + rng.exponential(300, n).astype(np.int64)),
        "app": pc.take(apps, pa.array(app)), "level": pc.take(pa.array(LEVELS), pa.array(level)),
        "name": pc.take(pa.array(LOGS), pa.array(logger_of[which])), "device": pc.take(devices, pa.array(device)),
        "user": user_col, "message": message, "tags": tags, "event_id": _hex_strings(rng, n, (8, 4, 4, 4, 12), t),
        "source_partition": (device % 4).astype(np.int32),
        "source_offset": np.arange(first_offset, first_offset + n, dtype=np.int64)})


def _slot(slot: str, rows: np.ndarray, m: int, rng: np.random.Generator, user_col: pa.Array, route_col: pa.Array,
          status: pa.Array) -> pa.Array:
    idx = pa.array(rows)
    if slot == "user":
        named = pc.take(user_col, idx)
        return pc.if_else(pc.equal(named, ""), "anonymous", named)
    if slot == "route":
        return pc.take(route_col, idx)
    if slot == "status":
        return pc.take(status, idx)
    if slot == "uuid":
        return _hex_strings(rng, m, (8, 4, 4, 4, 12))
    if slot == "hex":
        return _hex_strings(rng, m, (16,))
    if slot == "ip":
        octets = [_digits(rng.integers(1, 255, m)) for _ in range(4)]
        return pc.binary_join_element_wise(*octets, ".")
    if slot == "order":
        return pc.binary_join_element_wise("ord-", _digits(rng.integers(10_000_000, 99_999_999, m)), "")
    values = {"n": lambda: rng.integers(0, 1000, m), "ms": lambda: rng.lognormal(3, 1.2, m),
              "bytes": lambda: rng.lognormal(8, 2, m), "attempt": lambda: rng.integers(1, 6, m)}[slot]()
    return _digits(values)


@dataclass
class LogFill:
    """How the lines went in: the history in large blocks, the newest minutes in the job's micro-batches."""

    bulk_lines: int = 0
    generate_s: float = 0.0
    bulk_insert_s: float = 0.0
    live_lines: int = 0
    live_inserts: int = 0
    live_insert_s: float = 0.0


def populate_logs(config: Config, load: LogLoad, until: datetime, database: str = "") -> LogFill:
    """Insert the load's lines into ``logs``, in time order: the history in blocks of ``load.block`` lines (what
    background merges leave), the last ``load.live_minutes`` one micro-batch (``load.trigger_s``) per insert, as
    the stream job writes them, so the newest lines sit in the small parts a running system has not merged yet."""
    end_ms = int(until.timestamp() * 1000)
    t0_ms = end_ms - int(load.hours * 3_600_000)
    live_ms = min(end_ms - t0_ms, load.live_minutes * 60_000)
    live_lines = round(load.lines * live_ms / (end_ms - t0_ms))
    bulk_lines = load.lines - live_lines
    rng = np.random.default_rng(38)
    templates, shares = _templates()
    blocks = -(-bulk_lines // load.block)
    fill = LogFill(bulk_lines=bulk_lines, live_lines=live_lines)
    with connect(config, database=database) as client:
        for b in range(blocks):
            n = min(load.block, bulk_lines - b * load.block)
            start = t0_ms + (end_ms - live_ms - t0_ms) * b // blocks
            stop = t0_ms + (end_ms - live_ms - t0_ms) * (b + 1) // blocks
            t = time.perf_counter()
            data = _log_block(load, start, stop, n, b * load.block, rng, templates, shares)
            fill.generate_s += time.perf_counter() - t
            t = time.perf_counter()
            client.insert_arrow("logs", data)
            fill.bulk_insert_s += time.perf_counter() - t
        if live_lines:
            t = time.perf_counter()
            data = _log_block(load, end_ms - live_ms, end_ms, live_lines, bulk_lines, rng, templates, shares)
            fill.generate_s += time.perf_counter() - t
            times = data.column("corrected_event_time").cast(pa.int64()).to_numpy()
            cuts = np.searchsorted(times, np.arange(end_ms - live_ms, end_ms + 1, load.trigger_s * 1000))
            t = time.perf_counter()
            for a, b in itertools.pairwise(cuts):
                if b > a:
                    client.insert_arrow("logs", data.slice(a, b - a))
                    fill.live_inserts += 1
            fill.live_insert_s = time.perf_counter() - t
    return fill


@dataclass(frozen=True)
class LogCase:
    """One search of the Logs page, with the page's sizes (``[dashboard]``): the newest ``log_lines_per_page``
    lines, or the top 20 message patterns of at most ``log_pattern_lines`` lines. ``run`` is that one call;
    ``render`` what the page waits for when it shows the search (dashboard/views/logs.py): the pickers' app and
    logger names of the range, then the lines beside the count of every matching line, or the patterns."""

    label: str
    minutes: int
    text: str = ""
    apps: tuple[str, ...] = ()
    levels: tuple[str, ...] = ()
    patterns: bool = False

    def query(self, until: datetime) -> LogQuery:
        return LogQuery(since=until - timedelta(minutes=self.minutes), until=until, apps=self.apps,
                        levels=self.levels, text=self.text)

    def run(self, client: Client, config: Config, until: datetime) -> pd.DataFrame:
        if self.patterns:
            return message_patterns(client, self.query(until), 20, config.dashboard.log_pattern_lines)
        return search_lines(client, self.query(until), config.dashboard.log_lines_per_page)

    def render(self, config: Config, until: datetime) -> int:
        """The page's calls for this search; returns how many lines match (patterns: how many were masked)."""
        query = self.query(until)
        with connect(config, role="reader") as client:
            for column in ("app", "name"):
                distinct_values(client, query.since, query.until, column)
        if self.patterns:
            with connect(config, role="reader") as client:
                return int(self.run(client, config, until).attrs.get("lines", 0))
        # The page counts up to its cap ("more than N"), as dashboard/views/logs.py does.
        cap = max(config.dashboard.log_count_max, config.dashboard.log_lines_max)
        return queries.concurrently(config, {"lines": lambda c: self.run(c, config, until),
                                             "total": lambda c: count_lines(c, query, cap=cap)})["total"]


LOG_CASES = (
    LogCase("(a) common word, last hour", 60, text="request"),
    LogCase("(a) rare word, last hour", 60, text="deadlock"),
    LogCase("(b) phrase, last hour", 60, text='"connection reset by peer"'),
    LogCase("(c) word + app + level, last hour", 60, text="timeout", apps=("app-3",), levels=("error",)),
    LogCase("(d) patterns, last 15 min", 15, patterns=True),
    # Beyond the four: what a wider range costs.
    LogCase("(e) common word, last 24 h", 24 * 60, text="request"),
    LogCase("(f) patterns, last hour", 60, patterns=True),
    LogCase("(g) no filter, last 24 h", 24 * 60),
)


class _Recorder:
    """A client that remembers the statements sent through it (to measure what a call reads, afterwards)."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self.sent: list[tuple[str, dict[str, Any] | None]] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._client, name)
        if not name.startswith(("query", "raw_query")):
            return target

        def record(query: str, parameters: dict[str, Any] | None = None, *args: Any, **kwargs: Any) -> Any:
            self.sent.append((query, parameters))
            return target(query, parameters, *args, **kwargs)
        return record


_COUNTERS = ("SelectedParts", "SelectedMarks", "SelectedRows", "ReadCompressedBytes")
_STEP = re.compile(r"^(Min-Max|Partition|PrimaryKey|Skip|Name: \S+|Granules: \S+)$")


def _counters(client: Client) -> dict[str, int]:
    """The store process's read counters: chDB answers X-ClickHouse-Summary's read_rows with the rows of the
    result and has no system.query_log, but its system.events counts every query's reads."""
    rows = client.query("SELECT event, value FROM system.events WHERE event IN {e:Array(String)}",
                        parameters={"e": list(_COUNTERS)}).result_rows
    return {name: int(value) for name, value in rows}


def _reads(client: Client, config: Config, case: LogCase, until: datetime) -> str:
    """What one call of ``case`` reads (the store's counters around it, nothing else running) and the granules each
    index keeps in its statements (EXPLAIN indexes = 1)."""
    recorder = _Recorder(client)
    before = _counters(client)
    case.run(recorder, config, until)    # type: ignore[arg-type]
    after = _counters(client)
    read = {k: after.get(k, 0) - before.get(k, 0) for k in _COUNTERS}
    plans = []
    for sql, params in recorder.sent:
        steps, label = [], ""
        for (line,) in client.query(f"EXPLAIN indexes = 1 {sql}", parameters=params).result_rows:
            m = _STEP.match(line.lstrip(" │├└─"))
            if not m:
                continue
            if m.group(1).startswith("Granules"):
                steps.append(f"{label} {m.group(1).split()[1]}")
            else:
                label = m.group(1).removeprefix("Name: ")
        plans.append(" ".join(steps))
    if len(plans) > 1:     # one statement per slice of the range: the granules each keeps after every index
        detail = f"{len(plans)} statements, granules kept " + ", ".join(p.split()[-1] if p else "-" for p in plans)
    else:
        detail = "granules " + " ".join(plans)
    return (f"{read['SelectedRows']:,} rows ({read['SelectedMarks']:,} granules, {read['SelectedParts']} parts), "
            f"{read['ReadCompressedBytes'] / 2**20:.1f} MiB compressed; {detail}")


def log_search(config: Config, until: datetime, repeat: int, title: str) -> None:
    """Each log case ``repeat`` times through the served store as the page's reader, alternately the one call (and
    an exact ``count_lines`` alone: "count") and the page's render (its count capped as the page caps it); p50/p95
    of each, and what one call reads."""
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"{title:<34} {'call p50':>8} {'p95':>6} {'count':>6} {'page p50':>8} {'p95':>6} {'max':>6} {'rows':>4} "
          f"{'match':>9}   what the call reads (load avg {load})")
    for case in LOG_CASES:
        calls: list[float] = []
        counts: list[float] = []
        renders: list[float] = []
        for _ in range(repeat):
            with connect(config, role="reader") as client:
                t = time.perf_counter()
                out = case.run(client, config, until)
                calls.append(time.perf_counter() - t)
                if not case.patterns:
                    t = time.perf_counter()
                    exact = count_lines(client, case.query(until))   # uncapped: what the page's cap saves
                    counts.append(time.perf_counter() - t)
            t = time.perf_counter()
            rendered = case.render(config, until)
            renders.append(time.perf_counter() - t)
            matched = rendered if case.patterns else exact
        with connect(config, role="reader") as client:
            reads = _reads(client, config, case, until)
        count = statistics.median(counts) if counts else float("nan")
        print(f"{case.label:<34} {_percentile(calls, 0.5):>8.3f} {_percentile(calls, 0.95):>6.3f} {count:>6.3f} "
              f"{_percentile(renders, 0.5):>8.3f} {_percentile(renders, 0.95):>6.3f} {max(renders):>6.3f} "
              f"{len(out):>4} {matched:>9,}   {reads}")


def log_storage(config: Config, database: str) -> str:
    """The logs table's rows, parts, bytes (columns compressed, skip indexes, all files on disk) and the bytes per
    line of its largest columns and of each skip index."""
    db = {"db": database}
    with connect(config) as client:
        rows, parts, comp, raw, skip, disk = client.query(
            "SELECT sum(rows), count(), sum(data_compressed_bytes), sum(data_uncompressed_bytes), "
            "sum(secondary_indices_compressed_bytes), sum(bytes_on_disk) FROM system.parts "
            "WHERE active AND database = {db:String} AND table = 'logs'", parameters=db).result_rows[0]
        cols = client.query(
            "SELECT column, sum(column_data_compressed_bytes) AS c FROM system.parts_columns WHERE active AND "
            "database = {db:String} AND table = 'logs' GROUP BY column ORDER BY c DESC", parameters=db).result_rows
        indexes = client.query(
            "SELECT name, data_compressed_bytes FROM system.data_skipping_indices WHERE database = {db:String} "
            "AND table = 'logs' ORDER BY data_compressed_bytes DESC", parameters=db).result_rows
    per_col = ", ".join(f"{name} {c / rows:.1f}" for name, c in cols[:6])
    per_idx = ", ".join(f"{name} {c / rows:.1f}" for name, c in indexes)
    return (f"{database}.logs: {rows:,} lines in {parts} parts; {disk / 2**20:,.0f} MiB on disk = "
            f"{disk / rows:.1f} B/line (columns {comp / rows:.1f} compressed, {raw / rows:.1f} uncompressed; skip "
            f"indexes {skip / rows:.1f}); B/line by column: {per_col}; by skip index: {per_idx}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20, help="renders per page")
    parser.add_argument("--tumbling", default="60", help="tumbling window lengths in s, e.g. 10,60")
    parser.add_argument("--versions", type=int, default=1, help="writes per window (early result + corrections)")
    parser.add_argument("--hours", type=int, default=24,
                        help="history stored (the pages still show the last 24 h): what unbounded queries pay for")
    parser.add_argument("--no-hopping", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temporary store (its path is printed)")
    parser.add_argument("--log-lines", type=int, default=0,
                        help="also fill the logs table with this many lines and time the Logs page's searches")
    parser.add_argument("--log-hours", type=float, default=LogLoad.hours, help="span the log lines cover")
    parser.add_argument("--log-live-minutes", type=float, default=LogLoad.live_minutes,
                        help="the newest minutes of lines written one 5 s micro-batch per insert (0: all in blocks)")
    parser.add_argument("--log-variants", default="",
                        help=f"also time copies of the logs table changed so: {', '.join(LOG_VARIANTS)} (comma list)")
    parser.add_argument("--logs-only", action="store_true", help="only the log search part (no window tables)")
    args = parser.parse_args()
    load = Load(tumbling_s=tuple(sorted(int(s) for s in args.tumbling.split(","))), versions=args.versions,
                hours=args.hours,
                hopping=None if args.no_hopping else Load.hopping)
    data = Path(tempfile.mkdtemp(prefix="eventide-bench-dash-"))
    try:
        config = load_config(environ={}, root=str(REPO), paths={"data_dir": str(data)},
                             store={"database": "bench", "port": free_port()})
        with served_store(config):
            apply_migrations(config)
            if not args.logs_only:
                run(config, load, data, args.repeat)
            if args.log_lines:
                run_logs(config, LogLoad(args.log_lines, args.log_hours, live_minutes=args.log_live_minutes),
                         args.repeat, [v for v in args.log_variants.split(",") if v])
        if args.keep:
            print(f"\nstore kept at {data} (serve it with EVENTIDE_PATHS__DATA_DIR={data} eventide store serve)")
    finally:
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(config: Config, load: Load, data: Path, repeat: int) -> None:
    """Fill the store, then render every page ``repeat`` times and print the timings."""
    t = time.perf_counter()
    until = datetime.now(UTC).replace(second=0, microsecond=0)
    written = populate(config, load, until)
    fill_s = time.perf_counter() - t
    with connect(config) as client:
        parts = dict(client.query("SELECT table, count() FROM system.parts WHERE active AND database = 'bench' "
                                  "GROUP BY table").result_rows)
        lengths = queries.window_lengths_ms(client)
    size = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
    print(f"load: {len(load.series)} series x {load.hours} h, tumbling {load.tumbling_s} s, hopping "
          f"{load.hopping}, {load.events_per_minute} events/min per series ({_events_total(load):,} events), "
          f"{load.versions} write(s) per window; filled in {fill_s:.0f} s, {size / 2**20:.0f} MiB on disk")
    for table, n in sorted(written.items()):
        print(f"  {table:<18} {n:>10,} rows  {parts.get(table, 0):>3} parts")
    minutes = DAY_MINUTES
    coarse = queries.resolutions_s(lengths)
    pages: list[tuple[str, Callable[[Config, Render, datetime, datetime, int], None]]] = [
        ("overview", overview),
        *[(f"explorer tumbling {res} s", explorer("tumbling", res)) for res in coarse],
        *([("explorer hopping", explorer("hopping"))] if load.hopping else []),
        ("explorer sliding (log series)", explorer("sliding")),
        ("logs", logs), ("sessions", sessions), ("stragglers", stragglers), ("alerts", alerts)]
    print(f"\nrange: last {minutes} min, page resolution {queries.overview_resolution_s(lengths, minutes)} s; "
          f"{repeat} renders per page (each: its store clients + queries, as the page does)")
    print(f"{'page':<32} {'p50 s':>7} {'p95 s':>7} {'max s':>7}   slowest calls (median ms) and rows")
    for name, render in pages:
        totals, runs = [], []
        for _ in range(repeat):
            r = Render()
            since, end = until - timedelta(minutes=minutes), until
            t = time.perf_counter()
            render(config, r, since, end, minutes)
            totals.append(time.perf_counter() - t)
            runs.append(r)
        calls = {c: statistics.median(run.seconds[c] for run in runs) for c in runs[0].seconds}
        top = sorted(calls.items(), key=lambda kv: -kv[1])[:4]
        detail = ", ".join(f"{c} {s * 1000:.0f} ({runs[0].rows[c]:,})" for c, s in top)
        print(f"{name:<32} {_percentile(totals, 0.5):>7.3f} {_percentile(totals, 0.95):>7.3f} "
              f"{max(totals):>7.3f}   {detail}")


def run_logs(config: Config, load: LogLoad, repeat: int, variants: list[str]) -> None:
    """Fill ``logs`` with the load's lines, then time each log search ``repeat`` times: as written, and after the
    table is merged (one part per day, as background merges leave a day's partition). ``variants``: the same lines
    in a copy of the table changed as :data:`LOG_VARIANTS` says, merged, timed the same way."""
    until = datetime.now(UTC).replace(second=0, microsecond=0)
    fill = populate_logs(config, load, until)
    db = config.store.database
    print(f"\nlogs: {load.lines:,} lines over {load.hours:g} h ({load.per_hour:,.0f} per hour, "
          f"{load.per_hour / 4:,.0f} in the last 15 min), generated in {fill.generate_s:.1f} s; "
          f"{fill.bulk_lines:,} in blocks of {load.block:,}: inserted in {fill.bulk_insert_s:.1f} s "
          f"({fill.bulk_lines / max(fill.bulk_insert_s, 1e-9):,.0f} lines/s); the last {load.live_minutes:g} min's "
          f"{fill.live_lines:,} in {fill.live_inserts} micro-batches of {load.trigger_s} s: {fill.live_insert_s:.1f} s "
          f"({fill.live_insert_s / max(fill.live_inserts, 1) * 1000:.0f} ms per insert)")
    print(log_storage(config, db))
    log_search(config, until, repeat, "as written")
    print(f"\nOPTIMIZE TABLE logs FINAL: {_optimize(config, db):.0f} s")
    print(log_storage(config, db))
    log_search(config, until, repeat, "merged")
    if variants:
        for name in variants:
            other = f"{db}_{name}"
            t = time.perf_counter()
            with connect(config, database=None) as client:
                client.command(f"CREATE DATABASE {other}")
                client.command(f"CREATE TABLE {other}.stragglers AS {db}.stragglers")
                client.command(logs_variant_ddl(other, name))
                client.command(f"INSERT INTO {other}.logs SELECT * FROM {db}.logs")
            print(f"\nvariant {name} ({LOG_VARIANTS[name][0]}): copied in {time.perf_counter() - t:.0f} s")
            print(log_storage(config, other))
            print(f"OPTIMIZE TABLE {other}.logs FINAL: {_optimize(config, other):.0f} s")
            print(log_storage(config, other))
            variant_config = config.model_copy(update={"store": config.store.model_copy(update={"database": other})})
            log_search(variant_config, until, repeat, f"{name}, merged")


def _optimize(config: Config, database: str) -> float:
    t = time.perf_counter()
    with connect(config, database=database) as client:
        client.command("OPTIMIZE TABLE logs FINAL")
    return time.perf_counter() - t


def _hourly(ddl: str) -> str:
    key = "ORDER BY (app, level, corrected_event_time)"
    if key not in ddl:
        raise ValueError(f"sql/0013_logs.sql: no {key}")
    return ddl.replace(key, "ORDER BY (toStartOfHour(corrected_event_time), app, level, corrected_event_time)")


LOG_VARIANTS: dict[str, tuple[str, Callable[[str], str]]] = {
    # The hour first: a range without app or level reads whole hours' (app, level) runs, not every run's edges.
    "hourly": ("ORDER BY (toStartOfHour(corrected_event_time), app, level, corrected_event_time)", _hourly),
}
"""Variants of sql/0013_logs.sql timed by ``--log-variants``: (what changes, how the DDL changes)."""


def logs_variant_ddl(database: str, variant: str) -> str:
    """sql/0013_logs.sql's table in ``database``, changed as :data:`LOG_VARIANTS` says for ``variant``."""
    ddl = (REPO / "sql" / "0013_logs.sql").read_text()
    ddl = "\n".join(line.split("--", 1)[0].rstrip() for line in ddl.splitlines() if not line.startswith("--"))
    ddl = ddl.replace("CREATE TABLE IF NOT EXISTS logs", f"CREATE TABLE {database}.logs")
    return LOG_VARIANTS[variant][1](ddl).rstrip().rstrip(";")


if __name__ == "__main__":
    main()
