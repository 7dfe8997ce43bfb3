"""End-to-end throughput: how many events/s the stream job (all its queries) processes from Kafka into ClickHouse.

Starts its own broker (free ports, temporary data dir), loads N demo-like events into the events topic with the
SDK, then times the job draining that backlog (Spark startup excluded) with the configured window specs.

    .venv/bin/python bench/e2e_throughput.py --events 200000
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from eventide import broker
from eventide.config import load_config
from eventide.services import free_port
from ingest.envelope import now_ms
from ingest.sdk import Client
from store.client import connect
from store.migrations import apply_migrations

REPO = Path(__file__).resolve().parent.parent



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=200_000)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="eventide-bench-"))
    config = load_config(environ={}, root=str(REPO),
                         paths={"data_dir": str(data), "cache_dir": str(REPO / ".cache")},
                         kafka={"port": free_port(), "controller_port": free_port()},
                         stream={"max_offsets_per_trigger": args.max_offsets_per_trigger,
                                 # every window kind on: one metric series also gets sliding windows
                                 "sliding_series": [{"app": "*", "kind": "metric", "name": "latency_ms"}]})
    broker.start(config)
    try:
        broker.ensure_topics(config)
        apply_migrations(config)
        rng = random.Random(1)
        clients = [Client(f"app-{a}", f"device-{a}-{d}", config=config) for a in range(5) for d in range(20)]

        def load(start_ms: int) -> float:
            """One hour of history from start_ms (~55 events/s per series); returns seconds taken."""
            t = time.perf_counter()
            for i in range(args.events):
                client, at = clients[i % len(clients)], start_ms + i * 3_600_000 // args.events
                user = f"user-{rng.randrange(10_000)}"
                if i % 10 == 9:    # 10% logs, a fifth of them warning or above (sliding windows)
                    client.log(("info", "info", "info", "info", "warning")[i % 5] if i % 20 else "error",
                               "request done", name="app.http", user=user, event_time=at)
                else:
                    client.metric(("latency_ms", "cart_value", "queue_depth")[i % 3], rng.lognormvariate(3, 1),
                                  user=user, event_time=at)
            for client in clients:
                client.flush()
            return time.perf_counter() - t

        from analytics.job import run_until_idle, spark_session

        spark = spark_session(config, app_name="eventide-bench")
        # Round 1 warms the JVM (code generation, class loading); round 2, one hour later in event time, is
        # the steady state that is reported.
        load(now_ms() - 2 * 3_600_000)
        run_until_idle(spark, config)
        produce_s = load(now_ms() - 3_600_000)
        t = time.perf_counter()
        queries = run_until_idle(spark, config)
        job_s = time.perf_counter() - t
        with connect(config) as ch:
            counted = ch.query("SELECT sum(event_count) FROM window_aggregates FINAL "
                               "WHERE window_length_ms = 10000").result_rows[0][0]
        batches = {q.name: len(q.recentProgress) for q in queries}
        with connect(config) as ch:
            state = ch.query("SELECT query_name, argMax(state_rows, batch_id), argMax(state_memory_bytes, batch_id) "
                             "FROM pipeline_progress GROUP BY query_name ORDER BY query_name").result_rows
            stored = {t: ch.query(f"SELECT count() FROM {t} FINAL").result_rows[0][0]
                      for t in ("window_aggregates", "sliding_windows", "sessions", "stragglers")}
        checkpoint_bytes = {q.name: sum(f.stat().st_size for f in (config.checkpoint_dir / q.name).rglob("*")
                                        if f.is_file()) for q in queries}
        print(f"events per round:     {args.events}")
        print(f"windows counted:      {counted} events (10 s windows, both rounds)")
        print(f"SDK produce:          {args.events / produce_s:,.0f} events/s ({produce_s:.1f} s)")
        print(f"job drain:            {args.events / job_s:,.0f} events/s ({job_s:.1f} s, "
              f"{len(queries)} queries, batches per query {batches})")
        for name, rows, memory in state:
            print(f"state {name:<13} {rows:>9,} rows, {memory / 2**20:8.1f} MiB in memory (last batch), "
                  f"checkpoint {checkpoint_bytes.get(name, 0) / 2**20:.1f} MiB on disk")
        print(f"stored rows:          {stored}")
        for q in queries:
            for progress in q.recentProgress:
                if progress["numInputRows"]:
                    print(f"  {q.name:<13} batch {progress['batchId']}: {progress['numInputRows']} rows, "
                          f"durations ms {progress['durationMs']}")
        spark.stop()
    finally:
        broker.stop(config)


if __name__ == "__main__":
    main()
