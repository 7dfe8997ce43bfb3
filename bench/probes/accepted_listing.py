"""What listing the accepted log's published batches costs (``accepted_log.metas``), which each ``accept`` task's
dedup horizon, each provisional round and the writer do several times a second at a real-time pace
(docs/performance.md, "The readers' listing of the accepted log").

``--batches`` published batches laid out as ``accepted_log.publish`` leaves them (metadata file and batch directory;
no events), listed ``--calls`` times after a first listing. Prints JSON, milliseconds per listing:

    .venv/bin/python -m bench.probes.accepted_listing --batches 400 --calls 200
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict

from analytics import accepted_log
from analytics.accepted_log import BatchMeta
from eventide.config import load_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        config = load_config(environ={}, root=root, paths={"data_dir": f"{root}/var"})
        meta_dir = config.accepted_events_dir / "_meta"
        meta_dir.mkdir(parents=True)
        for batch_id in range(args.batches):
            meta = BatchMeta(batch_id, {"events": {str(p): 0 for p in range(4)}},
                             {"events": {str(p): 100 for p in range(4)}}, 0, 0)
            (meta_dir / f"{batch_id}.json").write_text(json.dumps(asdict(meta)))
            accepted_log.batch_dir(config.accepted_events_dir, batch_id).mkdir(parents=True)
        first = time.perf_counter()
        listed = len(accepted_log.metas(config))
        start = time.perf_counter()
        for _ in range(args.calls):
            accepted_log.metas(config)
        done = time.perf_counter()
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "batches": listed, "calls": args.calls,
                      "first_listing_ms": round((start - first) * 1e3, 2),
                      "listing_ms": round((done - start) / args.calls * 1e3, 3)}, indent=2))


if __name__ == "__main__":
    main()
