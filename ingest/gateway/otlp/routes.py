"""The gateway's OTLP/HTTP routes: ``POST /v1/logs`` and ``POST /v1/metrics`` (and ``GET /v1/otlp/stats``).

Same bearer tokens, app scopes, rate limits, body limit and Kafka write path as ``POST /v1/events``
(:mod:`ingest.gateway.app`): one transaction per request, answered only after Kafka acknowledged its commit. What
differs is the wire (:mod:`ingest.gateway.otlp.wire`): answers are ``Export*ServiceResponse`` /
``google.rpc.Status`` messages in the request's encoding, rejected records are counted in ``partial_success``
(200), and only 429 and 503 (with ``Retry-After``) tell an OTLP client to retry.
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
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from eventide.config import Config
from eventide.envelope import now_ms
from ingest.gateway.batches import prepare_batch
from ingest.gateway.kafka import KafkaUnavailable
from ingest.gateway.otlp.logs import count_log_records, latest_log_times, map_logs
from ingest.gateway.otlp.mapping import Mapped, Timing
from ingest.gateway.otlp.metrics import MetricState, count_points, latest_point_times, map_metrics, metrics_cost_bound
from ingest.gateway.otlp.state import ClockOffsets
from ingest.gateway.otlp.wire import (
    Media,
    OtlpRefused,
    Signal,
    decompress,
    encode,
    export_response,
    media_of,
    parse_request,
    status_body,
)
from ingest.gateway.service import BEARER, Gateway, read_body
from ingest.gateway.wire import RequestProblem


@dataclass(frozen=True)
class Parsed:
    """A request decoded and measured, not yet mapped: what mapping it may cost is known before it is done."""

    signal: Signal
    request: Message
    media: Media
    records: int
    """OTLP records (log records or data points) in the request."""
    cost_bound: int
    """At most what mapping it costs, in rate-limit units (:meth:`Mapped.cost`), at least the
    minimum a request costs: what the token is charged before the mapping starts."""


@dataclass(frozen=True)
class Outcome:
    """What becomes of a request: the Kafka records to write and how many OTLP records are not written, why."""

    records: list[tuple[bytes, bytes]]
    total: int
    """OTLP records (log records or data points) in the request."""
    rejected: int
    message: str
    cost: int = 0
    """What mapping it cost in rate-limit units: each record the envelopes it became (at least one), at least
    ``otlp.min_request_cost`` for the request. Never more than the :attr:`Parsed.cost_bound` charged for it."""


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
        """Each resource's timing, its clock estimate updated by this request's latest record time: only when that
        time is within ``otlp.max_clock_offset_s`` of the receive time; one further off is no clock reading (a
        device's estimate so far judges its records, and bounds refuse them)."""
        settings = self.config.otlp
        future, age = int(settings.max_future_s * 1000), int(settings.max_age_s * 1000)
        plausible = int(settings.max_clock_offset_s * 1000)
        timings = {}
        for key, newest in latest.items():
            if abs(received_ms - newest) <= plausible:
                correction = self.clocks.observe(key, received_ms, newest)
            else:
                correction = self.clocks.estimate(key, received_ms)
            timings[key] = Timing(received_ms, correction, future, age)
        return timings, Timing(received_ms, 0, future, age)

    def parse(self, signal: Signal, body: bytes, encoding: str, media: Media) -> Parsed:
        """Decompress, decode and measure a request body; nothing kept between requests is touched. Raises
        :class:`OtlpRefused`: 400 not OTLP, 413 larger than ``gateway.max_body_bytes`` once decompressed, or with
        more records or (at most) events than ``otlp.max_records_per_request`` / ``max_envelopes_per_request``."""
        settings = self.config.otlp
        body = decompress(body, encoding, self.config.gateway.max_body_bytes)
        request = parse_request(body, media, signal)
        what = "log records" if signal == "logs" else "data points"
        if isinstance(request, ExportLogsServiceRequest):
            records = count_log_records(request)
            bound = records
        else:
            assert isinstance(request, ExportMetricsServiceRequest)
            records = count_points(request)
            bound = -1   # not measured before the record count is known to be within its cap
        if records > settings.max_records_per_request:
            raise OtlpRefused(413, f"{records} {what} > otlp.max_records_per_request "
                                   f"({settings.max_records_per_request}): send smaller batches")
        if bound < 0:
            assert isinstance(request, ExportMetricsServiceRequest)
            bound = metrics_cost_bound(request, settings)
        if bound > settings.max_envelopes_per_request:
            raise OtlpRefused(413, f"the {records} {what} would become up to {bound} events > "
                                   f"otlp.max_envelopes_per_request ({settings.max_envelopes_per_request}); "
                                   "send smaller batches (histograms: up to otlp.histogram_max_events + 2 each)")
        return Parsed(signal, request, media, records, max(bound, settings.min_request_cost))

    def map(self, parsed: Parsed, received_ms: int, apps: frozenset[str] | None) -> Outcome:
        """Make a parsed request's Kafka records. Records of apps outside ``apps`` (None: any) are refused first,
        so they touch no clock estimate, series budget or cumulative series."""
        settings, request = self.config.otlp, parsed.request
        if isinstance(request, ExportLogsServiceRequest):
            latest = latest_log_times(request, settings, apps)
            with self._lock:   # logs touch nothing kept but the clock estimates: their mapping runs unlocked
                timings, default = self._timings(latest, received_ms)
            mapped = map_logs(request, timings, default, settings, apps)
        else:
            assert isinstance(request, ExportMetricsServiceRequest)
            latest = latest_point_times(request, settings, apps)
            with self._lock:   # series budgets and cumulative series are read and updated point by point
                timings, default = self._timings(latest, received_ms)
                mapped = map_metrics(request, timings, default, settings, self.metrics, apps)
        return self.outcome(mapped, received_ms, apps, parsed.signal, check_unicode=parsed.media == "json")

    def handle(self, signal: Signal, body: bytes, encoding: str, media: Media, received_ms: int,
               apps: frozenset[str] | None) -> Outcome:
        """:meth:`parse` then :meth:`map`, without a rate limit between them. Raises :class:`OtlpRefused`."""
        return self.map(self.parse(signal, body, encoding, media), received_ms, apps)

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
        return Outcome(records, mapped.records, len(refused), summary(refused, mapped.records, what) if refused else "",
                       max(mapped.cost(), self.config.otlp.min_request_cost))

    def stats(self, apps: frozenset[str] | None = None) -> dict[str, Any]:
        """The counters a token of ``apps`` (None: any app) may see."""
        with self._lock:
            return self.metrics.stats(apps)


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
            parsed = await run_in_threadpool(ingest.parse, signal, body,
                                             request.headers.get("content-encoding", ""), media)
        except RequestProblem as problem:
            return _answer(problem.status, problem.problem.detail, media, problem.headers)
        except OtlpRefused as refused:
            return _answer(refused.status, refused.message, media, refused.headers)
        except ClientDisconnect:
            return Response(status_code=400)
        # Charged before the mapping, at most what it can cost (bounded by the caps parse() checked), so the work
        # done for a token never runs ahead of its rate; what it did not cost is given back after.
        if (limited := gateway.charge(token, parsed.cost_bound)) is not None:
            return _answer(limited.status, limited.problem.detail, media, limited.headers)
        outcome = await run_in_threadpool(ingest.map, parsed, now_ms(), gateway.apps_of(token))
        gateway.refund(token, parsed.cost_bound - outcome.cost)
        if outcome.records:
            try:
                await gateway.write(outcome.records)
            except KafkaUnavailable as exc:
                if exc.written == "nothing":
                    gateway.refund(token, outcome.cost)
                # "unknown" too is worth a retry: every record has the same id when sent again (dedup).
                return _answer(503, f"{exc.detail} (written: {exc.written})", media,
                               {"Retry-After": str(exc.retry_after_s)})
        body_bytes, content_type = encode(export_response(signal, outcome.rejected, outcome.message), media)
        return Response(body_bytes, 200, media_type=content_type)

    doc: dict[str, Any] = {
        "responses": {200: {"description": "written; partial_success counts the records not written, and why"},
                      400: {"description": "not an OTLP request (google.rpc.Status)"},
                      401: {"description": "missing or unknown bearer token"},
                      413: {"description": "body over gateway.max_body_bytes (after decompression too), more "
                                           "records than otlp.max_records_per_request or events than "
                                           "otlp.max_envelopes_per_request, or than the token's burst"},
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

    @app.get("/v1/otlp/stats", summary="OTLP counters of the token's apps: series refused and live per app "
                                       "(an unscoped token: every app, and the cumulative series kept)")
    async def otlp_stats(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
                         ) -> JSONResponse:
        token = gateway.authorized(credentials)
        if token is None:
            return JSONResponse({"error": "unauthorized", "detail": "missing or unknown bearer token"}, 401,
                                headers={"WWW-Authenticate": 'Bearer realm="eventide"'})
        return JSONResponse(await run_in_threadpool(ingest.stats, gateway.apps_of(token)))

    return ingest
