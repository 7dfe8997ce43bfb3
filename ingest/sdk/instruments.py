"""The SDK's metric instruments: counter, gauge, histogram and timer (:meth:`ingest.sdk.Client.counter` and its
siblings make them).

Each call is the SDK's hot path: a check, a clock read, one tuple appended to the client's bounded buffer
(:class:`ingest.sdk.buffer.EventBuffer`); the background sender encodes it later.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping
from math import isfinite
from typing import Any, ParamSpec, TypeVar

from ingest.sdk.buffer import EventBuffer
from ingest.sdk.sender import METRIC

P = ParamSpec("P")
R = TypeVar("R")

def _merge_tags(fixed: Mapping[str, str] | None, call: Mapping[str, Any]) -> Mapping[str, Any] | None:
    if not call:
        return fixed
    return {**fixed, **call} if fixed else call


class Instrument:
    """What every metric instrument shares: its envelope head, fixed tags, and a direct path into the buffer."""

    __slots__ = ("_capacity", "_head", "_items", "_now", "_put_full", "_tags", "name")

    def __init__(self, buffer: EventBuffer, now: Callable[[], int], head: str, name: str,
                 tags: Mapping[str, str] | None) -> None:
        """``head``: the envelope's fixed part (:func:`ingest.sdk.sender.envelope_head`); ``now``: the client's
        clock, in the buffer's unit."""
        self.name = name
        self._head = head
        self._tags = dict(tags) if tags else None
        # EventBuffer.put inlined (one Python call less per event); the deque survives fork (emptied in place).
        self._items, self._capacity, self._put_full = buffer.items, buffer.capacity, buffer.put_full
        self._now = now

    def _record(self, value: float, user: str | None, tags: Mapping[str, Any]) -> None:
        # The hot path: a check, a clock read, one tuple, one deque append.
        if not isfinite(value):
            raise ValueError(f"{self.name}: value must be finite, not {value!r}")
        item = (METRIC, self._head, value, self._now(), user, _merge_tags(self._tags, tags) if tags else self._tags)
        if len(self._items) < self._capacity:
            self._items.append(item)
        else:
            self._put_full(item)


class Counter(Instrument):
    """Counts things. Each ``inc`` is one metric event whose value is the increment."""

    __slots__ = ()

    def inc(self, amount: float = 1.0, *, user: str | None = None, **tags: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter only goes up; use a gauge for {amount!r}")
        self._record(amount, user, tags)


class Gauge(Instrument):
    """A current level (queue length, temperature). Each ``set`` is one metric event."""

    __slots__ = ()

    def set(self, value: float, *, user: str | None = None, **tags: str) -> None:
        self._record(value, user, tags)


class Histogram(Instrument):
    """A distribution (latency, size). Each ``observe`` is one metric event; windows keep its quantiles."""

    __slots__ = ()

    def observe(self, value: float, *, user: str | None = None, **tags: str) -> None:
        self._record(value, user, tags)


class Timer(Instrument):
    """Observes elapsed wall time in milliseconds: ``with timer:`` or ``@timer`` on a function."""

    __slots__ = ("_starts",)

    def __init__(self, buffer: EventBuffer, now: Callable[[], int], head: str, name: str,
                 tags: Mapping[str, str] | None) -> None:
        super().__init__(buffer, now, head, name, tags)
        self._starts = threading.local()   # a stack per thread: one timer may be entered in many threads

    def observe_ms(self, elapsed_ms: float, *, user: str | None = None, **tags: str) -> None:
        self._record(elapsed_ms, user, tags)

    def __enter__(self) -> Timer:
        stack = self._starts.__dict__.setdefault("stack", [])
        stack.append(time.perf_counter_ns())
        return self

    def __exit__(self, *exc: object) -> None:
        self._record((time.perf_counter_ns() - self._starts.stack.pop()) / 1e6, None, {})

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def timed(*args: P.args, **kwargs: P.kwargs) -> R:
            start = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self._record((time.perf_counter_ns() - start) / 1e6, None, {})
        return timed
