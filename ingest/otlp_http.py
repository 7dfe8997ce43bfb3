"""The gateway's OTLP/HTTP routes: ``POST /v1/logs`` and ``POST /v1/metrics`` (and ``GET /v1/otlp/stats``).

Same bearer tokens, app scopes, rate limits, body limit and Kafka write path as ``POST /v1/events``
(:mod:`ingest.gateway`): one transaction per request, answered only after Kafka acknowledged its commit. What
differs is the wire (:mod:`ingest.otlp`): answers are ``Export*ServiceResponse`` / ``google.rpc.Status`` messages
in the request's encoding, rejected records are counted in ``partial_success`` (200), and only 429 and 503 (with
``Retry-After``) tell an OTLP client to retry.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from eventide.config import Config
from ingest.envelope import now_ms
from ingest.gateway_batches import prepare_batch
from ingest.gateway_kafka import KafkaUnavailable
from ingest.gateway_service import BEARER, Gateway, read_body
from ingest.gateway_wire import RequestProblem
from ingest.otlp import (
    Mapped,
    Media,
    OtlpRefused,
    Signal,
    Timing,
    decompress,
    encode,
    export_response,
    latest_log_times,
    map_logs,
    media_of,
    parse_request,
    status_body,
)
from ingest.otlp_metrics import MetricState, latest_point_times, map_metrics
from ingest.otlp_state import ClockOffsets


@dataclass(frozen=True)
class Outcome:
    """What becomes of a request: the Kafka records to write and how many OTLP records are not written, why."""

    records: list[tuple[bytes, bytes]]
    total: int
    """OTLP records (log records or data points) in the request."""
    rejected: int
    message: str


def summary(refused: Mapping[int, str], total: int, what: str) -> str:
    """The ``error_message`` of a partial success: how many, and the commonest reasons with their counts."""
    reasons = Counter(refused.values())
    listed = "; ".join(f"{count} × {reason}" for reason, count in reasons.most_common(5))
    more = f"; and {len(reasons) - 5} other reasons" if len(reasons) > 5 else ""
    return f"{len(refused)} of {total} {what} rejected: {listed}{more}"


class OtlpIngest:
    """OTLP request bodies to Kafka records, with what is kept between requests (clock offsets, cumulative series,
    the cardinality guard) for one gateway process."""

    def __init__(self, config: Config, started_ms: int) -> None:
        self.config = config
        settings = config.otlp
        self.clocks = ClockOffsets(int(settings.clock_window_s * 1000), settings.clock_threshold_ms,
                                   settings.max_devices)
        self.metrics = MetricState(settings, started_ms)
        # Mapping is CPU under the GIL anyway; one lock keeps each request's view of the state consistent.
        self._lock = threading.Lock()

    def _timings(self, latest: Mapping[bytes, int], received_ms: int) -> tuple[dict[bytes, Timing], Timing]:
        settings = self.config.otlp
        future, age = int(settings.max_future_s * 1000), int(settings.max_age_s * 1000)
        timings = {key: Timing(received_ms, self.clocks.observe(key, received_ms, newest), future, age)
                   for key, newest in latest.items()}
        return timings, Timing(received_ms, 0, future, age)

    def handle(self, signal: Signal, body: bytes, encoding: str, media: Media, received_ms: int,
               apps: frozenset[str] | None) -> Outcome:
        """Decompress and decode a request body and make its Kafka records. Raises :class:`OtlpRefused`."""
        body = decompress(body, encoding, self.config.gateway.max_body_bytes)
        request = parse_request(body, media, signal)
        settings = self.config.otlp
        with self._lock:
            if isinstance(request, ExportLogsServiceRequest):
                timings, default = self._timings(latest_log_times(request, settings), received_ms)
                mapped = map_logs(request, timings, default, settings)
            else:
                assert isinstance(request, ExportMetricsServiceRequest)
                timings, default = self._timings(latest_point_times(request, settings), received_ms)
                mapped = map_metrics(request, timings, default, settings, self.metrics)
        return self.outcome(mapped, received_ms, apps, signal, check_unicode=media == "json")

    def outcome(self, mapped: Mapped, received_ms: int, apps: frozenset[str] | None, signal: Signal,
                check_unicode: bool = True) -> Outcome:
        """Validate the envelopes with the gateway's own checks (the stream job's rules, the token's apps) and
        encode them; a data point is written whole or not at all."""
        prepared = prepare_batch(mapped.events, received_ms, self.config.envelope.max_record_bytes, apps=apps,
                                 check_unicode=check_unicode)
        refused = dict(mapped.refused)
        for rejection in prepared.rejected:
            refused.setdefault(mapped.owners[rejection.index], rejection.reason)
        records = prepared.records
        if prepared.rejected:
            invalid = {rejection.index for rejection in prepared.rejected}
            valid = [i for i in range(len(mapped.events)) if i not in invalid]
            records = [record for i, record in zip(valid, prepared.records, strict=True)
                       if mapped.owners[i] not in refused]
        what = "log records" if signal == "logs" else "data points"
        return Outcome(records, mapped.records, len(refused), summary(refused, mapped.records, what) if refused else "")

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return self.metrics.stats()


def _answer(status: int, text: str, media: Media, headers: Mapping[str, str] | None = None) -> Response:
    body, content_type = status_body(status, text, media)
    return Response(body, status, headers=dict(headers or {}), media_type=content_type)


def add_routes(app: FastAPI, gateway: Gateway, config: Config) -> OtlpIngest:
    """Serve OTLP/HTTP on ``app`` through ``gateway``'s tokens, limits and Kafka producers."""
    ingest = OtlpIngest(config, now_ms())
    app.state.otlp = ingest

    async def export(signal: Signal, request: Request, credentials: HTTPAuthorizationCredentials | None) -> Response:
        try:
            media = media_of(request.headers.get("content-type", ""))
        except OtlpRefused as refused:
            return _answer(refused.status, refused.message, "protobuf")
        token = gateway.authorized(credentials)
        if token is None:
            return _answer(401, "missing or unknown bearer token", media,
                           {"WWW-Authenticate": 'Bearer realm="eventide"'})
        if (limited := gateway.over_rate(token)) is not None:
            return _answer(limited.status, limited.problem.detail, media, limited.headers)
        try:
            body = await read_body(request, config.gateway.max_body_bytes, config.gateway.receive_timeout_s)
            outcome = await run_in_threadpool(ingest.handle, signal, body,
                                              request.headers.get("content-encoding", ""), media, now_ms(),
                                              gateway.apps_of(token))
        except RequestProblem as problem:
            return _answer(problem.status, problem.problem.detail, media, problem.headers)
        except OtlpRefused as refused:
            return _answer(refused.status, refused.message, media, refused.headers)
        except ClientDisconnect:
            return Response(status_code=400)
        # Every record of the request counts against the token's rate, the rejected ones too.
        if (limited := gateway.charge(token, outcome.total)) is not None:
            return _answer(limited.status, limited.problem.detail, media, limited.headers)
        if outcome.records:
            try:
                await gateway.write(outcome.records)
            except KafkaUnavailable as exc:
                if exc.written == "nothing":
                    gateway.refund(token, outcome.total)
                # "unknown" too is worth a retry: every record has the same id when sent again (dedup).
                return _answer(503, f"{exc.detail} (written: {exc.written})", media,
                               {"Retry-After": str(exc.retry_after_s)})
        body_bytes, content_type = encode(export_response(signal, outcome.rejected, outcome.message), media)
        return Response(body_bytes, 200, media_type=content_type)

    doc: dict[str, Any] = {
        "responses": {200: {"description": "written; partial_success counts the records not written, and why"},
                      400: {"description": "not an OTLP request (google.rpc.Status)"},
                      401: {"description": "missing or unknown bearer token"},
                      413: {"description": "body over gateway.max_body_bytes (after decompression too)"},
                      415: {"description": "not application/x-protobuf or application/json; not gzip or deflate"},
                      429: {"description": "token over its rate; Retry-After"},
                      503: {"description": "Kafka unavailable; Retry-After"}},
        "response_class": Response,
    }

    @app.post("/v1/logs", summary="OTLP/HTTP logs (protobuf or JSON)", **doc)
    async def otlp_logs(request: Request,
                        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]) -> Response:
        return await export("logs", request, credentials)

    @app.post("/v1/metrics", summary="OTLP/HTTP metrics (protobuf or JSON)", **doc)
    async def otlp_metrics(request: Request,
                           credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
                           ) -> Response:
        return await export("metrics", request, credentials)

    @app.get("/v1/otlp/stats", summary="OTLP counters: series refused per app, cumulative series kept")
    async def otlp_stats(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
                         ) -> JSONResponse:
        if gateway.authorized(credentials) is None:
            return JSONResponse({"error": "unauthorized", "detail": "missing or unknown bearer token"}, 401,
                                headers={"WWW-Authenticate": 'Bearer realm="eventide"'})
        return JSONResponse(await run_in_threadpool(ingest.stats))

    return ingest
