"""What the stream job and the alert evaluator leave in the store over a day (or more) of a 5-app deployment: 50
series (5 apps x 8 metric + 2 log names), tumbling windows with real KLL/HLL sketches, hopping windows, stragglers,
corrections, dead letters, sessions, sliding windows, device clocks, pipeline progress and alerts. The data
``bench.dashboard_pages`` renders the pages over.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from clickhouse_connect.driver.client import Client
from datasketches import hll_sketch, hll_union, kll_doubles_sketch

from analytics.vocabulary import ACCEPT_QUERY, KEYED_WINDOWS_QUERY
from bench.dashboard_store import LEVEL_P, LOGS, TS
from bench.dashboard_store import ms as _ms
from eventide.config import Config
from eventide.envelope import LEVELS
from store import pipeline
from store.client import connect
from store.range_query import SeriesKey

METRICS = ("latency_ms", "db_query_ms", "cart_value", "queue_depth", "payload_bytes", "cpu_pct", "mem_mb", "retries")


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


def events_total(load: Load) -> int:
    """Events the load stands for: every series at ``events_per_minute`` over ``hours``."""
    return len(load.series) * load.hours * 60 * load.events_per_minute


def _other_tables(load: Load, t0_ms: int, rng: np.random.Generator) -> Iterator[tuple[str, pa.Table]]:
    """Everything but windows, sized in proportion to the events of the load."""
    span_ms = load.hours * 3_600_000
    series = load.series
    events = events_total(load)

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

    # Sessions in progress: a sixth of the users, each with its last event in the last gap; as many rows retired
    # (sessions that closed or merged), which FINAL must read past.
    n = load.apps * load.users_per_app // 6
    last = t0_ms + span_ms - rng.integers(0, 300_000, 2 * n)
    duration = rng.exponential(600_000, 2 * n).astype(np.int64)
    count = 1 + rng.poisson(40, 2 * n)
    apps, users = rng.integers(0, load.apps, 2 * n), rng.integers(0, load.users_per_app, 2 * n)
    yield "open_sessions", pa.table({
        "gap_ms": np.full(2 * n, 300_000, np.uint64), "app": [f"app-{a}" for a in apps], "key_kind": ["user"] * (2 * n),
        "session_key": [f"app-{a}-user-{u}" for a, u in zip(apps, users, strict=True)],
        "session_start": _ms(last - duration), "session_end": _ms(last + 300_000), "last_event_time": _ms(last),
        "duration_ms": duration.astype(np.uint64), "event_count": count.astype(np.uint64),
        "metric_count": (count * 0.8).astype(np.uint64), "log_count": (count - (count * 0.8).astype(int)),
        **{f"level_{lvl}": np.zeros(2 * n, np.uint64) for lvl in LEVELS},
        "is_open": (np.arange(2 * n) < n).astype(np.uint8), "version": np.ones(2 * n, np.uint64),
        "written_at": _ms(last)})

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

