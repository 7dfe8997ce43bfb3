"""The SDK's client: one app on one device, its instruments, log events, health and lifecycle.

Instruments (:mod:`ingest.sdk.instruments`): ``counter(name).inc()``, ``gauge(name).set()``,
``histogram(name).observe()``, ``timer(name)`` (a context manager and a decorator that observes milliseconds);
then ``log(level, message, **tags)`` and :class:`EventHandler` for Python's ``logging``. Every call takes an
optional ``user=`` and tags.

A call only stamps ``event_time`` from the device clock and appends a tuple to a bounded in-memory buffer; a
background thread (:mod:`ingest.sdk.sender`) encodes, stamps ``sent_time`` and hands events to Kafka, or to the
on-disk spool (:mod:`ingest.sdk.spool`) while Kafka is unreachable. When the buffer is full the configured overflow
policy applies (``sdk.overflow_policy``: block, drop_oldest, drop_newest) and drops are counted exactly
(:meth:`Client.stats`, and the SDK's own ``eventide.sdk.*`` health metrics).

Thread-safe; after ``os.fork`` the child gets its own empty buffer, sender and Kafka producer (events buffered
before the fork are sent by the parent only). At interpreter exit every open client is closed, so buffered events
reach Kafka or the spool.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import time
import weakref
from collections.abc import Callable, Mapping
from math import isfinite
from types import TracebackType
from typing import Any

from eventide.config import Config, load_config
from eventide.envelope import LEVELS, now_ms
from ingest.sdk.buffer import EventBuffer
from ingest.sdk.instruments import Counter, Gauge, Histogram, Instrument, Timer
from ingest.sdk.sender import HEALTH_PREFIX, LOG, METRIC, RAW, SdkStats, Sender, envelope_head
from ingest.sdk.spool import Spool, spool_directory

_open_clients: weakref.WeakSet[Client] = weakref.WeakSet()
_orphaned_producers: list[Any] = []   # parents' producers inherited by a fork child: never destroyed


class Client:
    """Emits metric and log events for one app on one device (default: the host name).

    Settings come from the shared config's ``[sdk]`` section (``load_config()`` unless ``config`` is given).
    ``clock`` returns the device clock in Unix ms; override it to simulate a device whose clock is off.
    """

    def __init__(self, app: str, device: str | None = None, *, config: Config | None = None,
                 clock: Callable[[], int] = now_ms) -> None:
        self.config = config or load_config()
        self.app = app
        self.device = device or socket.gethostname()
        self.clock = clock
        # With the default clock the hot path reads time.time_ns itself and the sender converts to ms.
        self._now, self._units_per_ms = (time.time_ns, 1_000_000) if clock is now_ms else (clock, 1)
        self._buffer = EventBuffer(self.config.sdk.buffer_capacity, self.config.sdk.overflow_policy)
        self._log_heads: dict[str, str] = {}
        self._instruments: dict[tuple[type, str, tuple[tuple[str, str], ...]], Any] = {}
        self._closed = False
        self._start()
        _open_clients.add(self)

    def _start(self) -> None:
        sdk = self.config.sdk
        self._spool = Spool(spool_directory(self.config.spool_dir, self.app, self.device),
                            sdk.spool_max_bytes, sdk.spool_segment_bytes)
        self._last_health = self._health_counts()
        self._sender = Sender(self.config, self._buffer, self._spool, self.device, self.clock,
                              self._health_events if sdk.health_interval_s > 0 else None, self._units_per_ms)

    # Instruments -----------------------------------------------------------------------------------------
    def _instrument(self, cls: type[Instrument], name: str, tags: Mapping[str, str] | None) -> Any:
        key = (cls, name, tuple(sorted((tags or {}).items())))
        instrument = self._instruments.get(key)
        if instrument is None:
            head = envelope_head("metric", self.app, self.device, name)
            instrument = self._instruments.setdefault(key, cls(self._buffer, self._now, head, name, tags))
        return instrument

    def counter(self, name: str, *, tags: Mapping[str, str] | None = None) -> Counter:
        return self._instrument(Counter, name, tags)

    def gauge(self, name: str, *, tags: Mapping[str, str] | None = None) -> Gauge:
        return self._instrument(Gauge, name, tags)

    def histogram(self, name: str, *, tags: Mapping[str, str] | None = None) -> Histogram:
        return self._instrument(Histogram, name, tags)

    def timer(self, name: str, *, tags: Mapping[str, str] | None = None) -> Timer:
        """A timer observing milliseconds; nests and may be shared across threads."""
        return self._instrument(Timer, name, tags)

    def metric(self, name: str, value: float, *, user: str | None = None,
               tags: Mapping[str, str] | None = None, event_time: int | None = None) -> None:
        """One metric observation; ``event_time`` (device-clock ms) defaults to now."""
        if not isfinite(value):
            raise ValueError(f"{name}: value must be finite, not {value!r}")
        self._buffer.put((METRIC, envelope_head("metric", self.app, self.device, name), value,
                          self._event_time(event_time), user, tags))

    def log(self, level: str, message: str, *, name: str = "app", user: str | None = None,
            event_time: int | None = None, **tags: str) -> None:
        """One log line at ``level`` (debug, info, warning, error, critical) from logger ``name``."""
        if level not in LEVELS:
            raise ValueError(f"level must be one of {', '.join(LEVELS)}, not {level!r}")
        head = self._log_heads.get(name)
        if head is None:
            head = self._log_heads.setdefault(name, envelope_head("log", self.app, self.device, name))
        self._buffer.put((LOG, head, (level, str(message)), self._event_time(event_time), user, tags or None))

    def _event_time(self, event_time_ms: int | None) -> int:
        """An event time in the buffer's unit (see ``_now``)."""
        return self._now() if event_time_ms is None else event_time_ms * self._units_per_ms

    def send_raw(self, value: bytes) -> None:
        """Send an already-encoded record as is, keyed by this device (tests and the demo send malformed input)."""
        self._buffer.put((RAW, None, bytes(value), 0, None, None))

    def logging_handler(self, level: int = logging.NOTSET) -> EventHandler:
        """A ``logging.Handler`` sending records as log events through this client."""
        return EventHandler(self, level)

    # Health ----------------------------------------------------------------------------------------------
    def stats(self) -> SdkStats:
        """Exact counters: accepted, dropped by reason, produced, acknowledged, spooled, replayed."""
        b, s, spool = self._buffer, self._sender, self._spool
        accepted, depth = b.counts()
        return SdkStats(enqueued=accepted, queue_depth=depth, dropped_oldest=b.dropped_oldest,
                        dropped_newest=b.dropped_newest, dropped_spool_full=spool.dropped_full,
                        send_errors=s.send_errors, produced=s.produced, acknowledged=s.acknowledged(),
                        spooled=s.spooled, replayed=s.replayed, spool_bytes=spool.size_bytes, online=s.online,
                        blocked_puts=b.blocked_puts, dropped_spool_error=spool.dropped_error,
                        spool_torn_lines=spool.torn_lines)

    def _health_counts(self) -> dict[str, int]:
        b, spool = self._buffer, self._spool
        sender = getattr(self, "_sender", None)
        return {"overflow": b.dropped_oldest + b.dropped_newest, "spool_full": spool.dropped_full,
                "spool_error": spool.dropped_error, "send_error": sender.send_errors if sender else 0}

    def _health_events(self) -> list[tuple[Any, ...]]:
        """Buffer items for the SDK's own metrics: gauges now, drops since the previous report."""
        now = self._now()
        counts, last = self._health_counts(), self._last_health
        self._last_health = counts
        gauges = {"queue_depth": len(self._buffer), "spool_bytes": self._spool.size_bytes}
        items = [(METRIC, envelope_head("metric", self.app, self.device, HEALTH_PREFIX + name), float(value), now,
                  None, None) for name, value in gauges.items()]
        items += [(METRIC, envelope_head("metric", self.app, self.device, HEALTH_PREFIX + "dropped"),
                   float(counts[reason] - last[reason]), now, None, {"reason": reason}) for reason in counts]
        return items

    # Lifecycle -------------------------------------------------------------------------------------------
    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every event recorded so far is acknowledged by Kafka (True), or, while Kafka is
        unreachable, safely in the spool (False); False as well if ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        probe: int | None = None
        while time.monotonic() < deadline:
            sender = self._sender
            # Read before the state: once the probe is answered, a reachable broker already shows as replaying.
            answered = probe is not None and sender.probe_answered(probe)
            if sender.idle() and (sender.online or not sender.replaying):
                if sender.online:
                    return True
                # Everything is spooled, but "offline" may be older than the broker's return (the sender only
                # probes every reconnect_probe_s): say unreachable only once a probe asked for now has failed.
                if probe is None:
                    probe = sender.request_probe()
                elif answered:
                    return False
            self._sender.wake()     # the sender serves delivery reports when it wakes
            time.sleep(0.002)
        return False

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush, then stop the sender; what Kafka has not acknowledged by then is kept in the spool."""
        if self._closed:
            return
        self._closed = True
        self._sender.close(timeout_s)
        _open_clients.discard(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _restart_after_fork(self) -> None:
        # The parent's sender thread does not exist here and librdkafka is not fork-safe: start afresh, and
        # keep the parent's producer referenced forever so it is never torn down from this process.
        _orphaned_producers.append(self._sender.orphan())
        self._spool.forget_after_fork()
        self._buffer.reset_after_fork()
        self._start()


class EventHandler(logging.Handler):
    """A ``logging.Handler`` that turns log records into log events (logger name → ``name``)."""

    _LEVELS = ((logging.CRITICAL, "critical"), (logging.ERROR, "error"), (logging.WARNING, "warning"),
               (logging.INFO, "info"))

    def __init__(self, client: Client, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.client = client

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = next((name for number, name in self._LEVELS if record.levelno >= number), "debug")
            user = getattr(record, "user", None)
            self.client.log(level, self.format(record), name=record.name, user=user)
        except Exception:
            self.handleError(record)


def _after_fork_in_child() -> None:
    for client in list(_open_clients):
        if not client._closed:
            client._restart_after_fork()


def _close_all_at_exit() -> None:
    for client in list(_open_clients):
        client.close(timeout_s=5.0)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all_at_exit)
