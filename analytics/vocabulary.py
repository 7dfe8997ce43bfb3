"""The job's shared vocabulary: query names, series, levels, quantiles and window specs, and the window rule
for times already in Arrow. Pure (numpy and pyarrow): every stage imports it, and no rule module pulls in
pyspark through it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from eventide.config import Config
from eventide.envelope import LEVELS

# The three streaming queries (analytics.job), which are also their checkpoint directories' names.
ACCEPT_QUERY = "accept"
WINDOWS_QUERY = "windows"
KEYED_WINDOWS_QUERY = "keyed_windows"

QUANTILES: dict[str, float] = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p999": 0.999}
SERIES = ("app", "kind", "name", "series_tags")
LEVEL_COLUMNS = LEVELS   # one count column per log level
LEVEL_FIELDS = tuple(f"level_{lvl}" for lvl in LEVEL_COLUMNS)
BUCKET_START = "bucket_start_ms"   # a window partial's bucket (analytics.windows.partials)


@dataclass(frozen=True)
class WindowSpec:
    """One epoch-aligned windowing: windows ``[kH, kH + L)``; tumbling when the hop H equals the length L."""

    kind: str
    length_s: int
    hop_s: int

    @property
    def length_ms(self) -> int:
        return self.length_s * 1000

    @property
    def hop_ms(self) -> int:
        return self.hop_s * 1000


def window_specs(config: Config) -> list[WindowSpec]:
    """Every tumbling and hopping windowing the job computes (all in one query, ``windows``)."""
    return ([WindowSpec("tumbling", n, n) for n in config.stream.tumbling_windows_s]
            + [WindowSpec("hopping", w.length_s, w.hop_s) for w in config.stream.hopping_windows])


ARROW_TIME = pa.timestamp("us", tz="UTC")
"""Spark's timestamps as they reach the driver in Arrow."""


def epoch_ms(times: pa.ChunkedArray | pa.Array, null_ms: int | None = None) -> np.ndarray:
    """Timestamps as integer ms since the epoch, floored as Spark's ``unix_millis`` (``null_ms`` for nulls)."""
    micros = times.cast(ARROW_TIME).cast(pa.int64())
    if null_ms is not None:
        micros = micros.fill_null(null_ms * 1000)
    return np.floor_divide(np.asarray(micros, dtype=np.int64), 1000)


def assign_windows(specs: list[WindowSpec], event_ms: np.ndarray) -> pa.Table:
    """:func:`window_assignments` for events already in the driver (epoch ms): one row per (event, window), in
    the same order, with ``event`` the index of the event in ``event_ms``.

    The late pass of the ``windows`` query needs the windows of a few late events per micro-batch; a Spark job for
    them costs more than the whole computation here. Spark floors ``t / H`` in double precision, numpy floors in
    integers: the same window for any epoch-ms time (tests/integration/test_window_assignment.py checks both agree).
    """
    t = np.asarray(event_ms, dtype=np.int64)
    windows = [(spec, k) for spec in specs for k in range(spec.length_s // spec.hop_s)]
    newest = {spec: np.floor_divide(t, spec.hop_ms) * spec.hop_ms for spec in specs}
    starts = (np.column_stack([newest[spec] - k * spec.hop_ms for spec, k in windows]).ravel()
              if len(t) and windows else np.empty(0, dtype=np.int64))
    lengths = np.tile(np.array([spec.length_ms for spec, _ in windows], dtype=np.int64), len(t))
    return pa.table({
        "event": np.repeat(np.arange(len(t), dtype=np.int64), len(windows)),
        "window_kind": pa.array(np.tile(np.array([spec.kind for spec, _ in windows], dtype=object), len(t)),
                                pa.string()),
        "window_length_ms": lengths,
        "window_hop_ms": np.tile(np.array([spec.hop_ms for spec, _ in windows], dtype=np.int64), len(t)),
        "window_start_ms": starts,
        "window_end_ms": starts + lengths,
    })
