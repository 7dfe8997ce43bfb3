"""HTTP gateway throughput: events/s and request latency for batches posted by concurrent clients.

Standalone by default: starts its own broker (free ports, temporary data dir), runs the gateway as a separate
process (``python -m ingest.gateway``, uvicorn) and posts ``--requests`` batches of ``--batch`` metric events
from ``--clients`` threads, each on its own keep-alive connection. Every response must be 200; afterwards a
``read_committed`` consumer counts the records on the topic, which must equal the events sent.
``--bootstrap host:port`` uses a running broker instead (``./run demo`` or any cluster; a fresh topic is made).

``--otlp`` adds two runs after the v1 one, through the same gateway: OpenTelemetry OTLP/HTTP (binary protobuf)
requests of ``--batch`` log records to ``POST /v1/logs``, then of ``--batch`` gauge data points to
``POST /v1/metrics`` (one resource per request, one of 100 hosts; 50 metrics x 10 attribute sets), each answered 200
with no partial success, each record one event on the topic.

    .venv/bin/python bench/gateway_throughput.py --requests 400 --batch 500 --clients 4 [--otlp]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from eventide.config import Config, load_config, to_environ
from eventide.envelope import metric_event, now_ms
from stack import broker
from stack.services import free_port

REPO = Path(__file__).resolve().parent.parent
TOKEN = "bench-token"


def _config(args: argparse.Namespace, data: Path) -> Config:
    kafka: dict[str, object] = {"events_topic": f"bench.gateway.{uuid.uuid4().hex[:8]}"}
    if args.bootstrap:
        kafka["bootstrap_servers"] = args.bootstrap
    else:
        kafka.update(port=free_port(), controller_port=free_port())
    return load_config(environ={}, root=str(REPO), paths={"data_dir": str(data), "cache_dir": str(REPO / ".cache")},
                       kafka=kafka, gateway={"port": free_port(), "tokens": [TOKEN], "producers": args.producers,
                                             "max_batch_events": max(args.batch, 1)}, otlp={"port": 0})


def _bodies(requests: int, batch: int, ndjson: bool) -> list[bytes]:
    """Request bodies made before the clock starts, so the clients spend no CPU on them."""
    bodies = []
    t = now_ms()
    for r in range(requests):
        events = [metric_event(app="bench", device=f"device-{(r * batch + i) % 100}", name="latency_ms",
                               value=float(i), event_time=t - 1000, sent_time=t, user=f"user-{i % 1000}",
                               tags={"region": "eu"}) for i in range(batch)]
        if ndjson:
            bodies.append("\n".join(json.dumps(e, separators=(",", ":")) for e in events).encode())
        else:
            bodies.append(json.dumps(events, separators=(",", ":")).encode())
    return bodies


def _otlp_bodies(signal: str, requests: int, batch: int) -> list[bytes]:
    """OTLP/HTTP protobuf request bodies (``signal``: logs or metrics), made before the clock starts."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    def attribute(key: str, value: str) -> KeyValue:
        return KeyValue(key=key, value=AnyValue(string_value=value))

    bodies = []
    t = now_ms() * 1_000_000
    for r in range(requests):
        resource = {"attributes": [attribute("service.name", "bench"), attribute("host.name", f"device-{r % 100}")]}
        request: ExportLogsServiceRequest | ExportMetricsServiceRequest
        if signal == "logs":
            request = ExportLogsServiceRequest()
            scope = request.resource_logs.add(resource=resource).scope_logs.add(scope={"name": "bench.http"})
            for i in range(batch):
                scope.log_records.add(time_unix_nano=t - 1_000_000_000 + i, observed_time_unix_nano=t,
                                      severity_number=9, body=AnyValue(string_value=f"GET /api/orders/{i} 200"),
                                      attributes=[attribute("http.route", "/api/orders"),
                                                  attribute("enduser.id", f"user-{i % 1000}")])
        else:
            request = ExportMetricsServiceRequest()
            scope = request.resource_metrics.add(resource=resource).scope_metrics.add(scope={"name": "bench.meter"})
            per_metric = 10
            for m in range(0, batch, per_metric):
                metric = scope.metrics.add(name=f"bench.gauge.{m // per_metric % 50}")
                for i in range(min(per_metric, batch - m)):
                    metric.gauge.data_points.add(time_unix_nano=t - 1_000_000_000 + r, as_double=float(m + i),
                                                 attributes=[attribute("shard", str(i))])
        bodies.append(request.SerializeToString())
    return bodies


def _post_all(port: int, bodies: list[bytes], clients: int, ndjson: bool, path: str = "/v1/events") \
        -> tuple[float, list[float]]:
    """Post every body, ``clients`` at a time; returns (wall seconds, per-request latencies). OTLP paths: protobuf,
    and a 200 must have an empty body (no partial success)."""
    otlp = path != "/v1/events"
    media = "application/x-protobuf" if otlp else "application/x-ndjson" if ndjson else "application/json"
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": media}
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    cursor = iter(range(len(bodies)))

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            while True:
                with lock:
                    i = next(cursor, None)
                if i is None:
                    return
                started = time.perf_counter()
                conn.request("POST", path, body=bodies[i], headers=headers)
                response = conn.getresponse()
                payload = response.read()
                elapsed = time.perf_counter() - started
                with lock:
                    latencies.append(elapsed)
                    if response.status != 200 or (otlp and payload):
                        failures.append(f"{response.status} {payload[:200]!r}")
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if failures:
        raise SystemExit(f"{len(failures)} requests failed, first: {failures[0]}")
    return wall, latencies


def _committed_count(config: Config) -> int:
    return len(broker.read_committed(config, timeout_s=120))


def start_gateway(config: Config, log: Path) -> subprocess.Popen[bytes]:
    """``python -m ingest.gateway`` over ``config`` (its output in ``log``), once it answers ``/health``."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ingest.gateway"], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **to_environ(config)}, cwd=REPO)
    wait_gateway_healthy(config.gateway.port, proc, log)
    return proc


def wait_gateway_healthy(port: int, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    """Returns once the gateway on ``port`` answers ``/health``; exits with its log's tail if it dies or hangs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gateway exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"gateway not healthy within {timeout_s}s:\n{log.read_text()[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400, help="batches posted (after 8 warm-up batches)")
    parser.add_argument("--batch", type=int, default=500, help="events per batch")
    parser.add_argument("--clients", type=int, default=4, help="concurrent client connections")
    parser.add_argument("--producers", type=int, default=4, help="gateway.producers (concurrent transactions)")
    parser.add_argument("--ndjson", action="store_true", help="post NDJSON instead of a JSON array")
    parser.add_argument("--bootstrap", help="use this running broker instead of starting one")
    parser.add_argument("--otlp", action="store_true",
                        help="then the same through OTLP/HTTP: log records to /v1/logs, gauge points to /v1/metrics")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="eventide-gateway-bench-"))
    config = _config(args, data)
    if config.kafka.managed:
        broker.start(config)
    proc: subprocess.Popen[bytes] | None = None
    try:
        broker.ensure_topics(config)
        log = data / "gateway.log"
        proc = start_gateway(config, log)
        port = config.gateway.port
        warm_up = _bodies(8, args.batch, args.ndjson)
        bodies = _bodies(args.requests, args.batch, args.ndjson)
        _post_all(port, warm_up, args.clients, args.ndjson)
        wall, latencies = _post_all(port, bodies, args.clients, args.ndjson)
        sent = (len(warm_up) + len(bodies)) * args.batch
        on_topic = _committed_count(config)
        cut = statistics.quantiles(latencies, n=100, method="inclusive")
        events = len(bodies) * args.batch
        megabytes = sum(len(b) for b in bodies) / 1e6
        print(f"gateway: {args.producers} producers; {args.clients} clients x keep-alive, "
              f"{args.requests} requests of {args.batch} events ({'NDJSON' if args.ndjson else 'JSON array'}, "
              f"{megabytes / len(bodies) * 1000:.0f} KB each)")
        print(f"throughput: {events / wall:,.0f} events/s, {len(bodies) / wall:,.1f} requests/s, "
              f"{megabytes / wall:.1f} MB/s ({events:,} events in {wall:.2f} s)")
        print(f"latency: p50 {cut[49] * 1000:.1f} ms, p99 {cut[98] * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms")
        print(f"read_committed count on the topic: {on_topic:,} (sent {sent:,})")
        if on_topic != sent:
            raise SystemExit("MISMATCH: acknowledged events missing or duplicated on the topic")
        for signal in ("logs", "metrics") if args.otlp else ():
            path = f"/v1/{signal}"
            warm_up, bodies = _otlp_bodies(signal, 8, args.batch), _otlp_bodies(signal, args.requests, args.batch)
            _post_all(port, warm_up, args.clients, False, path)
            wall, latencies = _post_all(port, bodies, args.clients, False, path)
            sent += (len(warm_up) + len(bodies)) * args.batch
            on_topic = _committed_count(config)
            cut = statistics.quantiles(latencies, n=100, method="inclusive")
            records = len(bodies) * args.batch
            what = "log records" if signal == "logs" else "data points"
            print(f"OTLP {path}: {args.requests} protobuf requests of {args.batch} {what} "
                  f"({sum(len(b) for b in bodies) / len(bodies) / 1000:.0f} KB each)")
            print(f"  throughput: {records / wall:,.0f} {what}/s, {len(bodies) / wall:,.1f} requests/s; "
                  f"latency p50 {cut[49] * 1000:.1f} ms, p99 {cut[98] * 1000:.1f} ms")
            print(f"  read_committed count on the topic: {on_topic:,} (sent {sent:,})")
            if on_topic != sent:
                raise SystemExit("MISMATCH: acknowledged records missing or duplicated on the topic")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        if config.kafka.managed:
            broker.stop(config)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
