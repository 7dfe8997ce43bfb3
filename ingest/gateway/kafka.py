"""The gateway's Kafka writer: a pool of transactional producers (one transaction per request, answered only
once Kafka acknowledged its commit or the abort said what was written) and a cached broker probe."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any, Final, Literal

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from fastapi.responses import JSONResponse

from eventide.config import Config
from ingest.gateway.wire import BrokerHealth, Unavailable

log = logging.getLogger("eventide.gateway")

HEALTH_TTL_S: Final = 1.0
"""How long a broker probe result is reused: health checks and requests cost at most one probe a second."""
HEALTH_TIMEOUT_S: Final = 1.0
RETRY_AFTER_UNREACHABLE_S: Final = 5
RETRY_AFTER_BUSY_S: Final = 1
RETRY_AFTER_FAILED_S: Final = 2
ABORT_TIMEOUT_S: Final = 2.0
"""An abort only decides between written "nothing" and "unknown"; a failed one replaces the producer."""


class KafkaUnavailable(Exception):
    """Kafka did not take a batch; ``written`` says whether any of it may be visible."""

    def __init__(self, detail: str, written: Literal["nothing", "unknown"] = "nothing",
                 retry_after_s: int = RETRY_AFTER_FAILED_S) -> None:
        super().__init__(detail)
        self.detail, self.written, self.retry_after_s = detail, written, retry_after_s

    def response(self) -> JSONResponse:
        body = Unavailable(detail=self.detail, written=self.written)
        return JSONResponse(body.model_dump(), 503, headers={"Retry-After": str(self.retry_after_s)})


class _DeadlinePassed(Exception):
    pass


def _kafka_error(exc: BaseException) -> KafkaError | None:
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return error if isinstance(error, KafkaError) else None


def _describe(exc: BaseException) -> str:
    error = _kafka_error(exc)
    return f"{error.name()}: {error.str()}" if error is not None else str(exc) or type(exc).__name__


class _Slot:
    """One transactional producer, created and initialised lazily so the gateway starts without a broker."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.producer: Producer | None = None
        self.ready = False

    def open(self, timeout_s: float) -> Producer:
        if self.producer is None:
            self.producer = Producer(self.settings)
        if not self.ready:
            # A timed-out init_transactions may be called again on the same producer (librdkafka), so a
            # broker that is down only delays the slot; the next request retries.
            self.producer.init_transactions(max(timeout_s, 0.1))
            self.ready = True
        return self.producer

    def discard(self) -> None:
        """Drop the producer; the next use makes a new one with the same ``transactional.id``, whose
        ``init_transactions`` fences this one and settles any transaction it left open."""
        producer, self.producer, self.ready = self.producer, None, False
        if producer is not None:
            try:
                producer.purge()
            except (KafkaException, RuntimeError) as exc:
                log.debug("purge of a discarded producer failed: %s", exc)


class TransactionalProducers:
    """``gateway.producers`` transactional producers; each request takes one for its transaction.

    ``transactional.id`` is unique per gateway process and slot (host, pid, random suffix), so two gateways
    never fence each other. The price: a gateway that dies mid-transaction leaves it open until the broker
    times it out (``transaction.timeout.ms``, set just above ``ack_timeout_s``), and until then
    ``read_committed`` readers of its partitions wait. A transaction never legitimately lasts longer than the
    ack timeout, so a short transaction timeout costs nothing.
    """

    def __init__(self, config: Config) -> None:
        gw = config.gateway
        self._topic = config.kafka.events_topic
        self._ack_timeout_s = gw.ack_timeout_s
        prefix = f"eventide-gateway-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        kafka_log = logging.getLogger("eventide.gateway.kafka")
        self._slots = [_Slot({
            "bootstrap.servers": config.kafka.bootstrap,
            "transactional.id": f"{prefix}-{i}",
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "lz4",
            # A commit flushes at once; linger only groups records produced in the same few ms.
            "linger.ms": 5,
            "transaction.timeout.ms": int(gw.ack_timeout_s * 1000) + 5000,
            "logger": kafka_log,
        }) for i in range(gw.producers)]
        self._idle: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        for slot in self._slots:
            self._idle.put(slot)
        self._closed = threading.Event()

    @property
    def size(self) -> int:
        return len(self._slots)

    @property
    def ready(self) -> int:
        return sum(slot.ready for slot in self._slots)

    def warm_up(self) -> None:
        """Initialise every idle producer now, so the first requests do not pay for it (best effort)."""
        for _ in range(self.size):
            if self._closed.is_set():
                return
            try:
                slot = self._idle.get_nowait()
            except queue.Empty:
                return
            try:
                slot.open(self._ack_timeout_s)
            except KafkaException as exc:
                log.warning("producer not ready yet (%s); retried on the next request", _describe(exc))
                if (error := _kafka_error(exc)) is not None and error.fatal():
                    slot.discard()
            finally:
                self._idle.put(slot)

    def write(self, records: Sequence[tuple[bytes, bytes]], timeout_s: float | None = None) -> None:
        """Write ``records`` (key, value) to the events topic in one transaction, within ``timeout_s``
        (default ``ack_timeout_s``). Blocking.

        Returns once the commit is acknowledged. Raises :class:`KafkaUnavailable` otherwise, after aborting.
        """
        timeout_s = self._ack_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        try:
            slot = self._idle.get(timeout=timeout_s)
        except queue.Empty:
            raise KafkaUnavailable(f"all {self.size} Kafka producers stayed busy for {timeout_s:.1f}s",
                                   retry_after_s=RETRY_AFTER_BUSY_S) from None
        try:
            self._transaction(slot, records, deadline)
        finally:
            self._idle.put(slot)

    def _transaction(self, slot: _Slot, records: Sequence[tuple[bytes, bytes]], deadline: float) -> None:
        try:
            producer = slot.open(deadline - time.monotonic())
        except KafkaException as exc:
            if (error := _kafka_error(exc)) is not None and error.fatal():
                slot.discard()
            raise KafkaUnavailable(f"Kafka producer not ready: {_describe(exc)}") from exc
        committing = False
        try:
            producer.begin_transaction()
            for key, value in records:
                self._produce(producer, key, value, deadline)
            # Flush first, so a timeout here is known to come before the commit request: then the transaction
            # cannot have been committed, whatever happens to the abort.
            if producer.flush(max(deadline - time.monotonic(), 0)) > 0:
                raise _DeadlinePassed(f"Kafka did not acknowledge the records within {self._ack_timeout_s}s")
            committing = True
            self._commit(producer, deadline)
        except (KafkaException, _DeadlinePassed) as exc:
            aborted = self._abort(slot, producer, exc)
            error = _kafka_error(exc)
            fatal = error is not None and error.fatal()
            written: Literal["nothing", "unknown"] = "unknown" if committing and not aborted and not fatal \
                else "nothing"
            raise KafkaUnavailable(f"Kafka transaction failed: {_describe(exc)}", written) from exc

    def _produce(self, producer: Producer, key: bytes, value: bytes, deadline: float) -> None:
        while True:
            try:
                producer.produce(self._topic, value=value, key=key)
                return
            except BufferError:  # local queue full: let deliveries drain it
                if time.monotonic() >= deadline:
                    raise _DeadlinePassed("the producer queue stayed full until the ack timeout") from None
                producer.poll(0.05)

    def _commit(self, producer: Producer, deadline: float) -> None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _DeadlinePassed(f"Kafka did not confirm the commit within {self._ack_timeout_s}s")
            try:
                producer.commit_transaction(remaining)
                return
            except KafkaException as exc:
                error = _kafka_error(exc)
                if error is None or not error.retriable():
                    raise
                time.sleep(0.05)  # a retriable error may come back at once: no busy loop

    @staticmethod
    def _abort(slot: _Slot, producer: Producer, cause: BaseException) -> bool:
        """Abort the open transaction; True when Kafka confirmed it. Otherwise the producer is replaced."""
        error = _kafka_error(cause)
        if error is not None and error.fatal():
            slot.discard()
            return False
        try:
            producer.abort_transaction(ABORT_TIMEOUT_S)
            return True
        except KafkaException as exc:
            log.warning("abort failed (%s); replacing the producer", _describe(exc))
            slot.discard()
            return False

    def close(self, timeout_s: float = 5.0) -> None:
        """Release every producer (waiting up to ``timeout_s`` for batches in flight)."""
        self._closed.set()
        deadline = time.monotonic() + timeout_s
        for _ in self._slots:
            try:
                slot = self._idle.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if slot.producer is not None:
                slot.producer.flush(0)
            slot.producer, slot.ready = None, False


class BrokerProbe:
    """Broker reachability from a cheap metadata request, cached for ``HEALTH_TTL_S``."""

    def __init__(self, config: Config) -> None:
        self._bootstrap = config.kafka.bootstrap
        self._topic = config.kafka.events_topic
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()
        self._cached: tuple[float, BrokerHealth] | None = None

    def status(self) -> BrokerHealth:
        """The broker's state, probed at most once per ``HEALTH_TTL_S`` (blocking: call from a thread)."""
        with self._lock:  # concurrent callers wait for one probe instead of each sending their own
            if self._cached is not None and time.monotonic() - self._cached[0] < HEALTH_TTL_S:
                return self._cached[1]
            status = self._probe()
            self._cached = (time.monotonic(), status)
            return status

    def _probe(self) -> BrokerHealth:
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self._bootstrap,
                                       "socket.timeout.ms": int(HEALTH_TIMEOUT_S * 1000),
                                       "logger": logging.getLogger("eventide.gateway.kafka")})
        base = {"bootstrap": self._bootstrap, "events_topic": self._topic}
        try:
            meta = self._admin.list_topics(topic=self._topic, timeout=HEALTH_TIMEOUT_S)
        except KafkaException as exc:
            return BrokerHealth(**base, reachable=False, events_topic_exists=False, detail=_describe(exc))
        topic = meta.topics.get(self._topic)
        exists = topic is not None and topic.error is None
        problem = None if exists else f"topic {self._topic}: " + (
            topic.error.str() if topic is not None and topic.error is not None else "not found")
        return BrokerHealth(**base, reachable=bool(meta.brokers), events_topic_exists=exists, detail=problem)
