"""What loading and saving one session bucket's state row costs ``keyed_windows`` per key and batch, by how many
session keys the bucket remembers ("The trigger: no shorter than the readers' batch").

A bucket of ``--users`` keys (1-3 open and closed sessions each) is stored once; each round loads it, replaces the
sessions of ``--touched`` keys (what a batch does), computes its next due time and stores it again, as the
processor does: lazily (``sessions.unpack``, keys built only when asked for) and key by key (every key built, the
way the bucket was read before). Prints JSON, milliseconds per round:

    .venv/bin/python -m bench.probes.session_bucket --users 80,800 --touched 5 --rounds 200
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable

import numpy as np

from analytics.keyed import sessions
from analytics.keyed.sessions import COUNT_COLUMNS, SessionState, StoredBucket

GAP_MS, MEMORY_MS = 300_000, 86_400_000


def a_state(rng: random.Random) -> SessionState:
    def times(n: int) -> np.ndarray:
        return np.array(sorted(rng.randint(0, 10**9) for _ in range(n)), np.int64)

    n_open, n_closed = rng.randint(1, 3), rng.randint(1, 3)
    return SessionState(times(n_open), times(n_open) + 1000,
                        np.ones((n_open, len(COUNT_COLUMNS)), np.int64), times(n_closed), times(n_closed) + 500)


def a_batch(bucket: sessions.SessionBucket, changes: list[SessionState]) -> None:
    """What a batch does to its bucket: some keys' sessions replaced, the next due time, the row stored."""
    for i, state in enumerate(changes):
        bucket[f"user-{i}"] = state
    sessions.bucket_next_due(bucket, GAP_MS, MEMORY_MS)
    sessions.pack(bucket)


def timed_ms(load: Callable[[sessions.Packed], sessions.SessionBucket], stored: sessions.Packed,
             changes: list[SessionState], rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        a_batch(load(stored), changes)
    return round((time.perf_counter() - start) / rounds * 1000, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", default="80,800", help="comma-separated bucket sizes (session keys)")
    parser.add_argument("--touched", type=int, default=5, help="keys a batch changes")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    rng = random.Random(7)
    out = {}
    for users in (int(u) for u in args.users.split(",")):
        stored = sessions.pack({f"user-{i}": a_state(rng) for i in range(users)})
        changes = [a_state(rng) for _ in range(args.touched)]
        out[users] = {"lazy_ms": timed_ms(sessions.unpack, stored, changes, args.rounds),
                      "key_by_key_ms": timed_ms(lambda row: dict(StoredBucket(row).items()), stored, changes,
                                                args.rounds)}
    print(json.dumps({"touched": args.touched, "rounds": args.rounds, "per_round_by_users": out}))


if __name__ == "__main__":
    main()
