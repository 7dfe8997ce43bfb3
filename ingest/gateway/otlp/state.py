"""What the gateway remembers between OTLP requests, each bounded: device clock offsets, the last point of each
cumulative series (to turn the next one into a delta) and the live series of each app (the cardinality guard).

All of it lives in one gateway process and is lost when it restarts (docs/ingest.md says what that means). Not
thread-safe on its own: :class:`ingest.gateway.otlp.routes.OtlpIngest` calls it under one lock.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
D = TypeVar("D")

CLOCK_BUCKETS = 10
"""The clock window is kept as this many per-bucket minimums (a sliding minimum in constant space per device)."""


class ClockOffsets:
    """Per device (any key: the gateway uses the resource), an estimate of ``server clock - device clock`` in ms.

    OTLP carries no send time. Each request gives ``received - latest``: the gateway's receive time minus the latest
    time (device clock) among its records. That is the clock difference plus the delay between the newest record
    and its arrival (export batching, network), which is never negative, so the smallest value over a recent period
    (``window_ms``) is the best estimate, too large by the smallest delay seen. Estimates smaller in magnitude than
    ``threshold_ms`` are taken as 0, so ordinary export delays are not mistaken for a skewed clock.
    """

    def __init__(self, window_ms: int, threshold_ms: int, max_devices: int) -> None:
        self.window_ms, self.threshold_ms, self.max_devices = window_ms, threshold_ms, max_devices
        self._bucket_ms = max(1, window_ms // CLOCK_BUCKETS)
        self._devices: OrderedDict[Hashable, deque[tuple[int, int]]] = OrderedDict()

    def observe(self, device: Hashable, received_ms: int, latest_ms: int) -> int:
        """Record one request of ``device`` and return the correction to apply to its records (ms to add to a
        device time to get server time; 0 within the threshold)."""
        sample = received_ms - latest_ms
        bucket = received_ms // self._bucket_ms
        history = self._devices.get(device)
        if history is None:
            history = self._devices[device] = deque()
            if len(self._devices) > self.max_devices:
                self._devices.popitem(last=False)
        else:
            self._devices.move_to_end(device)
        self._expire(history, received_ms)
        if history and history[-1][0] == bucket:
            history[-1] = (bucket, min(history[-1][1], sample))
        else:
            history.append((bucket, sample))
        return self._correction(history)

    def estimate(self, device: Hashable, received_ms: int) -> int:
        """The correction for ``device`` from the requests seen so far (0 for none), without a new sample: for a
        request whose record times are no clock reading."""
        history = self._devices.get(device)
        if history is None:
            return 0
        self._expire(history, received_ms)
        return self._correction(history) if history else 0

    def _expire(self, history: deque[tuple[int, int]], received_ms: int) -> None:
        oldest = (received_ms - self.window_ms) // self._bucket_ms
        while history and history[0][0] < oldest:
            history.popleft()

    def _correction(self, history: deque[tuple[int, int]]) -> int:
        estimate = min(s for _, s in history)
        return estimate if abs(estimate) >= self.threshold_ms else 0


@dataclass
class _Last(Generic[T, D]):
    start_ns: int
    time_ns: int
    value: T
    emitted: D | None


class CumulativeSeries(Generic[T, D]):
    """The last point of each cumulative series, to turn the next one into a delta (with reset detection).

    ``subtract(current, previous)`` gives the delta of two cumulative values, or None when ``current`` cannot follow
    ``previous`` (a counter went down, buckets changed): a reset, whose delta is the whole current value. At most
    ``max_series`` series are kept (least recently seen forgotten first). ``horizon_ms`` (server clock) is the time
    since which nothing was forgotten: the gateway's start, later the last eviction.
    """

    def __init__(self, max_series: int, horizon_ms: int, subtract: Callable[[T, T], D | None],
                 whole: Callable[[T], D]) -> None:
        self.max_series, self.horizon_ms = max_series, horizon_ms
        self._subtract, self._whole = subtract, whole
        self._series: OrderedDict[Hashable, _Last[T, D]] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._series)

    def delta(self, key: Hashable, start_ns: int, time_ns: int, value: T, start_server_ms: int | None,
              now_ms: int) -> D | None:
        """The delta this point adds (None: nothing to emit).

        - first point of a series: the whole value when the series started (``start_server_ms``, its start time on
          the server's clock) after ``horizon_ms``, i.e. nothing of it can have been counted before; else a
          baseline (None): an earlier gateway process, or one before an eviction, may have counted it;
        - the same point again (same time and value: a client re-sending a request whose answer it lost, or one
          Kafka refused): the same delta as the first time, so its event has the same id and content;
        - another value at the same time: None (a series cannot have two values at one instant, and the first
          one's delta, sized by that point, must not stand for this one);
        - an older point than the last one: None (its increase is in the newer point's delta);
        - a new start time, or a value that cannot follow the last: a reset, the whole value;
        - otherwise the difference.
        """
        last = self._series.get(key)
        if last is None:
            fresh = start_ns > 0 and start_server_ms is not None and start_server_ms >= self.horizon_ms
            emitted = self._whole(value) if fresh else None
            self._series[key] = _Last(start_ns, time_ns, value, emitted)
            if len(self._series) > self.max_series:
                self._series.popitem(last=False)
                self.evicted += 1
                self.horizon_ms = now_ms
            return emitted
        self._series.move_to_end(key)
        if time_ns == last.time_ns:
            # repr: NaN (a sum may be one) equals itself, so a re-sent point with one is still the same point.
            return last.emitted if start_ns == last.start_ns and repr(value) == repr(last.value) else None
        if time_ns < last.time_ns:
            return None
        difference = self._subtract(value, last.value) if start_ns == last.start_ns else None
        emitted = self._whole(value) if difference is None else difference
        self._series[key] = _Last(start_ns, time_ns, value, emitted)
        return emitted


class SeriesGuard:
    """At most ``max_series`` live series per app; a series is live while it had a point within ``ttl_ms``."""

    def __init__(self, max_series: int, ttl_ms: int) -> None:
        self.max_series, self.ttl_ms = max_series, ttl_ms
        self._apps: dict[str, OrderedDict[Any, int]] = {}
        self._swept_ms = 0
        self.rejected: dict[str, int] = {}
        """Points refused per app since the gateway started."""

    def _sweep(self, now_ms: int) -> None:
        """Expire every app's old series and forget apps with none left (an app that stopped sending would
        otherwise keep its series here forever). At most once per ``ttl_ms``, so it costs nothing per point."""
        expired = now_ms - self.ttl_ms
        for app in list(self._apps):
            live = self._apps[app]
            while live and next(iter(live.values())) < expired:
                live.popitem(last=False)
            if not live:
                del self._apps[app]
        self._swept_ms = now_ms

    def admit(self, app: str, series: Hashable, now_ms: int) -> bool:
        """True when ``series`` of ``app`` may be written (already live, or room for one more)."""
        if now_ms - self._swept_ms >= self.ttl_ms:
            self._sweep(now_ms)
        live = self._apps.get(app)
        if live is None:
            live = self._apps[app] = OrderedDict()
        if series in live:
            live[series] = now_ms
            live.move_to_end(series)
            return True
        expired = now_ms - self.ttl_ms
        while live and next(iter(live.values())) < expired:
            live.popitem(last=False)
        if len(live) >= self.max_series:
            self.rejected[app] = self.rejected.get(app, 0) + 1
            return False
        live[series] = now_ms
        return True

    def live(self, app: str) -> int:
        """Series of ``app`` counted against its budget (those expired since the last sweep included)."""
        return len(self._apps.get(app, ()))

    def apps(self) -> list[str]:
        """Apps with live series, in name order."""
        return sorted(self._apps)
