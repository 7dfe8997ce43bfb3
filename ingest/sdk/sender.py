"""The SDK's background sender: buffer → v1 envelopes → Kafka, or the offline spool while Kafka is unreachable.

One thread per client. Each round it takes a batch from the :class:`~ingest.sdk.buffer.EventBuffer`, encodes it and
hands it to confluent-kafka's producer (``acks=all``, idempotent, compressed). ``sent_time`` is stamped right
there, at hand-off to the transport, so an event replayed from the spool hours later carries its real send time
and the stream job's clock correction (``received_time − sent_time``) stays right.

States: **online** (produce), **offline** (every broker is down: spool, probe now and then), **replaying** (the
broker is back and the spool is not empty: new events keep going to the spool tail while chunks from its head
are produced and committed once acknowledged, so events leave in the order they were made).

Only this thread calls the producer's ``poll``/``flush``, so delivery reports, error callbacks and spool writes
all happen here; the application's threads only touch the buffer.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, Producer

from eventide.config import Config
from eventide.envelope import ENVELOPE_VERSION
from ingest.sdk.buffer import EventBuffer
from ingest.sdk.spool import Spool

log = logging.getLogger("ingest.sdk.sender")

# Buffer items are tuples (code, head, payload, event_time_ms, user, tags); see ``ingest.sdk``.
METRIC: Final = 0
LOG: Final = 1
RAW: Final = 2
RAW_SPOOL_PREFIX: Final = b"~"          # spooled raw records are hex-encoded after this marker

HEALTH_PREFIX: Final = "eventide.sdk."
_SPOOL_CHUNK_LINES: Final = 5_000
_ENCODING_CACHE_SIZE: Final = 10_000
_SENT_TIME_CHUNK: Final = 512        # events per clock read: sent_time stays within about a millisecond
_SENT_TIME_MARK: Final = b',"sent_time":'
_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}
_RETRIABLE_LOCAL = {KafkaError._MSG_TIMED_OUT, KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT,
                    KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT}


def envelope_head(kind: str, app: str, device: str, name: str) -> str:
    """The constant part of every envelope of one series, JSON-encoded once per instrument."""
    return f'"kind":"{kind}","app":{encode_basestring(app)},"device":{encode_basestring(device)},' \
           f'"name":{encode_basestring(name)}'


@dataclass(frozen=True)
class SdkStats:
    """Exact counts since the client started (or since ``fork``, in a child process)."""

    enqueued: int
    """Events the buffer accepted from the application."""
    queue_depth: int
    dropped_oldest: int
    dropped_newest: int
    dropped_spool_full: int
    """Events the spool refused: it reached ``sdk.spool_max_bytes``, or the disk was full (``ENOSPC``, a quota,
    the file-size limit); such a write is taken back whole, never left as a torn line."""
    send_errors: int
    """Events Kafka rejected for good (e.g. too large for the broker); dropped."""
    produced: int
    """Hand-offs to the Kafka producer, replays included."""
    acknowledged: int
    spooled: int
    replayed: int
    spool_bytes: int
    online: bool
    blocked_puts: int
    dropped_spool_error: int = 0
    """Events whose spool write failed otherwise (an I/O error, a read-only file system); taken back whole."""
    spool_torn_lines: int = 0
    """Torn or damaged spool lines skipped on replay, left by a process killed mid-write or a power loss. Not
    part of ``dropped``: they were counted as ``spooled`` by the process that wrote them."""

    @property
    def dropped(self) -> int:
        return self.dropped_oldest + self.dropped_newest + self.dropped_spool_full + self.dropped_spool_error + \
            self.send_errors


class Sender:
    """Owns the producer, the spool and the thread that moves events from the buffer to Kafka."""

    def __init__(self, config: Config, buffer: EventBuffer, spool: Spool, device: str,
                 clock: Callable[[], int], health: Callable[[], list[tuple[Any, ...]]] | None,
                 time_units_per_ms: int = 1) -> None:
        """``time_units_per_ms``: buffered event times are in ms, or in ns (1_000_000) when the client reads
        ``time.time_ns`` directly on the hot path."""
        sdk = config.sdk
        self.config = config
        self.topic = config.kafka.events_topic
        self.key = device.encode()
        self.buffer = buffer
        self.spool = spool
        self.clock = clock
        self.time_units_per_ms = time_units_per_ms
        self._health = health
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._all_brokers_down = False
        self.online = spool.is_empty()
        self._replaying = not self.online
        self._next_probe = 0.0
        self._probe_now = False          # Client.flush asked for a probe without waiting for _next_probe
        self._probes_started = self._probes_done = 0
        self._in_hand = 0
        self._chunk_failures: list[bytes] | None = None     # while a spool chunk is replayed: its failed lines
        self._users: dict[object, str] = {}
        self._tag_sets: dict[tuple[tuple[Any, Any], ...], str] = {}
        self.produced = self.acknowledged_failed = self.send_errors = self.spooled = self.replayed = 0
        self._next_health = time.monotonic() + sdk.health_interval_s
        self._producer = Producer({
            "bootstrap.servers": config.kafka.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": sdk.compression,
            "linger.ms": sdk.linger_ms,
            "message.timeout.ms": int(sdk.delivery_timeout_s * 1000),
            "queue.buffering.max.messages": max(4 * sdk.batch_size, 100_000),
            "delivery.report.only.error": True,    # success is counted as produced − failed − still queued
            "on_delivery": self._on_delivery,
            "error_cb": self._on_error,
            "logger": log,        # librdkafka logs via logging, only when polled: quiet once closed
        })
        self._thread = threading.Thread(target=self._run, name="eventide-sender", daemon=True)
        self._thread.start()

    # Counters --------------------------------------------------------------------------------------------
    def in_flight(self) -> int:
        return len(self._producer)

    def acknowledged(self) -> int:
        # Exact when the producer is idle; during a purge a record can leave the queue before its report.
        return max(0, self.produced - self.acknowledged_failed - len(self._producer))

    @property
    def replaying(self) -> bool:
        """The broker is back and the spool is being sent."""
        return self._replaying

    def idle(self) -> bool:
        """Nothing in the buffer, nothing being encoded, nothing waiting for Kafka."""
        return not len(self.buffer) and not self._in_hand and not len(self._producer)

    # Thread ----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        batch_size = self.config.sdk.batch_size
        idle_s = max(self.config.sdk.linger_ms, 5) / 1000
        while not self._stop.is_set():
            try:
                batch = self.buffer.take(batch_size)
                if not batch:
                    # Polling keeps the application's put lock-free; flush() and close() wake us early.
                    self._wake.wait(idle_s)
                    self._wake.clear()
                self._round(batch)
            except Exception:  # never let the sender die silently: the app would buffer forever
                log.exception("eventide sender round failed; retrying")
                time.sleep(0.5)

    def wake(self) -> None:
        self._wake.set()

    def _round(self, batch: list[tuple[Any, ...]]) -> None:
        self._in_hand = len(batch)
        try:
            if self.online and self._brokers_down():
                self._go_offline()
            if batch:
                if self.online:
                    self._produce(self._bodies(batch))
                else:
                    self._to_spool(self._bodies(batch))
            self._producer.poll(0)
            if self.online and not self._all_brokers_down and self.spool.size_bytes:
                # Deliveries failed (timed out) while the broker looked reachable and went to the spool:
                # route new events behind them and replay, to keep order.
                self.online, self._replaying = False, True
        finally:
            self._in_hand = 0
        if not self.online:
            self._offline_step()
        if self._health is not None and time.monotonic() >= self._next_health:
            self._next_health = time.monotonic() + self.config.sdk.health_interval_s
            for item in self._health():
                self.buffer.put_unbounded(item)

    def _go_offline(self, in_flight: bool = True) -> None:
        log.warning("Kafka unreachable at %s: spooling events to %s", self.config.kafka.bootstrap,
                    self.spool.directory)
        self.online = False
        self._replaying = False
        self._next_probe = time.monotonic() + self.config.sdk.reconnect_probe_s
        # Records queued or in flight are older than anything still in the buffer: spool them first. In flight too
        # (``in_flight``): the down broker cannot answer them, and their failures would come (and be spooled) only
        # at their timeout, after newer events. Unanswered, they may reach Kafka twice (same id). Blocking:
        # otherwise the broker threads purge later, with the same effect.
        self._producer.purge(in_queue=True, in_flight=in_flight, blocking=True)
        self._producer.poll(0)

    def _offline_step(self) -> None:
        if not self._replaying:
            if not self._probe_now and time.monotonic() < self._next_probe:
                return
            self._probe_now = False
            self._next_probe = time.monotonic() + self.config.sdk.reconnect_probe_s
            self._probes_started += 1
            reachable = self._broker_reachable()
            if reachable:
                log.warning("Kafka reachable again: replaying the spool")
                self._all_brokers_down = False
                self._replaying = True
            self._probes_done += 1      # after the state change: see probe_answered
            if not reachable:
                return
        self._replay_chunk()

    def request_probe(self) -> int:
        """Have the offline sender probe the broker at its next round instead of after ``reconnect_probe_s``.

        Returns a ticket for :meth:`probe_answered`. Only a probe that starts after this call counts: one already
        under way may have been sent before the broker came back.
        """
        ticket = self._probes_started + 1       # read before raising the flag (the flag may start probe k+1)
        self._probe_now = True
        self.wake()
        return ticket

    def probe_answered(self, ticket: int) -> bool:
        """The probe of ``ticket`` has finished: if it reached the broker, ``replaying`` is already True."""
        return self._probes_done >= ticket

    def _broker_reachable(self) -> bool:
        try:
            self._producer.list_topics(self.topic, timeout=min(1.0, self.config.sdk.reconnect_probe_s))
        except KafkaException:
            return False
        return True

    def _brokers_down(self) -> bool:
        """librdkafka reported every broker down since the last check, and a metadata request confirms it.

        ``_ALL_BROKERS_DOWN`` is informational and can be transient. Once a metadata response names the
        cluster's brokers, librdkafka (seen with 2.12) retires its bootstrap connection; if that was the only
        connection up, it reports all brokers down, although the named broker connects a millisecond later.
        That is exactly what happens after a broker restart, during the first replay chunk, and trusting it sent
        the chunk back to the spool and the sender offline with the broker up. A probe tells the two apart; in a
        real outage it delays spooling by one probe timeout, while the buffer holds new events.
        """
        if not self._all_brokers_down:
            return False
        if self._broker_reachable():
            log.info("librdkafka reported all brokers down, but %s answers: carrying on",
                     self.config.kafka.bootstrap)
            self._all_brokers_down = False
            return False
        return True

    def _replay_chunk(self) -> None:
        chunk = self.spool.read(_SPOOL_CHUNK_LINES)
        if chunk is None:           # spool drained (segments of other live processes are theirs to replay)
            self.online, self._replaying = True, False
            return
        # The chunk's unacknowledged lines go back to the spool's head, in their order, not to its tail: newer
        # events may have been spooled meanwhile.
        self._chunk_failures = []
        try:
            self._produce(chunk.lines)
            self.replayed += len(chunk.lines)
            deadline = time.monotonic() + self.config.sdk.delivery_timeout_s
            while len(self._producer) and time.monotonic() < deadline:
                self._producer.flush(0.1)
                if self._brokers_down():
                    # The chunk's queued lines fail now, into the list. Its lines in flight are waited for: the
                    # broker may have them (a restart can look like an outage for a moment), and each failed line
                    # goes back to the spool's head anyway, in order, so purging them would only risk a second copy
                    # of an event recorded while Kafka was away.
                    self._go_offline(in_flight=False)
                    self._producer.flush(max(0.0, deadline - time.monotonic()))
                    break
            failed = set(self._chunk_failures)
        finally:
            self._chunk_failures = None
        self.spooled += self.spool.put_back(chunk, [line for line in chunk.lines if line in failed])
        self.spool.commit(chunk)    # every line is now acknowledged or back in the spool

    # Encoding and hand-off -------------------------------------------------------------------------------
    def _bodies(self, batch: list[tuple[Any, ...]]) -> list[bytes]:
        """Envelopes without their closing ``sent_time`` (added at hand-off): the form the spool stores.

        Ids are UUIDv7: the event's ms, version 7, variant 10, then 72 random bits (RFC 9562 allows fixing the
        two bits after the variant). The id prefix is reused while consecutive events share a millisecond.
        """
        random_hex = os.urandom(9 * len(batch)).hex()
        units = self.time_units_per_ms
        last_t, prefix = -1, ""
        users, tag_sets = self._users, self._tag_sets
        bodies = []
        append = bodies.append
        for i, (code, head, payload, t, user, tags) in enumerate(batch):
            if code == RAW:
                append(RAW_SPOOL_PREFIX + payload.hex().encode())
                continue
            if units != 1:
                t //= units
            if t != last_t:
                th = f"{t:012x}"
                last_t, prefix = t, f'{{"v":{ENVELOPE_VERSION},"id":"{th[:8]}-{th[8:]}-7'
            r = random_hex[18 * i:18 * i + 18]
            if code == METRIC:
                body = f'{prefix}{r[:3]}-8{r[3:6]}-{r[6:]}",{head},"value":{float(payload)!r}'
            else:
                body = f'{prefix}{r[:3]}-8{r[3:6]}-{r[6:]}",{head},"level":"{payload[0]}",' \
                       f'"message":{encode_basestring(payload[1])}'
            if user is not None:
                body += users.get(user) or self._encode_user(user)
            if tags:
                key = tuple(tags.items())
                try:
                    body += tag_sets.get(key) or self._encode_tags(key)
                except TypeError:       # an unhashable tag value: stringified, not cached
                    body += self._encode_tags(key, cache=False)
            append(f'{body},"event_time":{t}'.encode())
        return bodies

    # Users and tag sets repeat: their JSON is cached (bounded; cleared when full).
    def _encode_user(self, user: object) -> str:
        if len(self._users) >= _ENCODING_CACHE_SIZE:
            self._users.clear()
        encoded = self._users[user] = ',"user":' + encode_basestring(str(user))
        return encoded

    def _encode_tags(self, items: tuple[tuple[Any, Any], ...], cache: bool = True) -> str:
        encoded = ',"tags":' + json.dumps({str(k): str(v) for k, v in items}, separators=(",", ":"))
        if cache:
            if len(self._tag_sets) >= _ENCODING_CACHE_SIZE:
                self._tag_sets.clear()
            self._tag_sets[items] = encoded
        return encoded

    def _produce(self, bodies: list[bytes]) -> None:
        """Hand envelope bodies (or spooled raw records) to the producer, closing each with ``sent_time``."""
        produce, topic, key, poll = self._producer.produce, self.topic, self.key, self._producer.poll
        for start in range(0, len(bodies), _SENT_TIME_CHUNK):
            sent_time = self.clock()
            tail = b"%b%d}" % (_SENT_TIME_MARK, sent_time)
            for body in bodies[start:start + _SENT_TIME_CHUNK]:
                if body[-14:-13] != b":" or body[:1] == RAW_SPOOL_PREFIX:
                    value = self._close_envelope(body, sent_time)   # not a plain 13-digit event_time
                else:
                    # event_time is the body's last 13 digits; a device clock never sends before it stamps.
                    value = body + tail if int(body[-13:]) <= sent_time else self._close_envelope(body, sent_time)
                while True:
                    try:
                        produce(topic, value, key)
                        break
                    except BufferError:   # librdkafka's queue is full: let it drain
                        poll(0.05)
        self.produced += len(bodies)

    @staticmethod
    def _close_envelope(body: bytes, sent_time: int) -> bytes:
        if body[:1] == RAW_SPOOL_PREFIX:
            return bytes.fromhex(body[1:].decode())
        event_time = int(body[body.rindex(b":") + 1:])
        return body + b"%b%d}" % (_SENT_TIME_MARK, max(sent_time, event_time))

    def _to_spool(self, bodies: list[bytes]) -> None:
        self.spooled += self.spool.append(bodies)

    # librdkafka callbacks (run inside poll/flush, i.e. on this thread) -------------------------------------
    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is None:
            return
        self.acknowledged_failed += 1
        value: bytes = msg.value()
        if err.code() in _RETRIABLE_LOCAL or err.retriable():
            mark = value.rfind(_SENT_TIME_MARK)
            body = value[:mark] if mark > 0 and value.startswith(b"{") else RAW_SPOOL_PREFIX + value.hex().encode()
            if self._chunk_failures is not None:
                self._chunk_failures.append(body)   # a replayed line: _replay_chunk puts it back in order
            else:
                self._to_spool([body])
        else:
            self.send_errors += 1
            log.error("Kafka rejected an event for good (%s); dropped", err)

    def _on_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            self._all_brokers_down = True
        elif err.fatal():
            log.error("Kafka producer fatal error: %s", err)

    # Lifecycle -------------------------------------------------------------------------------------------
    def close(self, timeout_s: float) -> None:
        """Send what is buffered; whatever Kafka has not acknowledged by the deadline goes to the spool."""
        deadline = time.monotonic() + timeout_s
        if self._health is not None:        # a last report, so the health metrics add up to the final counts
            for item in self._health():
                self.buffer.put_unbounded(item)
        self.buffer.wait_empty(deadline)
        self._stop.set()
        self._wake.set()
        self._thread.join(max(0.0, deadline - time.monotonic()) + 1.0)
        self._round(self.buffer.take(len(self.buffer) + 1))     # anything put after the last round
        while len(self._producer) and time.monotonic() < deadline and not self._all_brokers_down:
            self._producer.flush(0.1)
        self._producer.purge(in_queue=True, in_flight=True, blocking=True)
        self._producer.poll(0)
        self.spool.close()

    def orphan(self) -> Producer:
        """After ``fork``: the parent's producer (its threads do not exist here; never use or destroy it)."""
        return self._producer
