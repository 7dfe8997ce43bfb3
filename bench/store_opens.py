"""What one embedded-store open costs a long-running process: time, and the threads and descriptors it keeps.

Every ``store.client.connect`` on a ``chdb://`` URL starts chDB's engine and stops it again (one process per data
directory, so processes take turns). Measured here: with MergeTree tables in the directory (as after migrations),
each start leaves threads and ``/proc`` descriptors behind in the process; a data directory without MergeTree
tables does not. The job, the alert evaluator and the dashboard open the store repeatedly, so this is their growth
rate per open; a ClickHouse server URL has none of it.

    .venv/bin/python bench/store_opens.py --opens 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from eventide.config import load_config
from store.client import connect
from store.migrations import apply_migrations


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--opens", type=int, default=200)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as root:
        config = load_config(environ={}, root=root, store={"database": "bench"})
        apply_migrations(config)
        with connect(config) as client:      # the first open after migrating loads everything once
            client.query("SELECT 1")
        start_threads, start_fds = threads(), descriptors()
        seconds = []
        for _ in range(args.opens):
            began = time.perf_counter()
            with connect(config) as client:
                client.query("SELECT count() FROM window_aggregates")
            seconds.append(time.perf_counter() - began)
        grown_threads, grown_fds = threads() - start_threads, descriptors() - start_fds

    print(f"store: chDB (migrated schema), {args.opens} opens of one query each")
    print(f"open+query+close: median {statistics.median(seconds) * 1000:.1f} ms, "
          f"max {max(seconds) * 1000:.1f} ms")
    print(f"kept per open:    {grown_threads / args.opens:.2f} threads, {grown_fds / args.opens:.2f} descriptors "
          f"(process now {threads()} threads, {descriptors()} descriptors)")


if __name__ == "__main__":
    main()
