"""What one small hostile OTLP/HTTP request costs the gateway: status, Kafka records produced, CPU and memory.

Standalone like ``bench/gateway_throughput.py``: its own broker (free ports, temporary data dir) and the gateway as
a separate process (``python -m ingest.gateway``), then, per request kind, one request sent gzipped:

- ``histograms``: a metrics request of ``--points`` identical delta histogram points, each with 1,000 observations
  in one bucket, so each can become ``otlp.histogram_max_events`` + 2 events (the issue-49 request: about 8,150
  points fit in 1.6 KiB of gzip);
- ``summary``: one summary point with ``--quantiles`` quantile values (one record, as many events);
- ``empty``: ``--empties`` requests without a single record, from a token with a rate limit (how many get
  through).

Per kind: the answer's status and ``google.rpc.Status`` message, the records a ``read_committed`` consumer counts
on the events topic (and the log's end offsets, which count aborted records too), the gateway process' CPU time
(``/proc/<pid>/stat`` utime + stime), its peak resident memory growth (``VmHWM`` after minus ``VmRSS`` before, the
peak reset first through ``/proc/<pid>/clear_refs``) and the wall time of the request.

    .venv/bin/python -m bench.otlp_hostile [--points 8150] [--quantiles 200000] [--kinds histograms,summary,empty]
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from google.rpc import status_pb2
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from bench.gateway_throughput import start_gateway
from eventide.config import Config, load_config
from eventide.envelope import now_ms
from stack import broker
from stack.services import free_port

REPO = Path(__file__).resolve().parent.parent
TOKEN = "bench-token"
LIMITED = "bench-limited-token"
LIMITED_RATE = 10.0
"""Units per second of the rate-limited token the ``empty`` kind uses (burst: the same)."""
TICKS = os.sysconf("SC_CLK_TCK")


def _config(data: Path) -> Config:
    kafka = {"events_topic": f"bench.otlp-hostile.{uuid.uuid4().hex[:8]}", "port": free_port(),
             "controller_port": free_port()}
    tokens = [TOKEN, {"token": LIMITED, "rate": LIMITED_RATE, "burst": int(LIMITED_RATE)}]
    # A long ack timeout: Kafka takes even a million records, so what the gateway made of a request reaches the topic.
    return load_config(environ={}, root=str(REPO), paths={"data_dir": str(data), "cache_dir": str(REPO / ".cache")},
                       kafka=kafka, gateway={"port": free_port(), "tokens": tokens, "producers": 2,
                                             "ack_timeout_s": 300.0}, otlp={"port": 0})


def _log_end(config: Config) -> int:
    """Offsets written to the events topic: every record produced, aborted or not (and transaction markers)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap, "group.id": f"bench-{uuid.uuid4().hex}"})
    try:
        topic = config.kafka.events_topic
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions)
    finally:
        consumer.close()


def _histograms(points: int) -> bytes:
    request = ExportMetricsServiceRequest()
    resource = request.resource_metrics.add(resource={"attributes": [
        KeyValue(key="service.name", value=AnyValue(string_value="bench"))]})
    histogram = resource.scope_metrics.add().metrics.add(name="h").histogram
    histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
    t = now_ms() * 1_000_000
    for _ in range(points):
        histogram.data_points.add(time_unix_nano=t, count=1000, sum=5.0, bucket_counts=[1000])
    return request.SerializeToString()


def _summary(quantiles: int) -> bytes:
    request = ExportMetricsServiceRequest()
    resource = request.resource_metrics.add(resource={"attributes": [
        KeyValue(key="service.name", value=AnyValue(string_value="bench"))]})
    summary = resource.scope_metrics.add().metrics.add(name="s").summary
    point = summary.data_points.add(time_unix_nano=now_ms() * 1_000_000, count=1, sum=1.0)
    for i in range(quantiles):
        point.quantile_values.add(quantile=i / quantiles, value=1.0)
    return request.SerializeToString()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS   # utime, stime (fields 14, 15 of the whole line)


def _memory_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _post(port: int, body: bytes, token: str = TOKEN) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request("POST", "/v1/metrics", body=body, headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
        response = conn.getresponse()
        payload = response.read()
    finally:
        conn.close()
    if response.status == 200:
        return 200, "" if not payload else f"partial success ({len(payload)} bytes)"
    try:
        return response.status, status_pb2.Status.FromString(payload).message
    except Exception:   # report what came, whatever it is
        return response.status, payload[:200].decode("utf-8", "replace")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=8150, help="histogram points of the histograms request")
    parser.add_argument("--quantiles", type=int, default=200_000, help="quantile values of the summary point")
    parser.add_argument("--empties", type=int, default=200, help="requests without records (rate-limited token)")
    parser.add_argument("--kinds", default="histograms,summary,empty")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="eventide-otlp-hostile-"))
    config = _config(data)
    broker.start(config)
    proc: subprocess.Popen[bytes] | None = None
    try:
        broker.ensure_topics(config)
        log = data / "gateway.log"
        proc = start_gateway(config, log)
        port = config.gateway.port
        on_topic = 0
        for kind in args.kinds.split(","):
            if kind == "empty":
                empty = gzip.compress(ExportMetricsServiceRequest().SerializeToString())
                started = time.perf_counter()
                statuses = [_post(port, empty, LIMITED)[0] for _ in range(args.empties)]
                wall = time.perf_counter() - started
                print(f"empty: {args.empties} requests without records in {wall:.2f} s from a token of "
                      f"{LIMITED_RATE:g} units/s: {statuses.count(200)} answered 200, {statuses.count(429)} 429")
                continue
            body = gzip.compress(_histograms(args.points) if kind == "histograms" else _summary(args.quantiles), 9)
            Path(f"/proc/{proc.pid}/clear_refs").write_text("5")   # VmHWM back to the current RSS
            rss_before, cpu_before = _memory_kib(proc.pid, "VmRSS"), _cpu_s(proc.pid)
            started = time.perf_counter()
            status, message = _post(port, body)
            wall = time.perf_counter() - started
            cpu = _cpu_s(proc.pid) - cpu_before
            peak = _memory_kib(proc.pid, "VmHWM") - rss_before
            total, offsets = len(broker.read_committed(config, timeout_s=120)), _log_end(config)
            produced, on_topic = total - on_topic, total
            print(f"{kind}: {len(body):,} bytes gzipped -> {status} {message[:160]!r}")
            print(f"  records committed {produced:,} (log end offsets now {offsets:,}); gateway CPU {cpu:.2f} s; "
                  f"peak RSS growth {peak / 1024:.0f} MiB; wall {wall:.2f} s")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        broker.stop(config)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
