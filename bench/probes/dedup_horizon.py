"""What choosing first copies costs one partition's ``accept`` task per batch at a real-time pace, where a batch holds
a second of events and the horizon hundreds of batches of them (docs/performance.md, "Dedup per partition, in the
tasks").

One partition's memory (``dedup.AcceptedIds``) holds ``--horizon-ids`` accepted keys in batches of ``--batch``; each
round a new batch of ``--batch`` events (1 % of them copies of horizon keys) is checked against the horizon less its
oldest batch, then remembered, as the task does. Timed per round: the horizon's keys probed against the batch's
(``dedup.first_copies``, what every batch did before), and the horizon's hashes asked first
(``AcceptedIds.first_copies``) with the batch remembered. Both answers are compared in every round. Prints JSON,
milliseconds per batch (median):

    .venv/bin/python -m bench.probes.dedup_horizon --horizon-ids 825000 --batch 2500 --rounds 40
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import uuid

import numpy as np
import pyarrow as pa

from analytics.accept import dedup
from analytics.accepted_log import BatchMeta
from eventide.config import load_config


def a_batch(ids: list[str], first_offset: int) -> pa.Table:
    n = len(ids)
    return pa.table({"app": ["shop"] * n, "id": ids,
                     "kafka_timestamp": pa.array(np.arange(n), pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
                     "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array(np.arange(first_offset, first_offset + n), pa.int64())})


def meta(batch_id: int, events: int) -> BatchMeta:
    return BatchMeta(batch_id, {"events": {"0": 0}}, {"events": {"0": events}}, 0, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--horizon-ids", type=int, default=825_000)
    parser.add_argument("--batch", type=int, default=2_500)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as root:
        config = load_config(environ={}, root=root, paths={"data_dir": f"{root}/var"})
        memory = dedup.AcceptedIds(config, 0)
        metas, held = [], []
        for batch_id in range(args.horizon_ids // args.batch):
            ids = [str(uuid.uuid4()) for _ in range(args.batch)]
            memory.remember(batch_id, a_batch(ids, 0).select(["app", "id"]))
            metas.append(meta(batch_id, args.batch))
            held.extend(ids)
        keys_ms, hashes_ms = [], []
        for step in range(args.rounds):
            batch_id = len(metas)
            copies = rng.sample(held, args.batch // 100)
            batch = a_batch([str(uuid.uuid4()) for _ in range(args.batch - len(copies))] + copies, batch_id * 10**6)
            within = metas[step + 1:]
            start = time.perf_counter()
            by_keys = dedup.first_copies(batch, memory.of(within))
            probed = time.perf_counter()
            by_hashes = memory.first_copies(batch, within)
            memory.remember(batch_id, batch.select(["app", "id"]).filter(by_hashes))
            done = time.perf_counter()
            if not by_keys.equals(by_hashes):
                raise AssertionError(f"round {step}: the hashes chose other first copies than the keys")
            keys_ms.append((probed - start) * 1e3)
            hashes_ms.append((done - probed) * 1e3)
            metas.append(meta(batch_id, args.batch))
        print(json.dumps({
            "date": time.strftime("%Y-%m-%d %H:%M"), "horizon_ids": args.horizon_ids, "batch": args.batch,
            "rounds": args.rounds, "keys_probed_ms": round(float(np.median(keys_ms)), 2),
            "hashes_then_keys_ms": round(float(np.median(hashes_ms)), 2),
            "hash_memory_bytes_per_key": round(memory.nbytes(metas[-len(within):]) / args.horizon_ids, 1),
        }, indent=2))


if __name__ == "__main__":
    main()
