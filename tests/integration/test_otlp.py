"""OTLP/HTTP through the gateway into Kafka, with real clients nobody here wrote: the OpenTelemetry Python SDK and
its OTLP/HTTP exporter (protobuf), plus raw requests for what an SDK does not send on its own (JSON with hex ids,
replays, gzip, oversized and partly bad requests). What reaches Kafka is compared with the SDK's own data."""

from __future__ import annotations

import bisect
import gzip
import json
import logging
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from eventide.config import Config, GatewayToken, to_environ
from eventide.envelope import now_ms
from ingest.gateway.app import create_app
from stack import broker
from stack.services import free_port
from tests.support.servers import uvicorn_in_thread

pytestmark = pytest.mark.integration

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PROTOBUF = {**AUTH, "Content-Type": "application/x-protobuf"}
JSON_HEADERS = {**AUTH, "Content-Type": "application/json"}


def gateway_config(kafka: Config, name: str, *, create_topics: bool = True, **gateway: Any) -> Config:
    """``kafka`` with its own events topic and gateway settings (cheaper than a whole stack)."""
    return with_gateway(kafka.model_copy(update={"kafka": kafka.kafka.model_copy(update={
        "events_topic": f"otlp.{name}", "dead_letter_topic": f"otlp-dl.{name}"})}), create_topics, **gateway)


def with_gateway(config: Config, create_topics: bool = True, **gateway: Any) -> Config:
    """``config`` whose gateway takes ``TOKEN``, with its topics made and visible to the gateway's metadata probe."""
    config = config.model_copy(update={"gateway": config.gateway.model_copy(update={
        "tokens": [TOKEN], "producers": 2, "ack_timeout_s": 5.0, **gateway})})
    if create_topics:
        broker.ensure_topics(config)
        admin, deadline = broker.admin(config), time.monotonic() + 15
        topic = config.kafka.events_topic
        while (found := admin.list_topics(topic, timeout=5).topics.get(topic)) is None or found.error is not None:
            assert time.monotonic() < deadline, f"topic {topic} not visible"
            time.sleep(0.05)
    return config


def committed(config: Config, timeout_s: float = 20.0) -> list[Any]:
    """Every record of the events topic a ``read_committed`` reader sees."""
    return broker.read_committed(config, timeout_s=timeout_s)


def rows(config: Config, sql: str) -> list[dict[str, Any]]:
    from store.client import connect

    with connect(config) as client:
        result = client.query(sql)
        return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


@contextmanager
def serving(config: Config, seen: list[tuple[str, str, str, int]] | None = None, port: int | None = None) \
        -> Iterator[str]:
    """The gateway on a real uvicorn server (the SDK's exporter speaks HTTP through ``requests``); its base URL.
    ``seen`` collects each request's (path, Content-Type, Content-Encoding, status): what the client really sent."""
    port = port or free_port()
    app = create_app(config)
    if seen is not None:
        @app.middleware("http")
        async def record(request: Any, call_next: Any) -> Any:
            response = await call_next(request)
            seen.append((request.url.path, request.headers.get("content-type", ""),
                         request.headers.get("content-encoding", ""), response.status_code))
            return response
    with uvicorn_in_thread(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")):
        yield f"http://127.0.0.1:{port}"


def events(config: Config) -> list[dict[str, Any]]:
    records = committed(config)
    for record in records:   # key = device, as for every producer
        assert record.key() == json.loads(record.value())["device"].encode()
    return [json.loads(r.value()) for r in records]


# ----------------------------------------------------------------------------------------------------------
# The Python SDK


class RecordingLogExporter(OTLPLogExporter):
    """The SDK's own exporter, keeping what it exported and how the gateway answered."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.exported: list[Any] = []
        self.results: list[Any] = []

    def export(self, batch: Sequence[Any]) -> Any:
        self.exported.extend(batch)
        result = super().export(batch)
        self.results.append(result)
        return result


class RecordingMetricExporter(OTLPMetricExporter):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.exported: list[MetricsData] = []
        self.results: list[MetricExportResult] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float | None = 10_000, **kwargs: Any) \
            -> MetricExportResult:
        self.exported.append(metrics_data)
        result = super().export(metrics_data, timeout_millis, **kwargs)
        self.results.append(result)
        return result


LEVELS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning", logging.ERROR: "error",
          logging.CRITICAL: "critical"}


def test_python_sdk_logs_reach_kafka_as_the_sdk_recorded_them(kafka: Config) -> None:
    config = gateway_config(kafka, "otlp_sdk_logs")
    with serving(config) as url:
        exporter = RecordingLogExporter(endpoint=f"{url}/v1/logs", headers={"Authorization": f"Bearer {TOKEN}"})
        provider = LoggerProvider(resource=Resource.create({"service.name": "shop", "host.name": "box-1"}))
        provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
        logger = logging.getLogger("shop.orders")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        handler = LoggingHandler(level=logging.DEBUG, logger_provider=provider)
        logger.addHandler(handler)
        try:
            for level in LEVELS:
                logger.log(level, "order %d at level %s", level, logging.getLevelName(level),
                           extra={"sku": "A-1", "enduser.id": f"user-{level}"})
            provider.force_flush()
        finally:
            logger.removeHandler(handler)
            provider.shutdown()
    assert [r.name for r in exporter.results] == ["SUCCESS"]
    written = events(config)
    assert len(written) == len(exporter.exported) == len(LEVELS)
    by_message = {e["message"]: e for e in written}
    for readable in exporter.exported:
        record = readable.log_record
        event = by_message[record.body]
        level = next(lv for lv, name in LEVELS.items() if logging.getLevelName(lv) in record.body)
        assert (event["app"], event["device"], event["name"], event["level"], event["kind"]) == \
            ("shop", "box-1", "shop.orders", LEVELS[level], "log")
        assert event["event_time"] == record.timestamp // 1_000_000
        assert event["user"] == f"user-{level}"
        assert event["tags"]["sku"] == "A-1" and "enduser.id" not in event["tags"]
        assert event["sent_time"] >= event["event_time"] and event["received_time"] >= event["event_time"]


def test_an_sdk_configured_only_by_the_standard_endpoint_variable_reaches_kafka(
        kafka: Config, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``eventide gateway`` also serves OTLP on ``otlp.port`` (4318 by default, where every OpenTelemetry SDK sends):
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` and a token in ``OTEL_EXPORTER_OTLP_HEADERS`` are all an app sets."""
    config = gateway_config(kafka, "otlp_standard_port", port=free_port())
    config = config.model_copy(update={"otlp": config.otlp.model_copy(update={"port": free_port()})})
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        gateway = subprocess.Popen([sys.executable, "-m", "stack.cli", "gateway"], stdout=out,
                                   stderr=subprocess.STDOUT, env={**os.environ, **to_environ(config)})
    try:
        for port in (config.gateway.port, config.otlp.port):     # the same gateway on both ports
            deadline = time.monotonic() + 60
            while not _healthy(port):
                assert gateway.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{config.otlp.port}")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization=Bearer {TOKEN}")
        exporter = RecordingLogExporter()
        provider = LoggerProvider(resource=Resource.create({"service.name": "billing", "host.name": "box-9"}))
        provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
        logger = logging.getLogger("billing.invoices")
        logger.propagate = False
        handler = LoggingHandler(level=logging.INFO, logger_provider=provider)
        logger.addHandler(handler)
        try:
            logger.warning("invoice 42 sent through the standard port")
            provider.force_flush()
        finally:
            logger.removeHandler(handler)
            provider.shutdown()
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
    assert [r.name for r in exporter.results] == ["SUCCESS"], log.read_text()
    [event] = events(config)
    assert (event["app"], event["device"], event["name"], event["level"], event["message"]) == \
        ("billing", "box-9", "billing.invoices", "warning", "invoice 42 sent through the standard port")


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


DEFAULT_BOUNDS = (0.0, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0, 250.0, 500.0, 750.0, 1000.0, 2500.0, 5000.0, 7500.0,
                  10000.0)


def test_python_sdk_metrics_counter_histogram_gauge(kafka: Config) -> None:
    config = gateway_config(kafka, "otlp_sdk_metrics")
    seen: list[tuple[str, str, str, int]] = []
    with serving(config, seen) as url:
        exporter = RecordingMetricExporter(endpoint=f"{url}/v1/metrics", compression=Compression.Gzip,
                                           headers={"Authorization": f"Bearer {TOKEN}"})
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
        provider = MeterProvider(resource=Resource.create({"service.name": "shop", "host.name": "box-2"}),
                                 metric_readers=[reader])
        meter = provider.get_meter("shop.meter")
        orders = meter.create_counter("orders")
        latency = meter.create_histogram("latency_ms", unit="ms")
        depth = meter.create_gauge("queue_depth")
        try:
            orders.add(5, {"region": "eu"})
            latency.record(3.0, {"route": "/pay"})
            latency.record(70.0, {"route": "/pay"})
            depth.set(4, {"queue": "q1"})
            provider.force_flush()
            orders.add(3, {"region": "eu"})
            for value in (7.0, 12.0, 600.0, 620.0):
                latency.record(value, {"route": "/pay"})
            depth.set(9, {"queue": "q1"})
            provider.force_flush()
        finally:
            provider.shutdown()
    assert {r.name for r in exporter.results} == {"SUCCESS"}
    assert seen == [("/v1/metrics", "application/x-protobuf", "gzip", 200)] * 3
    written = events(config)
    assert {(e["app"], e["device"]) for e in written} == {("shop", "box-2")}

    def named(name: str) -> list[dict[str, Any]]:
        return sorted((e for e in written if e["name"] == name), key=lambda e: e["event_time"])

    def exported(name: str) -> list[Any]:
        return [m.data.data_points[0] for data in exporter.exported for rm in data.resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics if m.name == name]

    # The counter is cumulative in the SDK (5, 8, and 8 again from the export at shutdown): deltas 5, 3, 0 at the
    # SDK's point times.
    points = exported("orders")
    assert [p.value for p in points] == [5, 8, 8]
    assert [(e["value"], e["event_time"], e["tags"]) for e in named("orders")] == \
        [(delta, p.time_unix_nano // 1_000_000, {"region": "eu"}) for delta, p in zip((5.0, 3.0, 0.0), points,
                                                                                        strict=True)]
    # The gauge: each value as it was last set before an export.
    assert [e["value"] for e in named("queue_depth")] == [p.value for p in exported("queue_depth")] == [4, 9, 9]
    # The histogram: every observation stands in its bucket of the SDK's bounds; count and sum exact; the first
    # interval's min and max exact (a later one is a cumulative difference: its min and max are not known).
    histograms = exported("latency_ms")
    assert tuple(histograms[0].explicit_bounds) == DEFAULT_BOUNDS
    samples = named("latency_ms")
    assert len(samples) == 6
    first, second = samples[:2], samples[2:]
    assert [e["value"] for e in first] == [3.0, 70.0]
    assert sorted(bisect.bisect_left(DEFAULT_BOUNDS, e["value"]) for e in second) == \
        sorted(bisect.bisect_left(DEFAULT_BOUNDS, v) for v in (7.0, 12.0, 600.0, 620.0))
    assert [e["value"] for e in named("latency_ms.count")] == [2, 4, 0]
    assert [e["value"] for e in named("latency_ms.sum")] == [73.0, 1239.0, 0.0]
    assert [p.count for p in histograms] == [2, 6, 6] and histograms[-1].sum == 73.0 + 1239.0
    assert len({e["id"] for e in written}) == len(written)


# ----------------------------------------------------------------------------------------------------------
# A second real client in another language: OpenTelemetry's JavaScript logs SDK on Node (OTLP/HTTP JSON)

JS_CLIENT = Path(__file__).resolve().parent / "otlp_js"
JS_LEVELS = {9: "info", 13: "warning", 17: "error", 21: "critical"}


def test_javascript_sdk_logs_over_otlp_json(kafka: Config) -> None:
    assert (JS_CLIENT / "node_modules").is_dir(), "./run test installs it (npm ci in tests/integration/otlp_js)"
    config = gateway_config(kafka, "otlp_js")
    seen: list[tuple[str, str, str, int]] = []
    with serving(config, seen) as url:
        sent = subprocess.run(["node", "send_logs.mjs"], cwd=JS_CLIENT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "OTLP_LOGS_URL": f"{url}/v1/logs", "OTLP_TOKEN": TOKEN})
    assert sent.returncode == 0, sent.stderr
    *emitted, summary = [json.loads(line) for line in sent.stdout.splitlines()]
    assert summary == {"results": [0]}                    # ExportResultCode.SUCCESS: the gateway answered 200
    assert seen == [("/v1/logs", "application/json", "", 200)]   # OTLP/JSON, as this exporter sends
    written = sorted(events(config), key=lambda e: e["event_time"])
    assert len(written) == len(emitted) == 4
    for record, event in zip(emitted, written, strict=True):
        assert (event["app"], event["device"], event["name"]) == ("storefront", "node-1", "storefront.checkout")
        assert event["level"] == JS_LEVELS[record["severityNumber"]]
        assert event["event_time"] == record["timestamp"]
        body = record["body"]
        assert (event["message"] if isinstance(body, str) else json.loads(event["message"])) == body
        attributes = {k: str(v) for k, v in record.get("attributes", {}).items()}
        assert event.get("user") == attributes.pop("enduser.id", None)
        assert event.get("tags", {}) == attributes


def test_javascript_sdk_metrics_over_otlp_json(kafka: Config) -> None:
    """OTLP/JSON metrics from a real exporter: int64 values as strings, cumulative counter and histogram."""
    config = gateway_config(kafka, "otlp_js_metrics")
    seen: list[tuple[str, str, str, int]] = []
    with serving(config, seen) as url:
        sent = subprocess.run(["node", "send_metrics.mjs"], cwd=JS_CLIENT, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "OTLP_METRICS_URL": f"{url}/v1/metrics",
                                                "OTLP_TOKEN": TOKEN})
    assert sent.returncode == 0, sent.stderr
    recorded = json.loads(sent.stdout.splitlines()[-1])
    assert recorded["results"] == [0, 0, 0]                     # two exports and the one at shutdown: all 200
    assert seen == [("/v1/metrics", "application/json", "", 200)] * 3
    written = sorted(events(config), key=lambda e: e["event_time"])
    assert {(e["app"], e["device"]) for e in written} == {("storefront", "node-2")}

    def named(name: str) -> list[dict[str, Any]]:
        return [e for e in written if e["name"] == name]

    # Cumulative 2, 5, 5: deltas 2, 3, 0.
    assert [(e["value"], e["tags"]) for e in named("carts")] == [(2.0, {"region": "eu"}), (3.0, {"region": "eu"}),
                                                                 (0.0, {"region": "eu"})]
    first, second = recorded["checkout"]
    assert [e["value"] for e in named("checkout_ms.count")] == [len(first), len(second), 0]
    assert [e["value"] for e in named("checkout_ms.sum")] == [sum(first), sum(second), 0]
    samples = named("checkout_ms")
    assert len(samples) == len(first) + len(second)
    assert [e["value"] for e in samples[:len(first)]][::len(first) - 1] == [min(first), max(first)]
    assert sorted(bisect.bisect_left(DEFAULT_BOUNDS, e["value"]) for e in samples) == \
        sorted(bisect.bisect_left(DEFAULT_BOUNDS, v) for v in first + second)


# ----------------------------------------------------------------------------------------------------------
# Raw requests


def log_request(messages: Sequence[str], at_ms: int, service: str = "web", **record: Any) \
        -> ExportLogsServiceRequest:
    return ExportLogsServiceRequest(resource_logs=[logs_pb2.ResourceLogs(
        resource={"attributes": [KeyValue(key="service.name", value=AnyValue(string_value=service)),
                                 KeyValue(key="host.name", value=AnyValue(string_value="h1"))]},
        scope_logs=[logs_pb2.ScopeLogs(scope={"name": "api"}, log_records=[
            logs_pb2.LogRecord(time_unix_nano=at_ms * 1_000_000, observed_time_unix_nano=at_ms * 1_000_000,
                               severity_number=9, body=AnyValue(string_value=m), **record) for m in messages])])])


def test_a_replayed_request_gets_the_same_ids_and_gzip_json_answers_in_kind(kafka: Config) -> None:
    config = gateway_config(kafka, "otlp_replay")
    body = log_request(["a", "b", "c"], now_ms() - 2_000).SerializeToString()
    with TestClient(create_app(config)) as client:
        first = client.post("/v1/logs", content=body, headers=PROTOBUF)
        again = client.post("/v1/logs", content=gzip.compress(body), headers={**PROTOBUF, "Content-Encoding": "gzip"})
        document = {"resourceLogs": [{"resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "web"}}]}, "scopeLogs": [{"logRecords": [{
                "timeUnixNano": str((now_ms() - 1_000) * 1_000_000), "severityNumber": 17,
                "body": {"stringValue": "json"}, "traceId": "5b8efff798038103d269b633813fc60c",
                "unknownField": {"x": 1}}]}]}]}
        as_json = client.post("/v1/logs", content=gzip.compress(json.dumps(document).encode()),
                              headers={**JSON_HEADERS, "Content-Encoding": "gzip"})
    for response in (first, again):
        assert response.status_code == 200 and response.headers["content-type"] == "application/x-protobuf"
        assert ExportLogsServiceResponse.FromString(response.content) == ExportLogsServiceResponse()
    assert (as_json.status_code, as_json.headers["content-type"], as_json.json()) == (200, "application/json", {})
    written = events(config)
    ids = [e["id"] for e in written if e["message"] in "abc"]
    assert len(ids) == 6 and len(set(ids)) == 3          # the copy carries the same ids: the pipeline counts it once
    [from_json] = [e for e in written if e["message"] == "json"]
    assert (from_json["level"], from_json["tags"]) == ("error", {"trace_id": "5b8efff798038103d269b633813fc60c"})


def test_a_partly_bad_request_writes_the_good_records_and_counts_the_others(kafka: Config) -> None:
    config = gateway_config(kafka, "otlp_partial", tokens=[GatewayToken(token=TOKEN, apps=["web"])])
    now = now_ms()
    request = log_request(["ok-1", "ok-2"], now - 1_000)
    request.resource_logs[0].scope_logs[0].log_records.extend([
        # An application's own timestamp an hour ahead (the SDK's observed time is now).
        logs_pb2.LogRecord(time_unix_nano=(now + 3_600_000) * 1_000_000, observed_time_unix_nano=now * 1_000_000,
                           body=AnyValue(string_value="future")),
        logs_pb2.LogRecord(time_unix_nano=(now - 1_000) * 1_000_000, body=AnyValue(string_value="x" * 70_000))])
    request.resource_logs.extend(log_request(["other app"], now - 1_000, service="billing").resource_logs)
    with TestClient(create_app(config)) as client:
        response = client.post("/v1/logs", content=request.SerializeToString(), headers=PROTOBUF)
        as_json = client.post("/v1/logs", content=json.dumps({"resourceLogs": [{"resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "billing"}}]}, "scopeLogs": [{"logRecords": [
                {"body": {"stringValue": "nope"}}]}]}]}), headers=JSON_HEADERS)
    assert response.status_code == 200
    partial = ExportLogsServiceResponse.FromString(response.content).partial_success
    assert partial.rejected_log_records == 3
    assert partial.error_message.startswith("3 of 5 log records rejected: ")
    for reason in ("otlp.max_future_s", "record too large", "token not allowed to write app billing"):
        assert reason in partial.error_message
    assert sorted(e["message"] for e in events(config)) == ["ok-1", "ok-2"]
    # Every record refused: still 200 (not retryable), the count in the request's encoding.
    assert as_json.status_code == 200
    assert as_json.json()["partialSuccess"]["rejectedLogRecords"] in ("1", 1)


def test_requests_refused_whole_get_a_status_body_in_their_encoding(kafka: Config) -> None:
    config = gateway_config(kafka, "otlp_refused", max_body_bytes=4096)
    big = log_request(["y" * 3000, "z" * 3000], now_ms()).SerializeToString()
    with TestClient(create_app(config)) as client:
        unauthorized = client.post("/v1/logs", content=b"", headers={"Content-Type": "application/x-protobuf"})
        wrong_type = client.post("/v1/logs", content=b"x", headers={**AUTH, "Content-Type": "text/plain"})
        garbage = client.post("/v1/metrics", content=b"{", headers=JSON_HEADERS)
        too_large = client.post("/v1/logs", content=gzip.compress(big),
                                headers={**PROTOBUF, "Content-Encoding": "gzip"})
    assert len(gzip.compress(big)) < 4096 < len(big)      # small on the wire, too large once decompressed
    status = status_pb2.Status.FromString(unauthorized.content)
    assert (unauthorized.status_code, status.code) == (401, 16)
    assert unauthorized.headers["www-authenticate"].startswith("Bearer")
    assert wrong_type.status_code == 415 and "Content-Type" in status_pb2.Status.FromString(wrong_type.content).message
    assert garbage.status_code == 400 and garbage.json()["message"].startswith("body is not JSON")
    assert too_large.status_code == 413
    assert "once decompressed" in status_pb2.Status.FromString(too_large.content).message
    assert committed(config, timeout_s=5) == []


def test_kafka_down_is_a_retryable_503(kafka: Config) -> None:
    config = gateway_config(kafka, "otlp_down", create_topics=False)   # its topic does not exist
    request = ExportMetricsServiceRequest()
    request.resource_metrics.add().scope_metrics.add().metrics.add(name="g").gauge.data_points.add(
        time_unix_nano=now_ms() * 1_000_000, as_double=1.0)
    with TestClient(create_app(config)) as client:
        response = client.post("/v1/metrics", content=request.SerializeToString(), headers=PROTOBUF)
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
    assert status_pb2.Status.FromString(response.content).code == 14


# ----------------------------------------------------------------------------------------------------------
# End to end: the SDK's data through the gateway, Kafka and the stream job into the store


def test_sdk_logs_and_metrics_reach_the_store_as_windows_counted_once(stack: Config, spark: Any) -> None:
    import random

    from analytics.job import run_until_idle

    config = with_gateway(stack)
    rng = random.Random(39)
    observations = [round(rng.lognormvariate(3.5, 1.0), 3) for _ in range(60)]
    levels = [logging.INFO] * 3 + [logging.WARNING] * 2 + [logging.ERROR]
    resource = Resource.create({"service.name": "shop", "host.name": "box-9"})
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with serving(config) as url:
        log_provider = LoggerProvider(resource=resource)
        log_provider.add_log_record_processor(BatchLogRecordProcessor(
            RecordingLogExporter(endpoint=f"{url}/v1/logs", headers=auth)))
        logger = logging.getLogger("shop.audit")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        handler = LoggingHandler(level=logging.DEBUG, logger_provider=log_provider)
        logger.addHandler(handler)
        exporter = RecordingMetricExporter(endpoint=f"{url}/v1/metrics", headers=auth)
        meter_provider = MeterProvider(resource=resource, metric_readers=[
            PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)])
        meter = meter_provider.get_meter("shop.meter")
        latency, orders = meter.create_histogram("latency_ms"), meter.create_counter("orders")
        try:
            for level in levels:
                logger.log(level, "audit line")
            for value in observations:
                latency.record(value)
            orders.add(5)
            meter_provider.force_flush()
            orders.add(3)
            log_provider.force_flush()
        finally:
            logger.removeHandler(handler)
            log_provider.shutdown()
            meter_provider.shutdown()
        # A client re-sending a request whose answer it lost: the same records twice.
        replayed = log_request(["sent twice"], now_ms() - 500).SerializeToString()
        for _ in range(2):
            with TestClient(create_app(config)) as client:
                assert client.post("/v1/logs", content=replayed, headers=PROTOBUF).status_code == 200
    assert {r.name for r in exporter.results} == {"SUCCESS"}

    run_until_idle(spark, config)
    windows = {r["name"]: r for r in rows(config, (
        "SELECT name, sum(event_count) AS events, sum(sum) AS total, min(min) AS low, max(max) AS high, "
        "sum(level_info) AS info, sum(level_warning) AS warning, sum(level_error) AS error, "
        "any(p50) AS p50, any(p90) AS p90, any(p99) AS p99, count() AS windows "
        "FROM window_aggregates FINAL WHERE window_kind = 'tumbling' AND window_length_ms = 60000 "
        "GROUP BY name"))}
    audit = windows["shop.audit"]
    assert (audit["events"], audit["info"], audit["warning"], audit["error"]) == (6, 3, 2, 1)
    assert windows["api"]["events"] == 1                          # the replayed request counted once
    assert windows["orders"]["total"] == 8.0                     # cumulative 5, 8 (and 8 at shutdown): 5 + 3 + 0
    assert windows["latency_ms.count"]["total"] == len(observations)
    assert windows["latency_ms.sum"]["total"] == pytest.approx(sum(observations))
    samples = windows["latency_ms"]
    assert (samples["events"], samples["windows"]) == (len(observations), 1)
    assert (samples["low"], samples["high"]) == (min(observations), max(observations))
    ordered = sorted(observations)
    n = len(ordered)
    for q, got in ((0.5, samples["p50"]), (0.9, samples["p90"]), (0.99, samples["p99"])):
        # In a bucket between those of the true quantiles one rank either side (sketch rank conventions differ).
        low, high = (bisect.bisect_left(DEFAULT_BOUNDS, ordered[min(n - 1, max(0, round(r * n) - 1))])
                     for r in (q - 1 / n, q + 1 / n))
        assert low <= bisect.bisect_left(DEFAULT_BOUNDS, got) <= high, (q, got)
    assert rows(config, "SELECT count() AS n FROM duplicates")[0]["n"] == 1
    # The log lines themselves, searchable, with the SDK's levels and the resource's app and device.
    lines = rows(config, "SELECT app, device, name, level, message FROM logs ORDER BY level, name")
    assert sorted((r["app"], r["device"], r["name"], r["level"], r["message"]) for r in lines) == sorted(
        [("shop", "box-9", "shop.audit", {logging.INFO: "info", logging.WARNING: "warning",
                                          logging.ERROR: "error"}[level], "audit line") for level in levels]
        + [("web", "h1", "api", "info", "sent twice")])
    # The dashboard's own queries see OTLP data as any other: the series, a chart's buckets, the device's clock.
    from datetime import UTC, datetime, timedelta

    from dashboard import queries
    from store.client import connect
    from store.range_query import SeriesKey

    until = datetime.now(UTC) + timedelta(minutes=2)
    since = until - timedelta(minutes=30)
    with connect(config) as client:
        catalog = queries.series_catalog(client)
        histogram = SeriesKey("shop", "metric", "latency_ms", "")
        assert {SeriesKey("shop", "log", "shop.audit", ""), histogram} <= set(catalog.series)
        buckets = queries.series_buckets(client, histogram, 60, since, until, catalog.lengths_ms)
        assert int(buckets["event_count"].sum()) == len(observations)
        assert list(buckets["p50"].dropna()) == [samples["p50"]]
        clocks = queries.device_clock_offsets(client, since, until)
    [box] = clocks[clocks["device"] == "box-9"].to_dict("records")
    assert abs(box["offset_s"]) < 2      # a correct clock: within the threshold, no correction applied


def test_the_series_cap_and_the_rate_limit(kafka: Config) -> None:
    """Points of series beyond otlp.max_series_per_app are refused in partial_success and counted in the stats;
    a token over its rate gets a retryable 429 with Retry-After and nothing is written."""
    config = gateway_config(kafka, "otlp_caps", tokens=[GatewayToken(token=TOKEN, rate=0.01, burst=5)])
    config = config.model_copy(update={"otlp": config.otlp.model_copy(update={"max_series_per_app": 2})})
    request = ExportMetricsServiceRequest()
    resource = request.resource_metrics.add(resource={"attributes": [
        KeyValue(key="service.name", value=AnyValue(string_value="api"))]})
    gauge = resource.scope_metrics.add().metrics.add(name="in_flight").gauge
    for route in ("/a", "/b", "/c"):
        gauge.data_points.add(time_unix_nano=now_ms() * 1_000_000, as_int=1,
                              attributes=[KeyValue(key="route", value=AnyValue(string_value=route))])
    with TestClient(create_app(config)) as client:
        capped = client.post("/v1/metrics", content=request.SerializeToString(), headers=PROTOBUF)
        stats = client.get("/v1/otlp/stats", headers=AUTH).json()
        limited = client.post("/v1/metrics", content=request.SerializeToString(), headers=PROTOBUF)
        unauthorized = client.get("/v1/otlp/stats")
    partial = ExportMetricsServiceResponse.FromString(capped.content).partial_success
    assert (capped.status_code, partial.rejected_data_points) == (200, 1)
    assert "otlp.max_series_per_app (2)" in partial.error_message
    assert stats["series_refused"] == {"api": 1}
    # The first request took 3 of the burst's 5 units (every point counts, the refused one too): 3 more do not fit.
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert status_pb2.Status.FromString(limited.content).code == 8
    assert unauthorized.status_code == 401
    assert sorted(e["tags"]["route"] for e in events(config)) == ["/a", "/b"]


def test_a_gateway_restart_loses_one_interval_of_a_cumulative_counter_and_counts_nothing_twice(kafka: Config) -> None:
    """The SDK's cumulative counter across a gateway restart (a new process, no memory of the series): the first
    point the new process sees is a baseline; a counter that starts after the restart is counted from its start."""
    config = gateway_config(kafka, "otlp_restart")
    port = free_port()
    exporter = RecordingMetricExporter(endpoint=f"http://127.0.0.1:{port}/v1/metrics",
                                       headers={"Authorization": f"Bearer {TOKEN}"})
    provider = MeterProvider(resource=Resource.create({"service.name": "shop", "host.name": "box-3"}),
                             metric_readers=[PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)])
    meter = provider.get_meter("shop.meter")
    orders = meter.create_counter("orders")
    with serving(config, port=port):
        orders.add(5)
        provider.force_flush()                    # cumulative 5: counted whole (the series started after the gateway)
    with serving(config, port=port):              # the restarted gateway
        orders.add(3)
        provider.force_flush()                    # cumulative 8: a baseline, the 3 are lost
        orders.add(2)
        provider.force_flush()                    # cumulative 10: +2
        refunds = meter.create_counter("refunds")
        refunds.add(4)
        provider.force_flush()                    # a series started after the restart: counted whole
        provider.shutdown()                       # one more export: nothing new
    assert {r.name for r in exporter.results} == {"SUCCESS"}
    written = sorted(events(config), key=lambda e: e["event_time"])
    assert [e["value"] for e in written if e["name"] == "orders"] == [5.0, 2.0, 0.0, 0.0]
    assert [e["value"] for e in written if e["name"] == "refunds"] == [4.0, 0.0]


def test_a_device_clock_an_hour_ahead_gets_envelopes_whose_corrected_time_is_the_true_time(kafka: Config) -> None:
    """A device whose clock reads an hour ahead: the gateway keeps its device time and stamps a sent_time such that
    the corrected time the stream job computes from the envelope (event_time + received - sent) is the true time,
    within the delivery delay. The job applying it: test_tumbling_windows.py's device clock one hour off."""
    config = gateway_config(kafka, "otlp_skew")
    hour = 3_600_000
    true_time = now_ms() - 200
    request = log_request(["from the future"], true_time + hour)
    request.resource_logs[0].resource.attributes[1].value.string_value = "skewed-box"
    with TestClient(create_app(config)) as client:
        answer = client.post("/v1/logs", content=request.SerializeToString(), headers=PROTOBUF)
    assert ExportLogsServiceResponse.FromString(answer.content) == ExportLogsServiceResponse()
    [event] = events(config)
    assert event["device"] == "skewed-box" and event["event_time"] == true_time + hour
    corrected = event["event_time"] + event["received_time"] - event["sent_time"]
    assert true_time <= corrected <= true_time + 5_000
