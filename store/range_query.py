"""Answers for one series over any time range and resolution, from the stored tumbling windows.

The one query module the dashboard and alerting share. Counts, sums, min, max and log-level counts combine
exactly (sum of sums, min of mins, …; ``mean = sum / value_count``). Quantiles come from merging the windows' KLL
sketches and distinct users/devices from a union of their HLL sketches (``datasketches``): averaging per-window
percentiles or adding per-window distinct counts is wrong whenever windows differ in volume or share users.

Only tumbling windows are read. Each event lies in exactly one tumbling window of a given length, so merging the
windows of one length never counts an event twice (hopping windows overlap, so they cannot be merged this way).

A range ``[start, end)`` is answered from the windows lying entirely inside it: it is snapped inwards to the grid
of the source windows, and :class:`RangeStats` ``start``/``end`` report the span actually covered. Choose ranges on
that grid (e.g. whole minutes for 60 s windows) to lose nothing at the edges.

Every function takes an open client (``store.client.connect``) and runs one SQL query.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from clickhouse_connect.driver.client import Client
from datasketches import hll_sketch, hll_union, kll_doubles_sketch, tgt_hll_type

from eventide.envelope import LEVELS  # counted per window: the level_* columns of window_aggregates

DEFAULT_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99, 0.999)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
# Without these the driver decodes the sketch String columns as UTF-8 text, which corrupts the bytes.
SKETCH_FORMATS = {"value_sketch": "bytes", "users_sketch": "bytes", "devices_sketch": "bytes"}


class SeriesKey(NamedTuple):
    """One series: (app, kind, name) and its configured tags as ``"k=v,k=v"`` (sorted), ``""`` when none. A tuple:
    the alert evaluator keys tens of thousands of them a pass."""

    app: str
    kind: str
    name: str
    series_tags: str = ""

    @property
    def label(self) -> str:
        tags = f" {{{self.series_tags}}}" if self.series_tags else ""
        return f"{self.app} · {self.kind} · {self.name}{tags}"


@dataclass(frozen=True)
class RangeStats:
    """Everything known about one series over ``[start, end)``, merged from ``windows`` stored windows.

    ``start``/``end`` is the span covered after snapping to the source windows (see the module docstring).
    ``quantiles`` maps each requested rank to the value from the merged KLL sketch (``None`` without values);
    ``distinct_users``/``distinct_devices`` are the rounded estimates of the HLL union, as Spark rounds them.
    ``final`` is True when the stream's watermark has passed ``end``: every window that can contribute is final,
    so no later write changes this answer. It is inferred from the stored windows (a final window ending at or
    after ``end``), so a range whose last windows have no events yet may read False although it is final.
    """

    start: datetime
    end: datetime
    source_length_s: float | None
    """Length of the tumbling windows merged; ``None`` when none was found (nothing stored in the range)."""
    windows: int
    count: int
    value_count: int
    sum: float
    min: float | None
    max: float | None
    quantiles: dict[float, float | None]
    distinct_users: int
    distinct_devices: int
    levels: dict[str, int]
    final: bool
    value_sketch: kll_doubles_sketch | None = field(default=None, repr=False, compare=False)
    users_sketch: hll_sketch | None = field(default=None, repr=False, compare=False)
    devices_sketch: hll_sketch | None = field(default=None, repr=False, compare=False)

    @property
    def duration_s(self) -> float:
        return (self.end - self.start) / timedelta(seconds=1)

    @property
    def rate(self) -> float:
        """Events per second of the covered span (0 for an empty span)."""
        return self.count / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def mean(self) -> float | None:
        return self.sum / self.value_count if self.value_count else None

    @property
    def quantile_rank_error(self) -> float | None:
        """The merged KLL sketch's normalized rank error (99% confidence): a returned pXX has a true rank within
        XX/100 ± this. ``None`` without values."""
        return self.value_sketch.normalized_rank_error(False) if self.value_sketch is not None else None

    def rank(self, value: float) -> float | None:
        """Estimated fraction of values ``<= value`` (e.g. the share of requests within an SLO)."""
        return self.value_sketch.get_rank(value, inclusive=True) if self.value_sketch is not None else None

    def distinct_users_bounds(self, num_std_devs: int = 2) -> tuple[float, float]:
        """(lower, upper) bound of the distinct users at 1, 2 or 3 standard deviations."""
        return _hll_bounds(self.users_sketch, num_std_devs)

    def distinct_devices_bounds(self, num_std_devs: int = 2) -> tuple[float, float]:
        """(lower, upper) bound of the distinct devices at 1, 2 or 3 standard deviations."""
        return _hll_bounds(self.devices_sketch, num_std_devs)


# Pure sketch helpers (alerting reuses them on sketch bytes it already has) ------------------------------------

def merge_kll(blobs: Iterable[bytes | None]) -> kll_doubles_sketch | None:
    """Merge serialized KLL doubles sketches into one; ``None`` when none holds a value.

    Empty bytes (``''``/``b''``/``None``) mean "no values" (how windows without metric values are stored) and are
    skipped. Read quantiles from the result with ``get_quantile(rank, inclusive=True)``: Spark uses the inclusive
    criterion, so that is what agrees with the stored ``p50…p999``. KLL merging is randomized, so two merges of the
    same sketches can differ slightly, always within the rank error.
    """
    merged: kll_doubles_sketch | None = None
    for blob in blobs:
        if not blob:
            continue
        sketch = kll_doubles_sketch.deserialize(bytes(blob))
        if merged is None:
            merged = sketch
        else:
            merged.merge(sketch)
    return None if merged is None or merged.is_empty() else merged


def merge_hll(blobs: Iterable[bytes | None], lg_k: int | None = None,
              target: tgt_hll_type = tgt_hll_type.HLL_4) -> hll_sketch | None:
    """Union serialized HLL sketches (DataSketches format, as Spark's ``hll_sketch_agg`` writes them).

    ``lg_k`` is the union's maximum lg_k (e.g. ``config.stream.hll_lg_k``); ``None`` takes the largest lg_k among
    the inputs, so the union is exactly as precise as its inputs. Empty bytes are skipped; ``None`` when nothing is
    left. Spark's ``hll_sketch_estimate`` is :func:`hll_estimate` of the result. ``target``: the result's type
    (``HLL_8`` is what Spark's ``hll_union_agg`` stores; the estimate is the same).
    """
    sketches = [hll_sketch.deserialize(bytes(blob)) for blob in blobs if blob]
    if not sketches:
        return None
    union = hll_union(lg_k if lg_k is not None else max(s.lg_config_k for s in sketches))
    for sketch in sketches:
        union.update(sketch)
    return union.get_result(target)


def hll_estimate(sketch: hll_sketch | None) -> int:
    """The distinct count Spark's ``hll_sketch_estimate`` reports: the estimate rounded half up (Java
    ``Math.round``); 0 for no sketch."""
    return math.floor(sketch.get_estimate() + 0.5) if sketch is not None else 0


def _hll_bounds(sketch: hll_sketch | None, num_std_devs: int) -> tuple[float, float]:
    if sketch is None:
        return 0.0, 0.0
    return sketch.get_lower_bound(num_std_devs), sketch.get_upper_bound(num_std_devs)


# Queries -------------------------------------------------------------------------------------------------------

def range_summary(
    client: Client,
    series: SeriesKey,
    start: datetime,
    end: datetime,
    *,
    quantiles: Sequence[float] = DEFAULT_QUANTILES,
    source_length_s: float | None = None,
    hll_lg_k: int | None = None,
) -> RangeStats:
    """One :class:`RangeStats` for the whole range ``[start, end)`` (naive datetimes are UTC).

    The source windows are the largest stored tumbling length dividing both range ends (then nothing is lost to
    snapping), else the smallest stored length (the least is lost); ``source_length_s`` overrides the choice.
    An empty range, or one without stored windows, gives count 0 and ``None`` quantiles.
    """
    start_ms, end_ms = _epoch_ms(start), _epoch_ms(end)
    _check_quantiles(quantiles)
    if end_ms <= start_ms:
        return _combine([], start_ms, max(start_ms, end_ms), None, quantiles, hll_lg_k, horizon_ms=None)
    length_ms, rows = _fetch(client, series, start_ms, end_ms, math.gcd(start_ms, end_ms), source_length_s)
    lo, hi = _snap(start_ms, end_ms, length_ms)
    return _combine(rows, lo, hi, length_ms, quantiles, hll_lg_k, _final_horizon(rows))


def range_buckets(
    client: Client,
    series: SeriesKey,
    start: datetime,
    end: datetime,
    resolution_s: float,
    *,
    quantiles: Sequence[float] = DEFAULT_QUANTILES,
    source_length_s: float | None = None,
    hll_lg_k: int | None = None,
    devices: bool = True,
) -> list[RangeStats]:
    """One :class:`RangeStats` per bucket ``[k·R, (k+1)·R)`` (R = ``resolution_s``, aligned to the epoch) that
    overlaps ``[start, end)``, oldest first, including buckets without windows (count 0).

    The source windows are the largest stored tumbling length dividing R, so every bucket is an exact union of
    windows; the first and last bucket are clipped to the (snapped) range and report the span they cover.
    Raises ``ValueError`` when the only stored lengths do not divide R (buckets would cut windows in two).
    ``devices=False`` neither fetches nor merges the devices sketches (a third of the sketch work per bucket):
    ``distinct_devices`` then reads 0 and ``devices_sketch`` None.
    """
    start_ms, end_ms = _epoch_ms(start), _epoch_ms(end)
    resolution_ms = round(resolution_s * 1000)
    if resolution_ms <= 0:
        raise ValueError(f"resolution_s must be positive, got {resolution_s}")
    _check_quantiles(quantiles)
    if end_ms <= start_ms:
        return []
    length_ms, rows = _fetch(client, series, start_ms, end_ms, resolution_ms, source_length_s, devices)
    if length_ms is not None and resolution_ms % length_ms:
        raise ValueError(f"no stored tumbling window length divides the resolution {resolution_s} s "
                         f"(closest: {length_ms / 1000} s windows)")
    return _bucketed(rows, start_ms, end_ms, resolution_ms, length_ms, quantiles, hll_lg_k)


class WindowStats:
    """One window's statistics as the job stored them (``SeriesWindows.windows``; see :class:`SeriesWindows` for how
    they relate to :class:`RangeStats`): what the alert evaluator compares, window by window, for thousands of series
    a pass. Each statistic is read from the stored window when asked for, so a rule on counts never deserializes a
    sketch."""

    __slots__ = ("_quantiles", "_row", "_sketches", "_stored")

    def __init__(self, stored: _StoredWindow, quantiles: Sequence[float], sketches: frozenset[str]) -> None:
        self._stored, self._row, self._quantiles, self._sketches = stored, stored.window, quantiles, sketches

    @property
    def end_ms(self) -> int:
        return self._row.end_ms

    @property
    def count(self) -> int:
        return int(self._row.event_count)

    @property
    def value_count(self) -> int:
        return int(self._row.value_count)

    @property
    def sum(self) -> float:
        return float(self._row.sum)

    @property
    def min(self) -> float | None:
        return self._row.min

    @property
    def max(self) -> float | None:
        return self._row.max

    @property
    def quantiles(self) -> dict[float, float | None]:
        """Each requested rank's value: the job's own for the ranks it stores (:data:`STORED_QUANTILES`), else from
        the window's KLL sketch (``None`` without values, or when the sketch was not fetched)."""
        if all(q in STORED_QUANTILES for q in self._quantiles):
            return {q: self._stored.quantiles[STORED_QUANTILES.index(q)] for q in self._quantiles}
        values = merge_kll((self._row.value_sketch,)) if "values" in self._sketches else None
        ranked = (values.get_quantiles(list(self._quantiles), inclusive=True) if values is not None
                  else [None] * len(self._quantiles))
        return dict(zip(self._quantiles, ranked, strict=True))

    @property
    def distinct_users(self) -> int:
        return self._stored.distinct_users

    @property
    def distinct_devices(self) -> int:
        return self._stored.distinct_devices

    @property
    def levels(self) -> dict[str, int]:
        return dict(zip(LEVELS, self._row[_LEVELS_AT], strict=True))


STORED_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99, 0.999)
"""The ranks the job stores for each window (``p50`` … ``p999``), read without deserializing its sketch."""


@dataclass(frozen=True)
class SeriesWindows:
    """The stored windows of one length of some series, as fetched (:func:`fetch_series_windows`); one fetch serves
    every reader of the same series and range (the alert evaluator's rules on one series name). :meth:`windows`
    gives each series one :class:`WindowStats` per window of the range, windows without events included (count 0).

    A window's statistics are the job's own for it: its counts, its stored quantiles (the value sketch's, as
    :func:`range_buckets` of that window alone reads them) and its distinct counts (the estimate of its HLL sketch,
    which a union of that one sketch equals within the sketch's error)."""

    length_ms: int
    start_ms: int
    end_ms: int
    value_sketches: bool
    """Whether each window's KLL sketch was fetched: needed only for ranks not in :data:`STORED_QUANTILES`."""
    rows: dict[SeriesKey, list[_StoredWindow]]

    def windows(self, matches: Sequence[SeriesKey], *,
                quantiles: Sequence[float] = DEFAULT_QUANTILES) -> dict[SeriesKey, list[WindowStats]]:
        """Each of ``matches``' whole windows of the range, oldest first, windows without events included (count
        0), without a :class:`RangeStats` per window. A rank outside :data:`STORED_QUANTILES` is read from the
        window's sketch, so it needs ``value_sketches``."""
        _check_quantiles(quantiles)
        quantiles = tuple(quantiles)
        if not self.value_sketches and not set(quantiles) <= set(STORED_QUANTILES):
            raise ValueError(f"quantiles {sorted(set(quantiles) - set(STORED_QUANTILES))} need the value sketches, "
                             "which were not fetched")
        length = self.length_ms
        ends = range(-(-self.start_ms // length) * length + length, self.end_ms // length * length + 1, length)
        sketches = frozenset({"values"} if self.value_sketches else ())
        found = {}
        for series in matches:
            by_end = {row.window.end_ms: row for row in self.rows.get(series, ())
                      if row.window.end_ms - row.window.start_ms == length}
            found[series] = [WindowStats(by_end.get(end) or _no_events(length, end), quantiles, sketches)
                             for end in ends]
        return found


def _no_events(length_ms: int, end_ms: int) -> _StoredWindow:
    """A window nobody sent an event in: what the store would hold for it (count 0, no values, empty sketches)."""
    return _StoredWindow(_Row(length_ms, end_ms - length_ms, end_ms, 0, 0, 0.0, None, None, b"", b"", b"",
                              0, 0, 0, 0, 0, 0), (None,) * len(STORED_QUANTILES), 0, 0)


def fetch_series_windows(client: Client, kind: str, name: str, apps: Sequence[str], length_s: float, start: datetime,
                         end: datetime, *, value_sketches: bool = False) -> SeriesWindows:
    """One query: the tumbling windows of ``length_s`` inside ``[start, end)`` of every series of ``kind`` and
    ``name`` in ``apps`` (each tag set its own series), with each window's value sketch if ``value_sketches``."""
    return fetch_windows(client, [(kind, name)], apps, length_s, start, end,
                         value_sketches=value_sketches)[(kind, name)]


def fetch_windows(client: Client, names: Collection[tuple[str, str]], apps: Sequence[str], length_s: float,
                  start: datetime, end: datetime, *,
                  value_sketches: bool = False) -> dict[tuple[str, str], SeriesWindows]:
    """:func:`fetch_series_windows` of several (kind, name) pairs in one query, one scan of the table: each pair's
    windows of ``apps``. What one alert evaluation pass reads for all its rules of one window length."""
    start_ms, end_ms, length_ms = _epoch_ms(start), _epoch_ms(end), round(length_s * 1000)
    if length_ms <= 0:
        raise ValueError(f"length_s must be positive, got {length_s}")
    # The HLL sketches are never read (a window's distinct counts are stored); the KLL one only when asked for.
    sql = _SERIES_WINDOWS_SQL.replace("users_sketch,", "'' AS users_sketch,").replace(
        "devices_sketch,", "'' AS devices_sketch,")
    if not value_sketches:
        sql = sql.replace("value_sketch,", "'' AS value_sketch,")
    result = client.query(sql, parameters={
        "kinds": sorted({k for k, _ in names}), "names": sorted({n for _, n in names}), "apps": list(apps),
        "length_ms": length_ms, "start_ms": start_ms, "end_ms": end_ms}, column_formats=SKETCH_FORMATS)
    rows: dict[tuple[str, str], dict[SeriesKey, list[_StoredWindow]]] = {pair: {} for pair in names}
    stored_at = len(_Row._fields)
    for kind, name, app, tags, *window in result.result_rows:
        # kinds x names may pair a kind with a name not asked for it: those rows are not kept.
        if (kind, name) in rows:
            rows[(kind, name)].setdefault(SeriesKey(app, kind, name, tags), []).append(_StoredWindow(
                _Row(*window[:stored_at]), tuple(window[stored_at:-2]), window[-2], window[-1]))
    return {pair: SeriesWindows(length_ms, start_ms, end_ms, value_sketches, series) for pair, series in rows.items()}


def _bucketed(rows: list[_Row], start_ms: int, end_ms: int, resolution_ms: int, length_ms: int | None,
              quantiles: Sequence[float], hll_lg_k: int | None) -> list[RangeStats]:
    """One series' windows combined into the buckets of ``resolution_ms`` overlapping the range."""
    lo, hi = _snap(start_ms, end_ms, length_ms)
    by_bucket: dict[int, list[_Row]] = {}
    for row in rows:
        by_bucket.setdefault(row.start_ms // resolution_ms, []).append(row)
    horizon = _final_horizon(rows)
    buckets = []
    for k in range(lo // resolution_ms, -(-hi // resolution_ms)):
        b_lo, b_hi = max(lo, k * resolution_ms), min(hi, (k + 1) * resolution_ms)
        buckets.append(_combine(by_bucket.get(k, []), b_lo, b_hi, length_ms, quantiles, hll_lg_k, horizon))
    return buckets


class _Row(NamedTuple):
    """One stored window, in the column order of :data:`_WINDOWS_SQL`."""

    length_ms: int
    start_ms: int
    end_ms: int
    event_count: int
    value_count: int
    sum: float
    min: float | None
    max: float | None
    value_sketch: bytes
    users_sketch: bytes
    devices_sketch: bytes
    level_debug: int
    level_info: int
    level_warning: int
    level_error: int
    level_critical: int
    is_final: int


class _StoredWindow(NamedTuple):
    """One window of :class:`SeriesWindows`: its :class:`_Row` and the statistics the job computed for it alone."""

    window: _Row
    quantiles: tuple[float | None, ...]
    """In the order of :data:`STORED_QUANTILES`."""
    distinct_users: int
    distinct_devices: int


_LEVEL_FIELDS = tuple((level, f"level_{level}") for level in LEVELS)
_LEVELS_AT = slice(_Row._fields.index("level_debug"), _Row._fields.index("level_debug") + len(LEVELS))
"""Where a row's per-level counts are, in the order of ``LEVELS``."""
_NO_ROWS = _Row(*([()] * len(_Row._fields)))
"""Column-wise view of no windows (see ``_combine``)."""

_SERIES_IN_RANGE = (
    "window_kind = 'tumbling' AND app = {app:String} AND kind = {kind:String} AND name = {name:String} "
    "AND series_tags = {tags:String} "
    "AND window_start >= fromUnixTimestamp64Milli({start_ms:Int64}, 'UTC') "
    "AND window_end <= fromUnixTimestamp64Milli({end_ms:Int64}, 'UTC')"
)
# Chosen in the same query: the largest length with windows in the range that divides `align_ms`, else the
# smallest such length. No windows at all: 0, which matches nothing.
_CHOSEN_LENGTH = (
    "(SELECT if(countIf({align_ms:UInt64} % window_length_ms = 0) > 0, "
    "maxIf(window_length_ms, {align_ms:UInt64} % window_length_ms = 0), min(window_length_ms)) "
    "FROM window_aggregates WHERE " + _SERIES_IN_RANGE + ")"
)
# window_results = window_aggregates FINAL (latest version of each window) plus its finality.
_WINDOWS_SQL = (
    "SELECT window_length_ms, toUnixTimestamp64Milli(window_start), toUnixTimestamp64Milli(window_end), "
    "event_count, value_count, sum, min, max, value_sketch, users_sketch, devices_sketch, "
    + ", ".join(f"level_{level}" for level in LEVELS) + ", is_final "
    "FROM window_results WHERE " + _SERIES_IN_RANGE + " AND window_length_ms = {length} ORDER BY window_start"
)


_SERIES_WINDOWS_SQL = (
    "SELECT kind, name, app, series_tags, window_length_ms, toUnixTimestamp64Milli(window_start), "
    "toUnixTimestamp64Milli(window_end), event_count, value_count, sum, min, max, value_sketch, users_sketch, "
    "devices_sketch, " + ", ".join(f"level_{level}" for level in LEVELS) + ", is_final, "
    "p50, p90, p95, p99, p999, distinct_users, distinct_devices "   # p…: STORED_QUANTILES
    "FROM window_results WHERE window_kind = 'tumbling' AND kind IN {kinds:Array(String)} "
    "AND name IN {names:Array(String)} AND app IN {apps:Array(String)} AND window_length_ms = {length_ms:UInt64} "
    "AND window_start >= fromUnixTimestamp64Milli({start_ms:Int64}, 'UTC') "
    "AND window_end <= fromUnixTimestamp64Milli({end_ms:Int64}, 'UTC') "
    "ORDER BY kind, name, app, series_tags, window_start"
)


def _fetch(client: Client, series: SeriesKey, start_ms: int, end_ms: int, align_ms: int,
           source_length_s: float | None, devices: bool = True) -> tuple[int | None, list[_Row]]:
    """(source window length in ms or None when unknown, the windows of that length inside the range)."""
    parameters: dict[str, Any] = {"app": series.app, "kind": series.kind, "name": series.name,
                                  "tags": series.series_tags, "start_ms": start_ms, "end_ms": end_ms}
    if source_length_s is None:
        length = _CHOSEN_LENGTH
        parameters["align_ms"] = align_ms
    else:
        parameters["length_ms"] = round(source_length_s * 1000)
        if parameters["length_ms"] <= 0:
            raise ValueError(f"source_length_s must be positive, got {source_length_s}")
        length = "{length_ms:UInt64}"
    sql = _WINDOWS_SQL.replace("{length}", length)
    if not devices:
        sql = sql.replace("devices_sketch,", "'' AS devices_sketch,")
    result = client.query(sql, parameters=parameters, column_formats=SKETCH_FORMATS)
    rows = [_Row(*row) for row in result.result_rows]
    if source_length_s is not None:
        return parameters["length_ms"], rows
    return (int(rows[0].length_ms) if rows else None), rows


def _combine(rows: list[_Row], lo: int, hi: int, length_ms: int | None, quantiles: Sequence[float],
             hll_lg_k: int | None, horizon_ms: int | None) -> RangeStats:
    # Column-wise (one tuple per field): sums over tuples run in C, where a generator per field and bucket cost
    # more than the sketches for a day of 60 s buckets.
    cols = (_Row._make((v,) for v in rows[0]) if len(rows) == 1 else _Row(*zip(*rows, strict=True)) if rows
            else _NO_ROWS)
    values = merge_kll(cols.value_sketch)
    users = merge_hll(cols.users_sketch, hll_lg_k)
    devices = merge_hll(cols.devices_sketch, hll_lg_k)
    mins = [m for m in cols.min if m is not None]
    maxs = [m for m in cols.max if m is not None]
    # One sorted view of the sketch for all ranks (get_quantile per rank built it once per rank).
    ranked = values.get_quantiles(list(quantiles), inclusive=True) if values is not None else [None] * len(quantiles)
    return RangeStats(
        start=_utc_ms(lo),
        end=_utc_ms(hi),
        source_length_s=length_ms / 1000 if length_ms is not None else None,
        windows=len(rows),
        count=int(sum(cols.event_count)),
        value_count=int(sum(cols.value_count)),
        # fsum: the correctly rounded sum of the window sums, independent of their order.
        sum=math.fsum(cols.sum),
        min=min(mins) if mins else None,
        max=max(maxs) if maxs else None,
        quantiles=dict(zip(quantiles, ranked, strict=True)),
        distinct_users=hll_estimate(users),
        distinct_devices=hll_estimate(devices),
        levels={level: int(sum(getattr(cols, field))) for level, field in _LEVEL_FIELDS},
        final=horizon_ms is not None and horizon_ms >= hi,
        value_sketch=values,
        users_sketch=users,
        devices_sketch=devices,
    )


@functools.lru_cache(maxsize=4096)
def _utc_ms(ms: int) -> datetime:
    """A bucket bound as a UTC datetime; cached: every series of a read shares its buckets' bounds."""
    return _EPOCH + ms * _MS


def _final_horizon(rows: list[_Row]) -> int | None:
    # A final window ending at t proves the watermark reached t, so every window ending by t is final too,
    # including ones not written yet (Spark drops contributions to windows the watermark has closed).
    ends = [r.end_ms for r in rows if r.is_final]
    return max(ends) if ends else None


def _snap(start_ms: int, end_ms: int, length_ms: int | None) -> tuple[int, int]:
    """The part of ``[start_ms, end_ms)`` tiled by whole windows of ``length_ms`` (unchanged when unknown)."""
    if length_ms is None:
        return start_ms, end_ms
    lo = -(-start_ms // length_ms) * length_ms
    return lo, max(lo, end_ms // length_ms * length_ms)


def _epoch_ms(ts: datetime) -> int:
    # Integer arithmetic: float timestamps can be off by a millisecond.
    return ((ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts) - _EPOCH) // _MS


def _check_quantiles(quantiles: Sequence[float]) -> None:
    bad = [q for q in quantiles if not 0.0 <= q <= 1.0]
    if bad:
        raise ValueError(f"quantile ranks must lie in [0, 1], got {bad}")
