"""The floor of a Python stateful operator in Spark: events shaped like ``keyed_windows``' input, a processor that
only counts rows per key, through ``transformWithStateInPandas`` (what the job uses) or ``applyInPandasWithState``.

Whatever ``keyed_windows`` does per event comes on top of this; the difference between the two APIs is what moving
the query to the other one could save at most (issue 10). Writes 2 Parquet files of ``--events / 2`` rows (9
columns as the query's input: time, level code, value, Kafka position, id, device, JSON key, session key; 64
buckets x 5 apps = 320 keys) and drains them one file per micro-batch, as the job's readers do.

    .venv/bin/python -m bench.probes.stateful_overhead --api tws --events 300000
    .venv/bin/python -m bench.probes.stateful_overhead --api applyInPandasWithState --events 300000

Prints one JSON line: events/s of the drain and ``addBatch`` / ``allUpdatesTimeMs`` per micro-batch (the second
batch is the warm one: the first includes the Python workers' start).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[2]

APIS = ("tws", "applyInPandasWithState")
KEYS_PER_APP, APPS, USERS = 64, 5, 5_000


def write_input(directory: Path, events: int) -> None:
    """Two Parquet files of keyed_windows-shaped rows, in event-time order."""
    rng = np.random.default_rng(1)
    for part in range(2):
        n = events // 2
        t = 1_700_000_000_000 + part * n * 1000 + np.arange(n) * 1000
        users, apps = rng.integers(0, USERS, n), rng.integers(0, APPS, n)
        pd.DataFrame({
            "ts": pd.to_datetime(t, unit="ms", utc=True), "t": t, "level_code": np.full(n, -1, np.int8),
            "metric_value": rng.random(n), "partition": (np.arange(n) % 4).astype(np.int32),
            "offset": np.arange(n, dtype=np.int64), "id": [f"id-{i}" for i in range(n)],
            "device": [f"dev-{u % 200}" for u in users],
            "key": [f'["session","app-{a}","","{u % KEYS_PER_APP}",""]' for a, u in zip(apps, users, strict=True)],
            "session": [f"user\x1euser-{u}" for u in users],
        }).to_parquet(directory / f"{part}.parquet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", choices=APIS, default="tws")
    parser.add_argument("--events", type=int, default=300_000)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle, TimerValues

    from analytics.job import spark_session
    from eventide.config import load_config

    class CountRows(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.seen = handle.getValueState("seen", "n long")

        def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                            timerValues: TimerValues) -> Iterator[pd.DataFrame]:
            total = sum(len(r) for r in rows) + (self.seen.get()[0] if self.seen.exists() else 0)
            self.seen.update((total,))
            yield pd.DataFrame({"key": [key[0]], "n": [total]})

        def close(self) -> None:
            pass

    def count_rows(key: Any, frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        total = sum(len(f) for f in frames) + (state.get[0] if state.exists else 0)
        state.update((total,))
        yield pd.DataFrame({"key": [key[0]], "n": [total]})

    with tempfile.TemporaryDirectory(prefix="stateful-overhead-") as tmp:
        source = Path(tmp) / "in"
        source.mkdir()
        write_input(source, args.events)
        # The job's own session (settings, state store, JVM options), with its scratch files in the temporary dir.
        spark = spark_session(load_config(environ={}, root=str(REPO), paths={"data_dir": tmp}),
                              app_name="eventide-stateful-overhead")
        events = (spark.readStream.schema(spark.read.parquet(str(source)).schema)
                  .option("maxFilesPerTrigger", 1).parquet(str(source)).withWatermark("ts", "30 seconds"))
        grouped = events.groupBy("key")
        if args.api == "tws":
            counted = grouped.transformWithStateInPandas(CountRows(), "key string, n long", "Append", "EventTime")
        else:
            counted = grouped.applyInPandasWithState(count_rows, "key string, n long", "n long", "append",
                                                     GroupStateTimeout.EventTimeTimeout)
        started = time.perf_counter()
        query = (counted.writeStream.foreachBatch(lambda batch, _: batch.count())
                 .option("checkpointLocation", str(Path(tmp) / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        seconds = time.perf_counter() - started
        batches = [{"rows": p.numInputRows, "addBatch_ms": p.durationMs.get("addBatch"),
                    "allUpdatesTimeMs": sum(o.allUpdatesTimeMs for o in p.stateOperators)}
                   for p in query.recentProgress if p.numInputRows]
        print(json.dumps({"api": args.api, "events": args.events, "seconds": round(seconds, 2),
                          "events_per_s": round(args.events / seconds), "batches": batches}))
        spark.stop()


if __name__ == "__main__":
    main()
