"""Alert delivery, off the evaluation loop: per channel, a thread that sends pending notifications, each with its
own attempts and deadline (what Alertmanager's notification pipeline does).

- A notification's first attempt starts its deadline (``alerting.delivery_deadline_s``); it is tried up to
  ``alerting.webhook_attempts`` times, ``webhook_backoff_s`` apart and doubling (a longer ``Retry-After`` wins),
  each attempt waiting at most ``webhook_timeout_s`` and never past the deadline.
- Transient failures (5xx, 408, 429, timeouts, resets, refused connections) are retried; a notification waiting
  for its next attempt holds up no other one, and up to ``alerting.delivery_concurrency`` attempts run at once, so
  one that hangs does not either.
- A permanent failure (a 4xx other than 408/429, a payload that cannot be encoded, attempts or deadline
  exhausted) is recorded in ``alert_delivery_failures`` with its reason and never tried again; the channel goes on.
- Order is kept per (rule, series) only: a series' ``resolved`` is not sent before its ``firing`` has been
  delivered or given up, so a receiver never sees them swapped. Other series do not wait.
- Delivered notifications are recorded in ``alert_notifications`` as before (at-least-once; the transition key is
  in every payload). After a restart, what was neither delivered nor recorded as failed is tried afresh.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Protocol

from clickhouse_connect.driver.client import Client

from alerting.dispatch import undelivered_groups
from alerting.evaluator import undelivered
from alerting.notify import Channel, EncodingError, Outcome, WebhookChannel, encode, payload
from alerting.rules import AlertRules
from eventide.config import Config
from store.client import connect

log = logging.getLogger("eventide.alerting")

NOTIFICATION_COLUMNS = ["transition_key", "channel", "attempts", "delivered_at"]
FAILURE_COLUMNS = ["transition_key", "channel", "rule", "series", "to_state", "window_end", "reason", "attempts",
                   "last_status", "failed_at"]


@dataclass
class _Notification:
    """One transition on its way through one channel."""

    row: dict[str, Any]
    payload: dict[str, Any]
    body: bytes
    attempts: int = 0
    deadline: float | None = None
    """Monotonic time; set by the first attempt."""
    next_at: float = 0.0
    in_flight: bool = False
    last: Outcome | None = None
    seq: int = 0

    @property
    def key(self) -> str:
        return str(self.row["transition_key"])

    @property
    def series(self) -> tuple[str, str]:
        return self.row["rule"], self.row["series"]


class Outbox(Protocol):
    """Where a channel's notifications come from: rows with ``transition_key`` (the notification's key), ``rule``
    and ``series`` (order is kept per pair), ``to_state`` and ``window_end`` (copied into a failure's row)."""

    def pending(self, client: Client, channel: str) -> list[dict[str, Any]]:
        """The notifications ``channel`` has neither delivered nor given up, oldest first."""
        ...

    def message(self, row: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """What the channel is handed for ``row``: its fields (``key`` identifies it, ``rule`` keys a Kafka message)
        and the body; raises :class:`EncodingError` (or ValueError) for a row that cannot be sent."""
        ...


class Transitions:
    """Every firing and resolved transition, one notification each (the webhook and Kafka channels)."""

    def pending(self, client: Client, channel: str) -> list[dict[str, Any]]:
        return undelivered(client, channel)

    def message(self, row: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        body = payload(row)
        return body, encode(body)


@dataclass(frozen=True)
class GroupNotifications:
    """The group notifications of one receiver (``alerting.dispatch``), their body as stored."""

    receiver: str

    def pending(self, client: Client, channel: str) -> list[dict[str, Any]]:
        return undelivered_groups(client, self.receiver, channel)

    def message(self, row: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        return {"key": row["transition_key"], "rule": row["series"]}, row["body"].encode("utf-8")


def receiver_deliveries(config: Config, rules: AlertRules) -> list[tuple[Channel, Outbox]]:
    """A channel and its group notifications for each ``[[receiver]]`` of ``rules`` (with the delivery settings of
    ``[alerting]``)."""
    a = config.alerting
    return [(WebhookChannel(r.target_url, a.webhook_attempts, a.webhook_backoff_s, a.webhook_timeout_s,
                            a.delivery_deadline_s, name=r.channel), GroupNotifications(r.name))
            for r in rules.receiver]


@dataclass
class _Records:
    """Rows decided but not yet stored (kept and retried while the store is away)."""

    notifications: list[list[Any]] = field(default_factory=list)
    failures: list[list[Any]] = field(default_factory=list)

    def keys(self) -> set[str]:
        return {r[0] for r in self.notifications} | {r[0] for r in self.failures}

    def __bool__(self) -> bool:
        return bool(self.notifications or self.failures)


class ChannelDelivery:
    """The pending notifications of one channel and their schedule. :meth:`drain` delivers what is pending now and
    returns; :meth:`run` keeps delivering until stopped (one thread per channel, see :class:`Delivery`)."""

    def __init__(self, config: Config, channel: Channel, clock: Callable[[], float] = time.monotonic,
                 outbox: Outbox | None = None) -> None:
        self.config, self.channel, self.policy, self.clock = config, channel, channel.policy, clock
        self.outbox = outbox or Transitions()
        self.concurrency = config.alerting.delivery_concurrency
        self.delivered = 0
        self.failed = 0
        self._pending: dict[str, _Notification] = {}
        self._in_flight: dict[Future[Outcome], _Notification] = {}
        self._records = _Records()
        self._seq = 0
        self._event = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency,
                                        thread_name_prefix=f"eventide-alert-{channel.name}")

    # Store ------------------------------------------------------------------------------------------------------
    def refresh(self) -> int:
        """Pick up the notifications this channel has neither delivered nor given up; returns how many are new."""
        with connect(self.config) as client:
            rows = self.outbox.pending(client, self.channel.name)
        known = self._pending.keys() | self._records.keys()
        new = 0
        for row in rows:
            key = row["transition_key"]
            if key in known:
                continue
            try:
                body_of, body = self.outbox.message(row)
            except (EncodingError, ValueError, KeyError, AttributeError) as exc:   # ValueError: stored labels not JSON
                self._fail_row(row, f"payload cannot be encoded: {exc}", 0, None)
                continue
            self._seq += 1
            self._pending[key] = _Notification(row, body_of, body, seq=self._seq)
            new += 1
        return new

    def _write_records(self) -> None:
        """Store the decided rows; on a store error they stay and are written on a later step."""
        if not self._records:
            return
        with connect(self.config) as client:
            if self._records.notifications:
                client.insert("alert_notifications", self._records.notifications, column_names=NOTIFICATION_COLUMNS)
                self._records.notifications = []
            if self._records.failures:
                client.insert("alert_delivery_failures", self._records.failures, column_names=FAILURE_COLUMNS)
                self._records.failures = []

    # Decisions --------------------------------------------------------------------------------------------------
    def _fail_row(self, row: dict[str, Any], reason: str, attempts: int, status: int | None) -> None:
        log.error("alert notification %r via %s given up: %s", row["transition_key"], self.channel.name, reason)
        self._records.failures.append([row["transition_key"], self.channel.name, row["rule"], row["series"],
                                       row["to_state"], row["window_end"], reason, attempts, status,
                                       datetime.now(UTC)])
        self.failed += 1

    def _fail(self, n: _Notification, reason: str) -> None:
        self._pending.pop(n.key, None)
        self._fail_row(n.row, reason, n.attempts, n.last.status if n.last else None)

    def _settle(self, n: _Notification, outcome: Outcome, now: float) -> None:
        """Record the outcome of an attempt: delivered, failed for good, or scheduled again."""
        n.in_flight, n.last = False, outcome
        if outcome.delivered:
            self._pending.pop(n.key, None)
            self._records.notifications.append([n.key, self.channel.name, n.attempts, datetime.now(UTC)])
            self.delivered += 1
            return
        if outcome.permanent:
            self._fail(n, outcome.error)
            return
        log.warning("alert notification %r via %s attempt %d/%d failed: %s", n.key, self.channel.name, n.attempts,
                    self.policy.attempts, outcome.error)
        if n.attempts >= self.policy.attempts:
            self._fail(n, f"gave up after {n.attempts} attempts; last: {outcome.error}")
            return
        delay = self.policy.backoff_s * 2 ** (n.attempts - 1)
        if outcome.retry_after_s is not None:
            delay = max(delay, outcome.retry_after_s)
        assert n.deadline is not None
        if now + delay >= n.deadline:
            self._fail(n, f"deadline of {self.policy.deadline_s:g} s reached after {n.attempts} attempts "
                          f"(next one due in {delay:g} s); last: {outcome.error}")
            return
        n.next_at = now + delay

    def _attempt(self, n: _Notification, timeout_s: float) -> Outcome:
        try:
            return self.channel.attempt(n.payload, n.body, timeout_s)
        except Exception as exc:     # a channel bug must not end the thread: treat it as a transient failure
            log.exception("alert channel %s raised", self.channel.name)
            return Outcome(False, error=f"{type(exc).__name__}: {exc}")

    def step(self) -> float:
        """Settle finished attempts, store what was decided, start the attempts that are due. Returns the seconds
        until the next attempt is due (``inf``: nothing waits for time)."""
        now = self.clock()
        for future in [f for f in self._in_flight if f.done()]:
            n = self._in_flight.pop(future)
            self._settle(n, future.result(), now)
        self._write_records()
        heads: dict[tuple[str, str], _Notification] = {}
        for n in sorted(self._pending.values(), key=lambda n: (n.row["window_end"], n.seq)):
            heads.setdefault(n.series, n)       # the oldest of each series goes first; the rest wait for it
        wait = float("inf")
        for n in heads.values():
            if n.in_flight:
                continue
            if n.next_at > now:
                wait = min(wait, n.next_at - now)
                continue
            if len(self._in_flight) >= self.concurrency:
                wait = min(wait, 1.0)    # woken earlier when an attempt finishes
                break
            if n.deadline is None:
                n.deadline = now + self.policy.deadline_s
            remaining = n.deadline - now
            if remaining <= 0:
                self._fail(n, f"deadline of {self.policy.deadline_s:g} s reached after {n.attempts} attempts; "
                              f"last: {n.last.error if n.last else 'none'}")
                wait = 0.0      # the next notification of its series is due now
                continue
            n.attempts += 1
            n.in_flight = True
            future = self._pool.submit(self._attempt, n, min(self.policy.attempt_timeout_s, remaining))
            self._in_flight[future] = n
            future.add_done_callback(lambda _f: self._event.set())
        if self._records:      # decided by this step (a deadline): store it now rather than on the next wake-up
            self._write_records()
        return wait

    @property
    def busy(self) -> bool:
        """Whether anything is pending, in flight or not yet stored."""
        return bool(self._pending or self._in_flight or self._records)

    def _wait(self, seconds: float) -> None:
        self._event.wait(max(0.0, seconds))
        self._event.clear()

    # Loops ------------------------------------------------------------------------------------------------------
    def drain(self) -> int:
        """Deliver everything pending now; returns when each is delivered or recorded as failed (each within its
        deadline). Returns the number delivered. Store errors are raised."""
        self.refresh()
        while True:
            wait = self.step()
            if not self.busy:
                return self.delivered
            self._wait(min(wait, 1.0))

    def run(self, stop: threading.Event, wake: threading.Event, refresh_every_s: float) -> None:
        """Deliver until ``stop`` is set: pick up new transitions when ``wake`` is set (after each evaluation) and at
        least every ``refresh_every_s``. A store error is logged and retried."""
        next_refresh = 0.0
        while not stop.is_set():
            now = self.clock()
            if wake.is_set() or now >= next_refresh:
                wake.clear()
                next_refresh = now + refresh_every_s
                try:
                    self.refresh()
                except Exception:
                    log.exception("alert delivery via %s could not read pending notifications", self.channel.name)
            try:
                wait = self.step()
            except Exception:
                log.exception("alert delivery via %s could not record deliveries; retrying", self.channel.name)
                wait = 1.0
            if stop.is_set():
                break
            self._wait(min(wait, next_refresh - self.clock()))

    def wake(self) -> None:
        """Interrupt the current wait (a refresh or a stop is due)."""
        self._event.set()

    def close(self) -> None:
        """Stop starting attempts; an attempt in flight is left to its timeout (its thread is not joined)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> ChannelDelivery:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


class Delivery:
    """One delivery thread per channel beside the evaluation loop: :meth:`wake` after each evaluation."""

    def __init__(self, config: Config, targets: list[Channel], refresh_every_s: float | None = None,
                 receivers: Sequence[tuple[Channel, Outbox]] = ()) -> None:
        self.refresh_every_s = refresh_every_s or config.alerting.evaluation_interval_s
        self.senders = [ChannelDelivery(config, channel) for channel in targets] + [
            ChannelDelivery(config, channel, outbox=outbox) for channel, outbox in receivers]
        self._stop = threading.Event()
        self._wakes = [threading.Event() for _ in self.senders]
        self._threads = [threading.Thread(target=s.run, args=(self._stop, w, self.refresh_every_s), daemon=True,
                                          name=f"eventide-alert-delivery-{s.channel.name}")
                         for s, w in zip(self.senders, self._wakes, strict=True)]

    def start(self) -> Delivery:
        for thread in self._threads:
            thread.start()
        return self

    def wake(self) -> None:
        """New transitions may be stored: every channel picks them up now. Never blocks."""
        for sender, wake in zip(self.senders, self._wakes, strict=True):
            wake.set()
            sender.wake()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        for sender in self.senders:
            sender.wake()
        for thread in self._threads:
            thread.join(timeout_s)
        for sender in self.senders:
            sender.close()


def deliver(config: Config, targets: list[Channel], receivers: Sequence[tuple[Channel, Outbox]] = ()) -> dict[str, int]:
    """Send every pending notification on every channel (each firing/resolved transition on ``targets``, each
    receiver's group notifications), and return when each has been delivered or recorded as failed; returns
    deliveries per channel (``eventide alerts --once`` and tests). The service runs the same delivery continuously
    in threads of its own (:class:`Delivery`)."""
    delivered: dict[str, int] = {}
    outboxes: list[tuple[Channel, Outbox | None]] = [(c, None) for c in targets] + list(receivers)
    for channel, outbox in outboxes:
        with ChannelDelivery(config, channel, outbox=outbox) as sender:
            delivered[channel.name] = sender.drain()
    return delivered
