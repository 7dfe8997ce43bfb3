"""HTTP gateway throughput: events/s and request latency for batches posted by concurrent clients.

Standalone by default: starts its own broker (free ports, temporary data dir), runs the gateway as a separate
process (``python -m ingest.gateway``, uvicorn) and posts ``--requests`` batches of ``--batch`` metric events
from ``--clients`` threads, each on its own keep-alive connection. Every response must be 200; afterwards a
``read_committed`` consumer counts the records on the topic, which must equal the events sent.
``--bootstrap host:port`` uses a running broker instead (``./run demo`` or any cluster; a fresh topic is made).

    .venv/bin/python bench/gateway_throughput.py --requests 400 --batch 500 --clients 4
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

from eventide import broker
from eventide.config import Config, load_config, to_environ
from eventide.services import free_port
from ingest.envelope import metric_event, now_ms

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
                                             "max_batch_events": max(args.batch, 1)})


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


def _post_all(port: int, bodies: list[bytes], clients: int, ndjson: bool) -> tuple[float, list[float]]:
    """Post every body, ``clients`` at a time; returns (wall seconds, per-request latencies)."""
    headers = {"Authorization": f"Bearer {TOKEN}",
               "Content-Type": "application/x-ndjson" if ndjson else "application/json"}
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
                conn.request("POST", "/v1/events", body=bodies[i], headers=headers)
                response = conn.getresponse()
                payload = response.read()
                elapsed = time.perf_counter() - started
                with lock:
                    latencies.append(elapsed)
                    if response.status != 200:
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


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
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
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="eventide-gateway-bench-"))
    config = _config(args, data)
    if config.kafka.managed:
        broker.start(config)
    proc: subprocess.Popen[bytes] | None = None
    try:
        broker.ensure_topics(config)
        log = data / "gateway.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "ingest.gateway"], stdout=out, stderr=subprocess.STDOUT,
                                    env={**os.environ, **to_environ(config)}, cwd=REPO)
        port = config.gateway.port
        _wait_healthy(port, proc, log)
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
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        if config.kafka.managed:
            broker.stop(config)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
