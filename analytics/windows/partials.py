"""Each accept batch's events aggregated once per (series, grain bucket): what the ``windows`` query merges.

Every tumbling and hopping window starts and ends on a multiple of one grain G, the greatest common divisor of the
tumbling lengths and the hops (a hop divides its window's length). So all events of one series in one bucket
``[kG, kG + G)`` belong to exactly the same windows, and one **partial** per (series, bucket) can stand for them:
counts, sum, min, max, level counts, a KLL sketch of the values and HLL sketches of the users and devices, plus
the bucket's latest ``corrected_event_time``. ``accept``'s tasks compute each partition's partials where its
events already are (Arrow, numpy, DataSketches: the same sketch formats Spark writes), and publish them beside the
partition's events file; the ``windows`` query expands each partial, not each event, into its windows and merges
them (``windows.aggregate``). A batch of 500,000 events has a few thousand partials.

Why the results are the ones the events would give:

- windows: a partial's windows are its bucket's, which are each of its events' windows;
- the watermark: Spark takes the maximum of ``corrected_event_time`` over a batch's rows; each partial carries
  its events' maximum, so the batch's maximum is the same;
- late contributions: Spark drops a row whose window the watermark has closed; every event of a partial has the
  same windows, so dropping the partial's contribution to a window drops exactly its events' contributions
  (``analytics.windows.stragglers`` still names them, from the events file);
- merging: counts and level counts add, sums add (in another order: last-bit differences), min and max take
  their extremes, HLL sketches union exactly (the same registers), KLL sketches merge within their rank error
  (as they did when Spark merged its tasks' partial buffers).
"""

from __future__ import annotations

import math
from functools import reduce

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasketches import hll_sketch, kll_doubles_sketch, tgt_hll_type

from analytics.vocabulary import ARROW_TIME, BUCKET_START, LEVEL_COLUMNS, LEVEL_FIELDS, SERIES, WindowSpec, window_specs
from eventide.config import Config

SCHEMA = pa.schema([
    (BUCKET_START, pa.int64()), *[(c, pa.string()) for c in SERIES], ("corrected_event_time", ARROW_TIME),
    ("event_count", pa.int64()), ("value_count", pa.int64()), ("sum", pa.float64()), ("min", pa.float64()),
    ("max", pa.float64()), ("value_sketch", pa.binary()), ("users_sketch", pa.binary()),
    ("devices_sketch", pa.binary()), *[(f, pa.int64()) for f in LEVEL_FIELDS],
])
"""A partial's columns, as ``accept``'s tasks stage them (``accepted_log.stage_file``) and the ``windows`` query
reads them."""

""":data:`SCHEMA` as Spark's types, for the ``windows`` query's file source."""


def grain_ms(specs: list[WindowSpec]) -> int:
    """The longest bucket every window bound is a multiple of (1 s when there are no windows)."""
    return reduce(math.gcd, [s for spec in specs for s in (spec.length_ms, spec.hop_ms)], 0) or 1000


def partials(events: pa.Table, config: Config) -> pa.Table:
    """The partials (:data:`SCHEMA`) of accepted ``events`` (their series, time, value, user, device and level)."""
    n = events.num_rows
    if not n:
        return SCHEMA.empty_table()
    grain = grain_ms(window_specs(config))
    micros = np.asarray(events["corrected_event_time"].cast(ARROW_TIME).cast(pa.int64()), dtype=np.int64)
    bucket = np.floor_divide(np.floor_divide(micros, 1000), grain) * grain   # floored ms, as windows.epoch_ms
    group = _group_numbers([_codes(events[c]) for c in SERIES] + [(bucket - bucket.min()) // grain])
    order = np.argsort(group, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(group[order]) != 0])
    first = order[starts]

    values = events["metric_value"].to_numpy(zero_copy_only=False).astype(np.float64)[order]
    has_value = ~np.isnan(values)
    value_count = np.add.reduceat(has_value.astype(np.int64), starts)
    users = events["user"].take(order).to_pylist()
    devices = events["device"].take(order).to_pylist()
    ends = np.r_[starts[1:], n]
    k, lg_k = config.stream.kll_k, config.stream.hll_lg_k
    value_sketches, user_sketches, device_sketches = [], [], []
    for start, end, counted in zip(starts.tolist(), ends.tolist(), value_count.tolist(), strict=True):
        if counted:
            kll = kll_doubles_sketch(k)
            kll.update(values[start:end][has_value[start:end]])
            value_sketches.append(kll.serialize())
        else:
            value_sketches.append(None)
        user_sketches.append(_hll(users[start:end], lg_k))
        device_sketches.append(_hll(devices[start:end], lg_k))

    def extreme(ufunc: np.ufunc, missing: float) -> pa.Array:
        found = ufunc.reduceat(np.where(has_value, values, missing), starts)
        return pa.array(found, pa.float64(), mask=value_count == 0)

    return pa.table({
        BUCKET_START: pa.array(bucket[first], pa.int64()),
        **{c: events[c].take(first) for c in SERIES},
        "corrected_event_time": pa.array(np.maximum.reduceat(micros[order], starts), pa.int64()).cast(ARROW_TIME),
        "event_count": pa.array(ends - starts, pa.int64()),
        "value_count": pa.array(value_count, pa.int64()),
        "sum": pa.array(np.add.reduceat(np.where(has_value, values, 0.0), starts), pa.float64()),
        "min": extreme(np.minimum, np.inf),
        "max": extreme(np.maximum, -np.inf),
        "value_sketch": pa.array(value_sketches, pa.binary()),
        "users_sketch": pa.array(user_sketches, pa.binary()),
        "devices_sketch": pa.array(device_sketches, pa.binary()),
        **{field: pa.array(np.add.reduceat(
            pc.fill_null(pc.equal(events["level"], level), False).to_numpy(zero_copy_only=False)[order]
            .astype(np.int64), starts), pa.int64()) for level, field in zip(LEVEL_COLUMNS, LEVEL_FIELDS, strict=True)},
    }, schema=SCHEMA)


def _hll(items: list[str | None], lg_k: int) -> bytes:
    """An HLL sketch of the non-null strings, as Spark's ``hll_sketch_agg`` makes it (UTF-8 bytes hashed)."""
    sketch = hll_sketch(lg_k, tgt_hll_type.HLL_8)
    for item in items:
        if item is not None:
            sketch.update(item)
    return sketch.serialize_compact()


def _codes(column: pa.ChunkedArray) -> np.ndarray:
    """An integer per row, equal for equal values (nulls: -1)."""
    encoded = column.combine_chunks().dictionary_encode()
    return np.asarray(encoded.indices.fill_null(-1), dtype=np.int64)


def _group_numbers(codes: list[np.ndarray]) -> np.ndarray:
    """A number per row, equal for rows whose codes are all equal (mixed radix; renumbered densely before it could
    overflow)."""
    group, bound = np.zeros(len(codes[0]), dtype=np.int64), 1
    for column in codes:
        column = column - column.min()
        size = int(column.max()) + 1
        if bound * size >= 2**62:
            group = np.unique(group, return_inverse=True)[1].astype(np.int64)
            bound = int(group.max()) + 1
        group, bound = group * size + column, bound * size
    return group
