"""OTLP metrics as v1 metric envelopes: gauges, sums, histograms, exponential histograms and summaries.

docs/ingest.md ("OpenTelemetry (OTLP/HTTP)") has the table and the reasons. In short: a v1 metric event is one
observation, and the stream job's windows aggregate observations (count, sum, min, max, quantiles from a KLL
sketch). So a gauge point is an observation of its value; a sum point is its increase since the previous point (a
cumulative sum turned into deltas, with reset detection); a histogram point is its (delta) bucket counts replayed
as observations at values inside their buckets, at most ``otlp.histogram_max_events`` of them, plus exact
``<name>.count`` and ``<name>.sum`` deltas; a summary's quantiles are stored as they are, as gauges of their own
names, marked as not mergeable.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from eventide.config import OtlpConfig
from ingest.gateway.otlp.mapping import (
    Mapped,
    Source,
    Timing,
    envelope,
    in_scope,
    out_of_scope,
    record_id,
    refuse_all,
    scope_digest,
    source_of,
    text,
)
from ingest.gateway.otlp.state import CumulativeSeries, SeriesGuard

DELTA: Final = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
CUMULATIVE: Final = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
NO_RECORDED_VALUE: Final = metrics_pb2.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
SUMMARY_TAG: Final = {"otel.summary": "quantile, not mergeable"}
"""Tags of a summary's quantile events: a quantile of one device's interval cannot be combined with others."""
MIN_SCALE: Final = -10
MAX_SCALE: Final = 20
"""The exponential histogram scales OpenTelemetry defines (its data model: -10 to 20). Below -10 a bucket's base
``2^(2^-scale)`` is past any double; such a point is refused, not mapped."""


# ----------------------------------------------------------------------------------------------------------
# Histograms: one shape for explicit and exponential buckets


@dataclass(frozen=True)
class Histogram:
    """A histogram point's counts: ``buckets`` maps a bucket key to its count (nonzero only); ``layout`` says what
    the keys mean: ``("explicit", bounds)`` (key i: ``(bounds[i-1], bounds[i]]``) or ``("exponential", scale)``
    (key ``(sign, index)``: ``(base^index, base^(index+1)]`` with ``base = 2^(2^-scale)``, negated for sign -1;
    key ``(0, 0)``: the zero bucket)."""

    layout: tuple[Any, ...]
    count: int
    sum: float | None
    buckets: dict[Any, int]
    min: float | None = None
    max: float | None = None


def explicit_histogram(point: metrics_pb2.HistogramDataPoint) -> Histogram:
    return Histogram(("explicit", tuple(point.explicit_bounds)), point.count,
                     point.sum if point.HasField("sum") else None,
                     {i: c for i, c in enumerate(point.bucket_counts) if c},
                     point.min if point.HasField("min") else None, point.max if point.HasField("max") else None)


def exponential_histogram(point: metrics_pb2.ExponentialHistogramDataPoint) -> Histogram:
    buckets: dict[Any, int] = {}
    if point.zero_count:
        buckets[(0, 0)] = point.zero_count
    for sign, side in ((1, point.positive), (-1, point.negative)):
        for k, c in enumerate(side.bucket_counts):
            if c:
                buckets[(sign, side.offset + k)] = c
    return Histogram(("exponential", point.scale), point.count, point.sum if point.HasField("sum") else None,
                     buckets, point.min if point.HasField("min") else None,
                     point.max if point.HasField("max") else None)


def _downscaled(h: Histogram, scale: int) -> Histogram:
    """``h`` (exponential) at a lower ``scale``: each bucket merged into the one holding it (index >> shift)."""
    shift = h.layout[1] - scale
    buckets: dict[Any, int] = {}
    for (sign, index), c in h.buckets.items():
        key = (sign, index >> shift) if sign else (0, 0)
        buckets[key] = buckets.get(key, 0) + c
    return Histogram(("exponential", scale), h.count, h.sum, buckets)


def subtract_histograms(current: Histogram, previous: Histogram) -> Histogram | None:
    """The observations ``current`` (cumulative) added to ``previous``, or None when it cannot follow it (a reset:
    fewer observations in some bucket, other bounds, a finer scale). An exponential histogram's scale may only go
    down along a series (SDKs rescale to fit new values): the previous counts are rescaled first. Min and max of
    the difference are unknown."""
    if current.layout[0] == "exponential" == previous.layout[0] and current.layout[1] < previous.layout[1]:
        previous = _downscaled(previous, current.layout[1])
    if current.layout != previous.layout or current.count < previous.count:
        return None
    buckets = {}
    for key, c in current.buckets.items():
        d = c - previous.buckets.get(key, 0)
        if d < 0:
            return None
        if d:
            buckets[key] = d
    if any(key not in current.buckets for key in previous.buckets):
        return None
    total = None if current.sum is None or previous.sum is None else current.sum - previous.sum
    return Histogram(current.layout, current.count - previous.count, total, buckets)


def _power(base_log2: float, index: int) -> float:
    try:
        return 2.0 ** (index * base_log2)
    except OverflowError:
        return math.inf


def bucket_ranges(h: Histogram) -> list[tuple[float, float, int]]:
    """``(low, high, count)`` of the nonempty buckets in ascending order, every edge finite: an open-ended
    bucket's infinite edge is the point's min or max when known, else its finite edge; edges are narrowed to min
    and max when known. With a single bucket and neither min nor max, every observation is at the mean."""
    ranges: list[tuple[float, float, int]] = []
    if h.layout[0] == "explicit":
        bounds = h.layout[1]
        for i in sorted(h.buckets):
            low = bounds[i - 1] if 0 < i <= len(bounds) else -math.inf
            high = bounds[i] if i < len(bounds) else math.inf
            ranges.append((low, high, h.buckets[i]))
    else:
        step = 2.0 ** -h.layout[1]   # log2 of the base
        for sign, index in sorted(h.buckets, key=lambda k: (k[0], k[1] * k[0])):
            if sign == 0:
                ranges.append((0.0, 0.0, h.buckets[(0, 0)]))
                continue
            low, high = _power(step, index), _power(step, index + 1)
            ranges.append((low, high, h.buckets[(sign, index)]) if sign > 0
                          else (-high, -low, h.buckets[(sign, index)]))
        ranges.sort(key=lambda r: r[0])
    lowest = h.min if h.min is not None and math.isfinite(h.min) else None
    highest = h.max if h.max is not None and math.isfinite(h.max) else None
    if len(ranges) == 1 and lowest is None and highest is None and h.sum is not None and h.count and \
            not (math.isfinite(ranges[0][0]) and math.isfinite(ranges[0][1])):
        mean = h.sum / h.count
        return [(mean, mean, ranges[0][2])]
    finite = []
    for low, high, c in ranges:
        if lowest is not None:
            low, high = max(low, lowest), max(high, lowest)
        if highest is not None:
            low, high = min(low, highest), min(high, highest)
        if not math.isfinite(low):
            low = high
        if not math.isfinite(high):
            high = low
        if math.isfinite(low):
            finite.append((low, high, c))
    return finite


def sample_values(h: Histogram, cap: int) -> list[float]:
    """Observations standing for ``h``'s counts, ascending: ``count`` of them when at most ``cap``, each inside its
    bucket, spread evenly over it (linear interpolation within a bucket, as Prometheus' ``histogram_quantile``);
    the lowest is the point's min and the highest its max when known.

    Beyond ``cap`` the counts are scaled to ``cap`` samples by cumulative rounding (each bucket boundary's rank is
    off by at most half a sample), so quantiles keep their bucket up to a rank error of ``1 / (2 cap)``.
    """
    ranges = bucket_ranges(h)
    total = sum(c for _, _, c in ranges)
    if not total:
        return []
    scaled = total > cap
    values: list[float] = []
    before = 0
    for low, high, c in ranges:
        n = round((before + c) * cap / total) - round(before * cap / total) if scaled else c
        before += c
        values.extend(low + (j + 0.5) * (high - low) / n for j in range(n))
    if values and h.min is not None and math.isfinite(h.min):
        values[0] = h.min
    if values and h.max is not None and math.isfinite(h.max):
        values[-1] = h.max
    return values


# ----------------------------------------------------------------------------------------------------------
# State between requests


def _subtract_numbers(current: float, previous: float) -> float | None:
    return None if current < previous else current - previous


def _same(value: Any) -> Any:
    return value


class MetricState:
    """What the metrics mapping remembers between requests: cumulative sums, cumulative histograms and summary
    counts (last points), and the live series per app."""

    def __init__(self, settings: OtlpConfig, started_ms: int) -> None:
        bound = settings.max_cumulative_series
        self.sums: CumulativeSeries[float, float] = CumulativeSeries(bound, started_ms, _subtract_numbers, _same)
        self.histograms: CumulativeSeries[Histogram, Histogram] = CumulativeSeries(
            bound, started_ms, subtract_histograms, _same)
        self.guard = SeriesGuard(settings.max_series_per_app, int(settings.series_ttl_s * 1000))

    def stats(self, apps: frozenset[str] | None = None) -> dict[str, Any]:
        """Counters for a token of ``apps`` (None: any app): a scoped token sees its own apps only, so the
        process-wide series counts are left out for it."""
        if apps is not None:
            return {"series_refused": {app: n for app, n in self.guard.rejected.items() if app in apps},
                    "live_series": {app: self.guard.live(app) for app in sorted(apps)}}
        return {"series_refused": dict(self.guard.rejected),
                "live_series": {app: self.guard.live(app) for app in self.guard.apps()},
                "cumulative_series": len(self.sums) + len(self.histograms),
                "cumulative_series_forgotten": self.sums.evicted + self.histograms.evicted}


# ----------------------------------------------------------------------------------------------------------
# The mapping


def _points(metric: metrics_pb2.Metric) -> Iterator[Any]:
    which = metric.WhichOneof("data")
    if which is not None:
        yield from getattr(metric, which).data_points


def count_points(request: ExportMetricsServiceRequest) -> int:
    """The data points of a request, counted without looking at any of them."""
    return sum(len(getattr(m, which).data_points) for r in request.resource_metrics for s in r.scope_metrics
               for m in s.metrics if (which := m.WhichOneof("data")) is not None)


def _samples_bound(counts: Iterator[int], cap: int) -> int:
    """Samples of a histogram whose buckets hold ``counts``: never more than their total nor than ``cap``
    (:func:`sample_values`; a cumulative point's delta holds at most its own counts)."""
    total = 0
    for count in counts:
        total += count
        if total >= cap:
            return cap
    return total


def point_envelopes_bound(which: str | None, point: Any, settings: OtlpConfig) -> int:
    """At most how many envelopes :func:`map_metrics` makes of one point (read off the point, before mapping)."""
    if point.flags & NO_RECORDED_VALUE:
        return 0
    if which in ("gauge", "sum"):
        return 1
    if which == "histogram":
        samples = _samples_bound(iter(point.bucket_counts), settings.histogram_max_events)
        return samples + 1 + point.HasField("sum")
    if which == "exponential_histogram":
        counts = iter((point.zero_count, *point.positive.bucket_counts, *point.negative.bucket_counts))
        return _samples_bound(counts, settings.histogram_max_events) + 1 + point.HasField("sum")
    if which == "summary":
        return 2 + len(point.quantile_values)
    return 0


def metrics_cost_bound(request: ExportMetricsServiceRequest, settings: OtlpConfig) -> int:
    """At most what mapping ``request`` costs (:meth:`Mapped.cost`: each point its envelopes, at least one)."""
    return sum(max(1, point_envelopes_bound(which, point, settings))
               for r in request.resource_metrics for s in r.scope_metrics for m in s.metrics
               if (which := m.WhichOneof("data")) is not None for point in getattr(m, which).data_points)


def latest_point_times(request: ExportMetricsServiceRequest, settings: OtlpConfig,
                       apps: frozenset[str] | None = None) -> dict[bytes, int]:
    """Per resource (its digest), the latest point time (ms, device clock) of the request: when the SDK collected
    it. Resources of apps outside ``apps`` are left out: they give no estimate."""
    latest: dict[bytes, int] = {}
    for resource_metrics in request.resource_metrics:
        source = source_of(resource_metrics.resource, settings)
        if not in_scope(source, apps):
            continue
        key = source.digest
        newest = max((p.time_unix_nano for s in resource_metrics.scope_metrics for m in s.metrics
                      for p in _points(m)), default=0) // 1_000_000
        if newest > 0:
            latest[key] = max(latest.get(key, 0), newest)
    return latest


class _Emitter:
    """Envelopes of one data point (they share its id prefix, time, user and tags)."""

    def __init__(self, mapped: Mapped, owner: int, event_id: str, source: Source, times: tuple[int, int],
                 user: str | None, tags: Mapping[str, str]) -> None:
        self.mapped, self.owner, self.id, self.source, self.times = mapped, owner, event_id, source, times
        self.user, self.tags = user, tags

    def emit(self, name: str, value: float, suffix: str = "", tags: Mapping[str, str] | None = None) -> None:
        self.mapped.add(self.owner, envelope("metric", self.id + suffix, self.source, name, *self.times, self.user,
                                             self.tags if tags is None else {**self.tags, **tags}, value=value))


def map_metrics(request: ExportMetricsServiceRequest, timings: Mapping[bytes, Timing], default: Timing,
                settings: OtlpConfig, state: MetricState, apps: frozenset[str] | None = None) -> Mapped:
    """Each data point as metric envelopes (module docstring); ``state`` carries cumulative series and the
    cardinality guard across requests. Points are numbered across the request for ``partial_success``. Points of
    apps outside ``apps`` (None: any) are refused before they touch ``state``."""
    mapped = Mapped()
    user_key = settings.user_attribute
    for r, resource_metrics in enumerate(request.resource_metrics):
        source = source_of(resource_metrics.resource, settings)
        if not in_scope(source, apps):
            points = sum(len(getattr(m, which).data_points) for s in resource_metrics.scope_metrics
                         for m in s.metrics if (which := m.WhichOneof("data")) is not None)
            refuse_all(mapped, points, out_of_scope(source.app))
            continue
        timing = timings.get(source.digest, default)
        for s, scope_metrics in enumerate(resource_metrics.scope_metrics):
            scope = scope_digest(scope_metrics.scope)
            for m, metric in enumerate(scope_metrics.metrics):
                which = metric.WhichOneof("data")
                for p, point in enumerate(_points(metric)):
                    owner = mapped.records
                    mapped.records += 1
                    if point.flags & NO_RECORDED_VALUE:
                        continue   # a staleness marker: no observation to store
                    stamped = timing.stamp(point.time_unix_nano // 1_000_000)
                    if isinstance(stamped, str):
                        mapped.refused[owner] = stamped
                        continue
                    attributes = tuple(sorted((kv.key, text(kv.value)) for kv in point.attributes))
                    if not state.guard.admit(source.app, (metric.name, attributes), timing.received_ms):
                        mapped.refused[owner] = (f"app {source.app} has otlp.max_series_per_app "
                                                 f"({settings.max_series_per_app}) live series: new series refused")
                        continue
                    tags = {k: v for k, v in attributes if k != user_key}
                    user = next((v for k, v in attributes if k == user_key), source.attributes.get(user_key))
                    content = metric.name.encode() + b"\0" + point.SerializeToString(deterministic=True)
                    emitter = _Emitter(mapped, owner, record_id(source, scope, (r, s, m, p), content), source,
                                       stamped, user, tags)
                    key: Hashable = (source.digest, scope, metric.name, attributes)
                    start = point.start_time_unix_nano
                    start_ms = start // 1_000_000 + timing.correction_ms if start else None
                    reason = _map_point(which, metric, point, emitter, key, start_ms, timing.received_ms,
                                        settings, state)
                    if reason is not None:
                        mapped.refused[owner] = reason
    return mapped


def _number(point: metrics_pb2.NumberDataPoint) -> float | int | None:
    which = point.WhichOneof("value")
    return None if which is None else getattr(point, which)


def _map_point(which: str | None, metric: metrics_pb2.Metric, point: Any, out: _Emitter, key: Hashable,
               start_ms: int | None, now_ms: int, settings: OtlpConfig, state: MetricState) -> str | None:
    """Emit the envelopes of one point; the reason it is rejected, or None."""
    name = metric.name
    if which == "gauge":
        value = _number(point)
        if value is None:
            return "data point has no value"
        out.emit(name, value)
    elif which == "sum":
        value = _number(point)
        if value is None:
            return "data point has no value"
        temporality = metric.sum.aggregation_temporality
        if temporality == DELTA or (temporality == CUMULATIVE and not metric.sum.is_monotonic):
            # Deltas are what a window sums; a non-monotonic cumulative sum (an up-down counter) is a level, whose
            # value is stored as it is, like a gauge.
            out.emit(name, value)
        elif temporality == CUMULATIVE:
            delta = state.sums.delta(key, point.start_time_unix_nano, point.time_unix_nano, float(value), start_ms,
                                     now_ms)
            if delta is not None:
                out.emit(name, delta)
        else:
            return "sum has no aggregation temporality"
    elif which in ("histogram", "exponential_histogram"):
        body = getattr(metric, which)
        if which == "exponential_histogram" and not MIN_SCALE <= point.scale <= MAX_SCALE:
            return f"exponential histogram scale {point.scale} is outside [{MIN_SCALE}, {MAX_SCALE}]"
        h = explicit_histogram(point) if which == "histogram" else exponential_histogram(point)
        if which == "histogram" and point.bucket_counts and len(point.bucket_counts) != len(point.explicit_bounds) + 1:
            return "histogram has bucket_counts that do not match its explicit_bounds"
        if body.aggregation_temporality == CUMULATIVE:
            emitted = state.histograms.delta(key, point.start_time_unix_nano, point.time_unix_nano, h, start_ms,
                                             now_ms)
            if emitted is None:
                return None
            h = emitted
        elif body.aggregation_temporality != DELTA:
            return "histogram has no aggregation temporality"
        for k, value in enumerate(sample_values(h, settings.histogram_max_events)):
            out.emit(name, value, f"-{k}")
        out.emit(f"{name}.count", h.count, "-count")
        if h.sum is not None:
            out.emit(f"{name}.sum", h.sum, "-sum")
    elif which == "summary":
        # Count and sum are cumulative (OTLP summaries always are): deltas, as for a histogram's.
        for suffix, value in (("count", float(point.count)), ("sum", point.sum)):
            delta = state.sums.delta((key, suffix), point.start_time_unix_nano, point.time_unix_nano, value,
                                     start_ms, now_ms)
            if delta is not None:
                out.emit(f"{name}.{suffix}", delta, f"-{suffix}")
        for q in point.quantile_values:
            out.emit(f"{name}.p{q.quantile * 100:g}", q.value, f"-q{q.quantile:g}", SUMMARY_TAG)
    else:
        return "metric has no data"
    return None
