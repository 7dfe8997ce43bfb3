"""HTTP gateway: ``POST /v1/events`` for apps that cannot use the Python SDK.

A request carries a batch of v1 envelopes (BRIEF §1) as a JSON array or as NDJSON (one object per line). The
gateway checks the bearer token and the size limits, validates every event with the stream job's rules
(:mod:`ingest.gateway.validation`), stamps ``received_time`` (server clock) on the valid ones and writes them to the
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

OpenTelemetry OTLP/HTTP (``POST /v1/logs``, ``POST /v1/metrics``) is served beside it:
:mod:`ingest.gateway.otlp.routes`.

Run it with ``eventide gateway`` (``./run gateway``) or ``python -m ingest.gateway``.

This module is the app: its routes and its uvicorn server. The rest, one job a module: the answers' models
(:mod:`ingest.gateway.wire`), request body to Kafka records (:mod:`ingest.gateway.batches`), the transactional
producer pool and broker probe (:mod:`ingest.gateway.kafka`), the token buckets (:mod:`ingest.gateway.rate_limits`)
and what the routes share, tokens, body reading and writes (:mod:`ingest.gateway.service`).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Final

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from eventide.config import Config, ConfigError, load_config_or_exit
from eventide.envelope import now_ms
from eventide.http_deadline import HeadDeadlineProtocol
from ingest.gateway.batches import PreparedBatch
from ingest.gateway.kafka import KafkaUnavailable
from ingest.gateway.otlp.routes import add_routes
from ingest.gateway.service import BEARER, Gateway, read_body
from ingest.gateway.wire import BatchResult, EnvelopeV1, Health, Problem, RequestProblem, Unavailable


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
                          credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
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
    add_routes(app, gateway, config)   # POST /v1/logs, /v1/metrics: OpenTelemetry OTLP/HTTP (ingest/gateway/otlp/)
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


def listening_sockets(app: FastAPI, config: Config) -> list[socket.socket]:
    """Sockets bound on ``gateway.host``: ``gateway.port``, and ``otlp.port`` beside it (OTLP/HTTP's standard port,
    where OpenTelemetry SDKs send by default) unless it is 0 or the same port."""
    ports = [config.gateway.port]
    if config.otlp.port and config.otlp.port != config.gateway.port:
        ports.append(config.otlp.port)
    return [server_config(app, config, port=port).bind_socket() for port in ports]


def serve(config: Config) -> int:
    """Run the gateway in the foreground with uvicorn on ``gateway.host:gateway.port`` (and ``otlp.port``) until
    interrupted."""
    try:
        app = create_app(config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    sockets = listening_sockets(app, config)
    where = ", ".join(f"http://{config.gateway.host}:{sock.getsockname()[1]}" for sock in sockets)
    print(f"eventide gateway on {where} -> Kafka {config.kafka.bootstrap} topic {config.kafka.events_topic}",
          flush=True)
    uvicorn.Server(server_config(app, config)).run(sockets=sockets)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m ingest.gateway [--config FILE]``."""
    parser = argparse.ArgumentParser(prog="ingest.gateway", description="eventide HTTP gateway")
    parser.add_argument("--config", help="config file (default: $EVENTIDE_CONFIG or ./eventide.toml)")
    args = parser.parse_args(argv)
    return serve(load_config_or_exit(args.config))
