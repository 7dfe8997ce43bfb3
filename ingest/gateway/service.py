"""What the gateway's routes share, ``POST /v1/events`` (:mod:`ingest.gateway.app`) and OTLP/HTTP
(:mod:`ingest.gateway.otlp.routes`) alike: the bearer tokens with their app scopes and rate limits, the request
body read within its size and time limits, and the Kafka producer pool and broker probe behind one ``write``."""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Sequence
from typing import Final

import anyio
import anyio.to_thread
from fastapi import Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from eventide.config import Config, ConfigError, GatewayToken
from ingest.gateway.batches import PreparedBatch, parse_batch, prepare_batch
from ingest.gateway.kafka import (
    RETRY_AFTER_BUSY_S,
    RETRY_AFTER_UNREACHABLE_S,
    BrokerProbe,
    KafkaUnavailable,
    TransactionalProducers,
)
from ingest.gateway.rate_limits import TokenBucket, rate_limited
from ingest.gateway.validation import may_hold_surrogates
from ingest.gateway.wire import Health, Problem, RequestProblem


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
            problem = rate_limited(token, wait, None)
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
        return None if wait == 0 else rate_limited(token, wait, events)

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


BEARER: Final = HTTPBearer(auto_error=False, description="A token listed in gateway.tokens")
