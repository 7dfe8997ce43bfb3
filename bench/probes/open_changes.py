"""What telling a reader batch's open-session changes costs ``keyed_windows``' processor per call
(``analytics.keyed.sessions.open_changes``; docs/performance.md, "What would move it"): at a steady rate each 5-s
reader batch visits every session key that moved, a session or two each, so the cost per key, not per event, is what
counts.

A bucket of ``--keys`` session keys, each with an open session; half of them take a run that extends or opens one
(some merging two), as ``add_bucket_events`` leaves them; then their changes are asked ``--calls`` times. Prints JSON,
milliseconds per call:

    .venv/bin/python -m bench.probes.open_changes --keys 500 --calls 200
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd

from analytics.keyed import sessions
from analytics.keyed.events import Events

GAP_MS = 30_000


def events(times: list[int]) -> Events:
    n = len(times)
    return Events.from_frame(pd.DataFrame({
        "t": times, "metric_value": [1.0] * n, "level": [None] * n, "kind": ["metric"] * n, "partition": [0] * n,
        "offset": list(range(n)), "id": [f"e{i}" for i in range(n)], "device": ["d"] * n}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    keys = np.array([f"user-{i}" for i in range(args.keys)], dtype=object)
    bucket: sessions.SessionBucket = {}
    sessions.add_bucket_events(bucket, keys, events(rng.integers(0, 60_000, args.keys).tolist()), 0, GAP_MS)
    moved = keys[rng.permutation(args.keys)[: args.keys // 2]]
    before = sessions.open_before(bucket, moved)
    sessions.add_bucket_events(bucket, moved, events(rng.integers(30_000, 120_000, len(moved)).tolist()), 10_000,
                               GAP_MS)
    start = time.perf_counter()
    for _ in range(args.calls):
        changes = sessions.open_changes(bucket, before, 10_000, GAP_MS)
    ms = (time.perf_counter() - start) / args.calls * 1e3
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "keys": args.keys, "moved": len(moved),
                      "open_rows": len(changes.keys), "gone_rows": len(changes.gone_keys),
                      "ms_per_call": round(ms, 3)}, indent=2))


if __name__ == "__main__":
    main()
