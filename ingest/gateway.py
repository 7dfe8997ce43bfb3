"""HTTP gateway: ``POST /v1/events`` for apps that cannot use the Python SDK.

A request carries a batch of v1 envelopes (BRIEF §1) as a JSON array or as NDJSON (one object per line). The
gateway checks the bearer token and the size limits, validates every event with the stream job's rules
(:mod:`ingest.validation`), stamps ``received_time`` (server clock) on the valid ones and writes them to the
events topic in **one Kafka transaction per request**. It answers only after Kafka acknowledged the commit.

Status codes:

- ``200`` every event accepted and written; ``207`` some accepted and written, the others listed in
  ``rejected`` with their index, id and reason; ``422`` every event invalid, nothing written.
  (207 rather than 200 for a partial batch, so a client that only checks for 200 notices the rejects.)
  Besides the stream job's rules, an event is rejected for nesting deeper than ``gateway.max_depth`` (not even
  parsed), a duplicate key, a lone surrogate (``"\\ud800"``) in any string, or an app its token may not write.
- ``400`` the body is not JSON / NDJSON (parse error with line and column); nothing written.
- ``401`` missing or unknown bearer token (``WWW-Authenticate: Bearer``).
- ``408`` headers not received within ``gateway.header_timeout_s``, or the body not within
  ``gateway.receive_timeout_s``; the connection is closed.
- ``413`` body larger than ``gateway.max_body_bytes``, more events than ``gateway.max_batch_events`` or than the
  token's burst.
- ``429`` the token is over its rate (``Retry-After``, whole seconds); nothing written.
- ``503`` Kafka unreachable, busy or not acknowledging within ``gateway.ack_timeout_s`` (``Retry-After``). The
  transaction was aborted: nothing from the batch was written (``"written": "nothing"``), so retrying the
  whole batch is safe. Only when the commit itself was sent and neither its outcome nor an abort could be
  confirmed is the answer ``"written": "unknown"`` (all or nothing, never part: a transaction is atomic).

Aborted transactions leave records in the log that ``read_committed`` consumers skip; the stream job reads
that way (``kafka.isolation.level``).

OpenTelemetry OTLP/HTTP (``POST /v1/logs``, ``POST /v1/metrics``) is served beside it: :mod:`ingest.otlp_http`.

Run it with ``eventide gateway`` (``./run gateway``) or ``python -m ingest.gateway``.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import math
import os
import queue
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

import anyio
import anyio.to_thread
import uvicorn
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from eventide.config import Config, ConfigError, GatewayToken, load_config_or_exit
from eventide.http_deadline import HeadDeadlineProtocol
from ingest.envelope import KINDS, LEVELS, MAX_APP_CHARS, MAX_DEVICE_CHARS, MAX_NAME_CHARS, now_ms
from ingest.validation import (
    RecordDecoder,
    Refused,
    depth_reason,
    duplicate_key,
    encoded_size,
    line_depths,
    may_hold_surrogates,
    printable,
    unicode_error,
    validation_error,
    without_deep_elements,
)

log = logging.getLogger("eventide.gateway")

NDJSON_TYPES: Final = frozenset({"application/x-ndjson", "application/ndjson", "application/jsonl",
                                 "application/x-jsonlines"})
HEALTH_TTL_S: Final = 1.0
"""How long a broker probe result is reused: health checks and requests cost at most one probe a second."""
HEALTH_TIMEOUT_S: Final = 1.0
RETRY_AFTER_UNREACHABLE_S: Final = 5
RETRY_AFTER_BUSY_S: Final = 1
RETRY_AFTER_FAILED_S: Final = 2
ABORT_TIMEOUT_S: Final = 2.0
"""An abort only decides between written "nothing" and "unknown"; a failed one replaces the producer."""


# ----------------------------------------------------------------------------------------------------------
# Wire models (responses, and the envelope schema for the OpenAPI document)


class Rejection(BaseModel):
    """One event of the batch that was not written, and why (the stream job's dead-letter reason)."""

    index: int = Field(description="0-based position in the batch (NDJSON: among the non-blank lines)")
    id: str | None = Field(description="the event's id, when it has a string one")
    reason: str = Field(examples=["missing field: value", "event_time is after sent_time"])


class BatchResult(BaseModel):
    """Outcome of a batch: ``accepted`` events were written to Kafka (committed), ``rejected`` were not."""

    accepted: int
    rejected: list[Rejection]


class Problem(BaseModel):
    """A request refused as a whole; nothing from it was written."""

    error: Literal["unauthorized", "body_too_large", "too_many_events", "malformed_json", "rate_limited",
                   "request_timeout"]
    detail: str
    line: int | None = Field(None, description="malformed_json: 1-based line of the parse error")
    column: int | None = Field(None, description="malformed_json: 1-based column of the parse error")


class Unavailable(BaseModel):
    """Kafka did not take the batch. Retry the whole batch after ``Retry-After`` seconds."""

    error: Literal["unavailable"] = "unavailable"
    detail: str
    written: Literal["nothing", "unknown"] = Field(
        description="'nothing': the transaction was aborted or never began. 'unknown': the commit was sent but "
                    "not confirmed in time; the batch is then either entirely written or not at all")


class BrokerHealth(BaseModel):
    bootstrap: str
    reachable: bool
    events_topic: str
    events_topic_exists: bool
    detail: str | None = None


class Health(BaseModel):
    """``ok`` when the broker answers a metadata request and the events topic exists."""

    status: Literal["ok", "unavailable"]
    broker: BrokerHealth
    producers: int = Field(description="transactional producers (batches written concurrently)")
    producers_ready: int = Field(description="producers whose transactions are initialised")


class EnvelopeV1(BaseModel):
    """Event envelope v1 (documentation only: the gateway validates with the stream job's rules)."""

    model_config = ConfigDict(title="Envelope v1", extra="allow")

    v: Literal[1]
    id: str = Field(min_length=1, description="unique per event (UUIDv7 or ULID)")
    kind: Literal[KINDS]  # type: ignore[valid-type]
    app: str = Field(min_length=1, max_length=MAX_APP_CHARS)
    device: str = Field(min_length=1, max_length=MAX_DEVICE_CHARS, description="also the Kafka record key")
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS, description="metric name or logger name")
    value: float | None = Field(None, description="metrics: required, finite number")
    level: Literal[LEVELS] | None = Field(None, description="logs: required")  # type: ignore[valid-type]
    message: str | None = Field(None, description="logs: required")
    user: str | None = None
    tags: dict[str, str] | None = None
    event_time: int = Field(description="ms since the Unix epoch, device clock: when it happened")
    sent_time: int = Field(description="ms since the Unix epoch, device clock: when it was sent; >= event_time")
    received_time: int | None = Field(None, description="ignored: the gateway sets it (server clock)")


# ----------------------------------------------------------------------------------------------------------
# Request body -> events -> Kafka records (pure, run in a worker thread)


class RequestProblem(Exception):
    """A request refused as a whole before anything was written."""

    def __init__(self, status: int, problem: Problem, headers: dict[str, str] | None = None) -> None:
        super().__init__(problem.detail)
        self.status, self.problem, self.headers = status, problem, headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse(self.problem.model_dump(exclude_none=True), self.status, headers=self.headers)


def _too_many(count: int, limit: int) -> RequestProblem:
    return RequestProblem(413, Problem(error="too_many_events",
                                       detail=f"{count} events > gateway.max_batch_events ({limit})"))


def _malformed(detail: str, line: int | None = None, column: int | None = None) -> RequestProblem:
    where = f" (line {line}, column {column})" if line is not None and column is not None else (
        f" (line {line})" if line is not None else "")
    return RequestProblem(400, Problem(error="malformed_json", detail=f"{detail}{where}", line=line, column=column))


def parse_batch(body: bytes, content_type: str, max_events: int, max_depth: int = 32) -> list[Any]:
    """The events of a request body: a JSON array, or NDJSON (one JSON value per line, blank lines skipped).

    NDJSON is read when the Content-Type says so (``application/x-ndjson``) or, whatever it says, when the
    body does not start with ``[`` (so ``curl --data-binary @events.ndjson`` works without a header). A body
    that does not parse is refused whole (400): a syntax error means a broken client or a truncated body, and
    refusing all of it keeps a retry simple. Raises :class:`RequestProblem`.

    A record that parses but cannot be taken is a :class:`~ingest.validation.Refused` in the list (rejected with
    its reason): one nested deeper than ``max_depth`` (found by a linear scan of the bytes and never given to the
    parser, whose recursion it would exhaust) or holding an object with a duplicate key (ambiguous: the
    stream job's parser and this one need not keep the same value).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _malformed(f"body is not UTF-8: invalid byte at offset {exc.start}") from None
    text = text.removeprefix("\ufeff")
    media = content_type.split(";", 1)[0].strip().lower()
    decoder = RecordDecoder()
    parsed: list[Any]
    if media not in NDJSON_TYPES and text.lstrip().startswith("["):
        shallow, deep = without_deep_elements(body, max_depth)
        if deep:
            text = shallow.decode("utf-8").removeprefix("\ufeff")
        try:
            events = decoder.decode(text)
        except json.JSONDecodeError as exc:
            raise _malformed(exc.msg, exc.lineno, exc.colno) from None
        except RecursionError:  # not an array of records (the scan found none to take out): nothing to split
            raise _malformed(f"nested deeper than {max_depth} levels (gateway.max_depth)") from None
        except ValueError as exc:
            raise _malformed(str(exc)) from None
        if len(events) > max_events:
            raise _too_many(len(events), max_events)
        parsed = list(events)
        for index in deep:
            parsed[index] = Refused(depth_reason(max_depth))
    else:
        lines = [(number, line) for number, line in enumerate(text.split("\n"), 1) if line.strip()]
        if len(lines) > max_events:  # before parsing: counting is cheap, parsing is not
            raise _too_many(len(lines), max_events)
        depths = line_depths(body) if lines else None
        parsed = []
        for number, line in lines:
            if depths is not None and depths[number - 1] > max_depth:
                parsed.append(Refused(depth_reason(max_depth)))
                continue
            try:
                parsed.append(decoder.decode(line))
            except json.JSONDecodeError as exc:
                raise _malformed(exc.msg, number, exc.colno) from None
            except RecursionError:  # after a broken line the scan's string boundaries may be off
                parsed.append(Refused(depth_reason(max_depth)))
            except ValueError as exc:
                raise _malformed(str(exc), number) from None
    if decoder.duplicates:
        for index, event in enumerate(parsed):
            if (key := duplicate_key(event)) is not None:
                event_id = event.get("id") if isinstance(event, dict) else None
                parsed[index] = Refused(f"invalid JSON: duplicate key: {key}",
                                        event_id if isinstance(event_id, str) else None)
    return parsed


@dataclass(frozen=True)
class PreparedBatch:
    """Kafka records (key, value) of the valid events, in batch order, and the rejected ones."""

    records: list[tuple[bytes, bytes]]
    rejected: list[Rejection]


_COMPACT: Final = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
"""``ingest.envelope.encode``'s format; one encoder, as ``json.dumps`` builds a new one per call with options."""


def prepare_batch(events: Sequence[object], received_time: int, max_record_bytes: int, *,
                  apps: frozenset[str] | None = None, check_unicode: bool = True) -> PreparedBatch:
    """Stamp ``received_time`` on every event object, encode it as compact JSON and validate it.

    The stamp goes on before validation and measuring, so the size checked is the size written, and a
    client's own ``received_time`` (whatever its type) is replaced rather than judged. ``apps``: the apps the
    request's token may write (None: any). ``check_unicode=False`` skips the lone-surrogate check, for a body
    known to hold none (:func:`~ingest.validation.may_hold_surrogates`).
    """
    records: list[tuple[bytes, bytes]] = []
    rejected: list[Rejection] = []

    def reject(index: int, event_id: object, reason: str) -> None:
        # Reasons and ids may quote the client's text, lone surrogates included: escaped, so the answer encodes.
        rejected.append(Rejection(index=index, id=printable(event_id) if isinstance(event_id, str) else None,
                                  reason=printable(reason)))

    for index, raw in enumerate(events):
        if isinstance(raw, Refused):
            reject(index, raw.id, raw.reason)
            continue
        if check_unicode and (reason := unicode_error(raw)) is not None:
            # First: nothing of such an event can be encoded for Kafka, nor quoted in a reason.
            reject(index, raw.get("id") if isinstance(raw, dict) else None, reason)
            continue
        event = {**raw, "received_time": received_time} if isinstance(raw, dict) else raw
        value: bytes | None
        try:
            value = _COMPACT.encode(event).encode()
            size = len(value)
        except ValueError:  # a non-finite number (1e999): not representable in JSON
            value, size = None, encoded_size(event)
        reason = validation_error(event, max_record_bytes, record_bytes=size)
        if reason is None and value is None:  # e.g. 1e999 in a field the envelope does not define
            reason = "invalid field: numbers must be finite"
        if reason is None and apps is not None and event["app"] not in apps:  # type: ignore[index]
            reason = f"token not allowed to write app {event['app']}"  # type: ignore[index]
        if reason is not None:
            reject(index, raw.get("id") if isinstance(raw, dict) else None, reason)
            continue
        assert isinstance(event, dict) and value is not None  # a valid envelope is an encodable object
        records.append((event["device"].encode(), value))
    return PreparedBatch(records, rejected)


# ----------------------------------------------------------------------------------------------------------
# Kafka: a pool of transactional producers and a cached broker probe


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


# ----------------------------------------------------------------------------------------------------------
# Rate limits


class TokenBucket:
    """``rate`` events per second on average, at most ``size`` at once: a request takes as many units as it has
    events, all of them or none. Used from the event loop only (no lock: nothing awaits between look and take)."""

    def __init__(self, rate: float, size: int, clock: Any = time.monotonic) -> None:
        self.rate, self.size, self._clock = rate, size, clock
        self._level = float(size)
        self._stamp = clock()

    def _refill(self) -> float:
        now = self._clock()
        self._level = min(float(self.size), self._level + (now - self._stamp) * self.rate)
        self._stamp = now
        return self._level

    def wait_s(self, events: int) -> float:
        """Seconds until ``events`` could be taken (0: now); nothing is taken."""
        return max(0.0, (events - self._refill()) / self.rate)

    def take(self, events: int) -> float:
        """Take ``events`` and return 0, or take nothing and return the seconds until they could be taken."""
        wait = self.wait_s(events)
        if wait == 0:
            self._level -= events
        return wait

    def give_back(self, events: int) -> None:
        """Return units taken for a batch that was not written (Kafka unavailable)."""
        self._level = min(float(self.size), self._refill() + events)


def _rate_limited(token: GatewayToken, wait_s: float, events: int | None) -> RequestProblem:
    what = f"{events} events need" if events is not None else "the next request needs"
    retry = max(1, math.ceil(wait_s))
    return RequestProblem(429, Problem(
        error="rate_limited", detail=f"this token may send {token.rate:g} events/s (burst {token.bucket_size}): "
                                     f"{what} {wait_s:.2f}s more; nothing written"),
        headers={"Retry-After": str(retry)})


# ----------------------------------------------------------------------------------------------------------
# The app


class Gateway:
    """What the routes share: limits, tokens (with their app scopes and rate limits), the producer pool and the
    broker probe."""

    def __init__(self, config: Config) -> None:
        # A plain string: a config built without validation (model_copy), as tests do.
        tokens = [GatewayToken(token=t) if isinstance(t, str) else t for t in config.gateway.tokens
                  if (t if isinstance(t, str) else t.token)]
        if not tokens:
            raise ConfigError("gateway.tokens is empty: the gateway accepts only bearer tokens listed there, so "
                              "it does not start without one (set gateway.tokens in eventide.toml or "
                              "EVENTIDE_GATEWAY__TOKENS='[\"...\"]')")
        self.config = config
        self._tokens = [(t.token.encode(), t) for t in tokens]
        self._apps = {t.token: None if t.apps is None else frozenset(t.apps) for t in tokens}
        self._buckets = {t.token: TokenBucket(t.rate, t.bucket_size) for t in tokens
                         if t.rate is not None and t.bucket_size is not None}
        self.producers = TransactionalProducers(config)
        self.probe = BrokerProbe(config)
        # Requests wait for a producer here, in the event loop, so waiting ties up no worker thread (the
        # thread pool is shared with health checks and decoding). Made in start(), inside the event loop.
        self._permits: anyio.Semaphore | None = None

    def authorized(self, credentials: HTTPAuthorizationCredentials | None) -> GatewayToken | None:
        """The configured token presented, or None. Constant-time comparison against every configured token (no
        early exit on the first match)."""
        if credentials is None:
            return None
        presented = credentials.credentials.encode("utf-8", "surrogateescape")
        matched: GatewayToken | None = None
        for secret, token in self._tokens:
            if hmac.compare_digest(presented, secret):
                matched = token
        return matched

    def decode(self, body: bytes, content_type: str, received_time: int, token: GatewayToken) -> PreparedBatch:
        gw = self.config.gateway
        events = parse_batch(body, content_type, gw.max_batch_events, gw.max_depth)
        return prepare_batch(events, received_time, self.config.envelope.max_record_bytes,
                             apps=self._apps.get(token.token), check_unicode=may_hold_surrogates(body))

    def apps_of(self, token: GatewayToken) -> frozenset[str] | None:
        """The apps ``token`` may write (None: any)."""
        return self._apps.get(token.token)

    def over_rate(self, token: GatewayToken) -> RequestProblem | None:
        """A 429 when the token's bucket is empty (checked before the body is read), else None."""
        bucket = self._buckets.get(token.token)
        if bucket is not None and (wait := bucket.wait_s(1)) > 0:
            problem = _rate_limited(token, wait, None)
            problem.headers["Connection"] = "close"   # the body is not read
            return problem
        return None

    def charge(self, token: GatewayToken, events: int) -> RequestProblem | None:
        """Take ``events`` from the token's bucket: None when taken, else the 413 (never fits) or 429 to answer."""
        bucket = self._buckets.get(token.token)
        if bucket is None or events == 0:
            return None
        if events > bucket.size:
            return RequestProblem(413, Problem(
                error="too_many_events",
                detail=f"{events} events > this token's burst ({bucket.size}, gateway.tokens): send smaller batches"))
        wait = bucket.take(events)
        return None if wait == 0 else _rate_limited(token, wait, events)

    def refund(self, token: GatewayToken, events: int) -> None:
        """Give back what :meth:`charge` took for a batch that was not written."""
        bucket = self._buckets.get(token.token)
        if bucket is not None:
            bucket.give_back(events)

    async def write(self, records: Sequence[tuple[bytes, bytes]]) -> None:
        """Write ``records`` in one transaction, within ``ack_timeout_s`` counted from now (waiting for a free
        producer included). Fails fast when the broker is known to be down. Raises :class:`KafkaUnavailable`."""
        deadline = time.monotonic() + self.config.gateway.ack_timeout_s
        broker = await run_in_threadpool(self.probe.status)
        if not broker.reachable or not broker.events_topic_exists:
            raise KafkaUnavailable(f"Kafka not available at {broker.bootstrap}: {broker.detail}",
                                   retry_after_s=RETRY_AFTER_UNREACHABLE_S)
        assert self._permits is not None, "start() not called"
        acquired = False
        with anyio.move_on_after(max(deadline - time.monotonic(), 0)):
            await self._permits.acquire()
            acquired = True
        if not acquired:
            raise KafkaUnavailable(f"all {self.producers.size} Kafka producers stayed busy for "
                                   f"{self.config.gateway.ack_timeout_s}s", retry_after_s=RETRY_AFTER_BUSY_S)
        try:
            # Outside the timeout scope and not abandoned on cancel: a transaction once begun runs to its
            # commit or abort, and the answer must say which.
            await anyio.to_thread.run_sync(self.producers.write, records, max(deadline - time.monotonic(), 0.1))
        finally:
            self._permits.release()

    def health(self) -> tuple[int, Health]:
        broker = self.probe.status()
        ok = broker.reachable and broker.events_topic_exists
        return (200 if ok else 503), Health(status="ok" if ok else "unavailable", broker=broker,
                                            producers=self.producers.size, producers_ready=self.producers.ready)

    def start(self) -> None:
        """Call in the event loop at startup. Warms up the producers in the background when the broker is
        there; never blocks startup."""
        self._permits = anyio.Semaphore(self.producers.size)

        def warm() -> None:
            if self.probe.status().reachable:
                self.producers.warm_up()

        threading.Thread(target=warm, name="gateway-warm-up", daemon=True).start()

    def close(self) -> None:
        self.producers.close()


async def read_body(request: Request, limit: int, timeout_s: float = 30.0) -> bytes:
    """The request body, refusing (413) as soon as it is known to exceed ``limit`` bytes, and (408) when it has not
    all come within ``timeout_s``.

    The declared Content-Length is checked first, then the bytes actually received are counted, so a chunked
    or lying client is cut off after ``limit`` bytes instead of being buffered. The deadline covers the whole
    body, not each read: a client trickling a byte a second holds its connection ``timeout_s`` at most.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _body_too_large(int(declared), limit)
    body = bytearray()
    with anyio.move_on_after(timeout_s) as scope:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise _body_too_large(len(body), limit, at_least=True)
    if scope.cancelled_caught:
        raise RequestProblem(408, Problem(
            error="request_timeout", detail=f"the body did not arrive within {timeout_s:g}s "
                                            f"(gateway.receive_timeout_s); {len(body)} bytes received"),
            headers={"Connection": "close"})
    return bytes(body)


def _body_too_large(size: int, limit: int, at_least: bool = False) -> RequestProblem:
    more = "more than " if at_least else ""
    return RequestProblem(413, Problem(error="body_too_large",
                                       detail=f"body of {more}{size} bytes > gateway.max_body_bytes ({limit})"),
                          headers={"Connection": "close"})


_BEARER: Final = HTTPBearer(auto_error=False, description="A token listed in gateway.tokens")


def _request_body_doc(config: Config) -> dict[str, Any]:
    envelope = EnvelopeV1.model_json_schema()
    return {"requestBody": {
        "required": True,
        "description": f"A batch of at most {config.gateway.max_batch_events} events and "
                       f"{config.gateway.max_body_bytes} bytes. NDJSON is also read when the body does not "
                       "start with '['.",
        "content": {
            "application/json": {"schema": {"type": "array", "items": envelope,
                                            "maxItems": config.gateway.max_batch_events}},
            "application/x-ndjson": {"schema": {**envelope, "description": "one envelope per line"}},
        },
    }}


_DESCRIPTION: Final = (__doc__ or "").split("Run it with")[0]


def create_app(config: Config) -> FastAPI:
    """The gateway as an ASGI app. Raises :class:`ConfigError` when ``gateway.tokens`` is empty.

    Kafka is not contacted here: the app starts (and ``/health`` says 503) while the broker is down.
    """
    gateway = Gateway(config)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        gateway.start()
        try:
            yield
        finally:
            await run_in_threadpool(gateway.close)

    app = FastAPI(title="eventide HTTP gateway", version="1", description=_DESCRIPTION, lifespan=lifespan)
    app.state.gateway = gateway

    def batch_response(prepared: PreparedBatch, status: int) -> JSONResponse:
        result = BatchResult(accepted=len(prepared.records), rejected=prepared.rejected)
        return JSONResponse(result.model_dump(), status)

    @app.post(
        "/v1/events",
        summary="Send a batch of events",
        response_model=BatchResult,
        responses={
            200: {"description": "every event written"},
            207: {"model": BatchResult, "description": "the valid events written, the others listed"},
            400: {"model": Problem, "description": "body is not a JSON array or NDJSON; nothing written"},
            401: {"model": Problem, "description": "missing or unknown bearer token"},
            408: {"model": Problem, "description": "headers or body not received in time; connection closed"},
            413: {"model": Problem, "description": "body or batch larger than the configured limit"},
            422: {"model": BatchResult, "description": "every event invalid; nothing written"},
            429: {"model": Problem, "description": "token over its rate; see Retry-After; nothing written"},
            503: {"model": Unavailable, "description": "Kafka unavailable; see Retry-After and `written`"},
        },
        openapi_extra=_request_body_doc(config),
    )
    async def post_events(request: Request,
                          credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]
                          ) -> JSONResponse:
        token = gateway.authorized(credentials)
        if token is None:
            return RequestProblem(401, Problem(error="unauthorized", detail="missing or unknown bearer token"),
                                  headers={"WWW-Authenticate": 'Bearer realm="eventide"'}).response()
        if (refused := gateway.over_rate(token)) is not None:
            return refused.response()
        try:
            body = await read_body(request, config.gateway.max_body_bytes, config.gateway.receive_timeout_s)
            # One stamp per request: the moment the gateway had the whole batch.
            prepared = await run_in_threadpool(gateway.decode, body, request.headers.get("content-type", ""),
                                               now_ms(), token)
        except RequestProblem as problem:
            return problem.response()
        except ClientDisconnect:  # gone before the whole body came: nothing to do, nobody to tell
            return Response(status_code=400)
        # Every event of the batch counts against the rate, the rejected ones too (they cost the same to read).
        events = len(prepared.records) + len(prepared.rejected)
        if (refused := gateway.charge(token, events)) is not None:
            return refused.response()
        if not prepared.records:
            return batch_response(prepared, 422 if prepared.rejected else 200)
        try:
            await gateway.write(prepared.records)
        except KafkaUnavailable as exc:
            if exc.written == "nothing":
                gateway.refund(token, events)
            return exc.response()
        return batch_response(prepared, 207 if prepared.rejected else 200)

    async def health() -> JSONResponse:
        status, body = await run_in_threadpool(gateway.health)
        return JSONResponse(body.model_dump(), status)

    health_doc: dict[str, Any] = {"summary": "Broker reachability", "response_model": Health,
                                  "responses": {503: {"model": Health, "description": "broker not reachable"}}}
    app.get("/health", **health_doc)(health)
    app.get("/v1/health", **health_doc)(health)
    from ingest.otlp_http import add_routes  # here: it builds on this module

    add_routes(app, gateway, config)   # POST /v1/logs, /v1/metrics: OpenTelemetry OTLP/HTTP (ingest/otlp*.py)
    return app


class _HeaderDeadline(HeadDeadlineProtocol):
    """The gateway's head deadline (``gateway.header_timeout_s``): a late client gets a JSON 408. The body has its
    own deadline (:func:`read_body`)."""

    def late_response(self) -> bytes:
        body = json.dumps({"error": "request_timeout", "detail": f"request headers not received within "
                           f"{self.head_timeout_s:g}s (gateway.header_timeout_s)"}).encode()
        return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


def server_config(app: FastAPI, config: Config, **options: Any) -> uvicorn.Config:
    """How the gateway's uvicorn server is set up: h11 with a header deadline and a cap on connections, the
    keep-alive timeout, and h11's own limit on the size of a request's headers (``h11_max_incomplete_event_size``,
    its default 16 KB)."""
    protocol = type("GatewayHttp", (_HeaderDeadline,), {"head_timeout_s": config.gateway.header_timeout_s,
                                                        "max_connections": config.gateway.max_connections})
    settings: dict[str, Any] = {"host": config.gateway.host, "port": config.gateway.port, "log_level": "info",
                                "timeout_keep_alive": config.gateway.keep_alive_s, **options}
    return uvicorn.Config(app, http=protocol, **settings)


def serve(config: Config) -> int:
    """Run the gateway in the foreground with uvicorn on ``gateway.host:gateway.port`` until interrupted."""
    try:
        app = create_app(config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"eventide gateway on http://{config.gateway.host}:{config.gateway.port} -> Kafka "
          f"{config.kafka.bootstrap} topic {config.kafka.events_topic}", flush=True)
    uvicorn.Server(server_config(app, config)).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m ingest.gateway [--config FILE]``."""
    parser = argparse.ArgumentParser(prog="ingest.gateway", description="eventide HTTP gateway")
    parser.add_argument("--config", help="config file (default: $EVENTIDE_CONFIG or ./eventide.toml)")
    args = parser.parse_args(argv)
    return serve(load_config_or_exit(args.config))


if __name__ == "__main__":
    sys.exit(main())
