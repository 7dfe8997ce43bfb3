"""What one small insert costs the local store server, against a small query and idle (docs/performance.md, "Store
inserts at a real-time pace"): at a real-time pace the job makes several small inserts a second, and their number,
more than their rows, is the store's cost.

A fresh store served on a free port (``bench.dashboard_store.temporary_store``): its CPU (from ``/proc``) idle for
``--seconds``, then while it takes ``--per-second`` one-row inserts a second (the provisional rounds' record,
``query_watermarks_kept``) for ``--seconds``, merges of the parts they make included, then per ``SELECT 1``. Prints
JSON, milliseconds of the server's CPU:

    .venv/bin/python -m bench.probes.store_insert_cost --per-second 10 --seconds 20
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from clickhouse_connect.driver.client import Client

from analytics.progress import ROUND_TYPES
from bench.harness import REPO
from eventide.config import load_config
from stack.services import free_port
from store.client import connect
from store.migrations import apply_migrations
from store.server import child as served_store


def server_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-second", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="eventide-bench-insert-") as data:
        config = load_config(environ={}, root=str(REPO), paths={"data_dir": data},
                             store={"database": "bench", "port": free_port()})
        with served_store(config) as server:
            apply_migrations(config)
            with connect(config) as client:
                figures = measured(client, server.pid, args.per_second, args.seconds)
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "per_second": args.per_second,
                      "seconds": args.seconds, **figures}, indent=2))


def measured(client: Client, pid: int, per_second: int, seconds: int) -> dict[str, float]:
    """The server's CPU idle (ms per second), per insert beyond idle, and per ``SELECT 1`` (ms)."""
    time.sleep(5)    # the migrations' merges settle
    before = server_cpu_s(pid)
    time.sleep(seconds)
    idle_ms = (server_cpu_s(pid) - before) * 1e3 / seconds
    before, start = server_cpu_s(pid), time.perf_counter()
    for second in range(seconds):
        for n in range(per_second):
            client.insert("query_watermarks_kept", [[f"probe-{n}", datetime.fromtimestamp(0, UTC), datetime.now(UTC)]],
                          column_names=["query_name", "watermark", "recorded_at"], column_type_names=ROUND_TYPES)
        time.sleep(max(0.0, start + second + 1 - time.perf_counter()))
    inserts_ms = (server_cpu_s(pid) - before) * 1e3 / seconds
    before = server_cpu_s(pid)
    for _ in range(100):
        client.query("SELECT 1")
    select_ms = (server_cpu_s(pid) - before) * 1e3 / 100
    return {"idle_ms_per_s": round(idle_ms, 1), "insert_ms": round((inserts_ms - idle_ms) / per_second, 2),
            "select_1_ms": round(select_ms, 2)}


if __name__ == "__main__":
    main()
