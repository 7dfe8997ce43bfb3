"""Throughput of the whole job on the 2-worker Spark standalone cluster next to ``local[*]``, same machine (issue 13).

Starts ``eventide cluster`` (3 brokers, master + workers) on free ports with a temporary data dir and a store server of
its own, produces one backlog of the bench's event mix (``bench.harness``), then drains it twice with every query of the
job, each time through ``spark-submit --until-idle`` (``eventide job --submit``) on a fresh checkpoint and store
database: once with ``--master local[*]``, once with the cluster's master. Both read the same topic on the same 3
brokers, so only the Spark deployment differs.

Each drain is timed from its first micro-batch (the first offsets file of ``accept``) to its last commit (the
last of ``windows`` / ``keyed_windows``): JVM start and executor registration are not in it. Spark's JVM is not
warmed up beforehand in either run.

    .venv/bin/python -m bench.cluster --events 100000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from analytics.job import QUERIES
from analytics.vocabulary import ACCEPT_QUERY
from bench.harness import Load, fresh, produce_backlog
from eventide.config import ClusterConfig, Config, load_config
from eventide.envelope import now_ms
from stack import cluster
from stack.services import free_port
from store.server import child as served_store

REPO = Path(__file__).resolve().parent.parent


def drained_seconds(config: Config) -> float:
    """First offsets file of the accept query to the last commit of any query: the processing span."""
    first = min(p.stat().st_mtime for p in (config.checkpoint_dir / ACCEPT_QUERY / "offsets").glob("[0-9]*"))
    last = max(p.stat().st_mtime for q in QUERIES for p in (config.checkpoint_dir / q / "commits").glob("[0-9]*"))
    return last - first


def drain(config: Config, events: int, log: Path) -> dict[str, Any]:
    started = time.perf_counter()
    with open(log, "wb") as out:
        done = subprocess.run(cluster.submit_argv(config, until_idle=True), cwd=REPO, stdout=out,
                              stderr=subprocess.STDOUT, env={**os.environ, **cluster.submit_env(config)})
    if done.returncode:
        raise RuntimeError(f"spark-submit failed ({done.returncode}); see {log}")
    seconds = drained_seconds(config)
    return {"master": config.stream.master, "seconds": round(seconds, 1), "events_per_s": round(events / seconds),
            "wall_s_with_startup": round(time.perf_counter() - started, 1),
            "load_average_1m_after": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--out", type=Path, help="also write the JSON summary here")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="eventide-bench-cluster-"))
    base = load_config(environ={}, root=str(REPO),
                       paths={"data_dir": str(data), "cache_dir": str(REPO / ".cache")},
                       store={"port": free_port()})
    base = base.model_copy(update={"cluster": ClusterConfig(
        kafka_ports=[free_port() for _ in range(3)], kafka_controller_ports=[free_port() for _ in range(3)],
        spark_master_port=free_port(), spark_master_webui_port=free_port(),
        spark_worker_webui_ports=[free_port(), free_port()])})
    summary: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "events": args.events, "cores": os.cpu_count()}
    try:
        cluster.up(base)
        on_cluster = cluster.job_config(base)
        with served_store(on_cluster):
            summary["load"] = produce_backlog(on_cluster, Load(events=args.events), now_ms() - 2 * 3_600_000)
            # The same state partitions on both (unset, their count follows the master): only the deployment differs.
            local = on_cluster.model_copy(update={"stream": on_cluster.stream.model_copy(
                update={"master": "local[*]", "driver_host": "",
                        "shuffle_partitions": on_cluster.stream.partitions})})
            for label, config in (("local", local), ("cluster", on_cluster)):
                summary[label] = drain(fresh(config, label), args.events, data / f"{label}.log")
                print(f"[{label}] {json.dumps(summary[label])}", file=sys.stderr, flush=True)
    finally:
        cluster.down(base)
        shutil.rmtree(data, ignore_errors=True)
    summary["cluster_over_local"] = round(summary["cluster"]["events_per_s"] / summary["local"]["events_per_s"], 2)
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
