"""The input loader of transformWithStateInPandas alone: PySpark's row-by-row one against ``analytics.spark.tws_input``.

Builds one Arrow stream shaped like ``keyed_windows``' input as Spark sends it to a Python worker (rows sorted by
key, batches of ``spark.sql.execution.arrow.maxRecordsPerBatch`` = 10,000 rows; 9 columns: JSON key, time, level
code, value, Kafka position, id, device, session key) and times each loader handing every key's frames to a
consumer that only selects the value columns, as the worker does. No Spark: the loaders' own cost per row.

    .venv/bin/python -m bench.probes.tws_input --rows 150000 --keys 130

Prints one JSON line: seconds per pass (min of ``--repeat``) and µs per row for each loader.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.serializers import TransformWithStateInPandasSerializer

from analytics.spark import tws_input

SCHEMA = pa.schema([("key", pa.string()), ("t", pa.int64()), ("level_code", pa.int8()), ("metric_value", pa.float64()),
                    ("partition", pa.int32()), ("offset", pa.int64()), ("id", pa.string()), ("device", pa.string()),
                    ("session", pa.string())])
BATCH_ROWS = 10_000


def arrow_stream(rows: int, keys: int) -> bytes:
    rng = np.random.default_rng(1)
    key = np.sort(rng.integers(0, keys, rows))
    table = pa.table({
        "key": [f'["session","app-{k % 5}","","{k}",""]' for k in key],
        "t": 1_700_000_000_000 + rng.integers(0, 3_600_000, rows),
        "level_code": rng.integers(-1, 4, rows).astype(np.int8),
        "metric_value": np.where(rng.random(rows) < 0.1, np.nan, rng.random(rows)),
        "partition": rng.integers(0, 4, rows).astype(np.int32), "offset": np.arange(rows),
        "id": [f"id-{i}" for i in range(rows)], "device": [f"dev-{i % 200}" for i in range(rows)],
        "session": [f"user\x1euser-{i % 5000}" for i in range(rows)],
    }, schema=SCHEMA)
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        for batch in table.to_batches(max_chunksize=BATCH_ROWS):
            writer.write_batch(batch)
    return sink.getvalue()


def one_pass(load_stream: Any, stream: bytes) -> tuple[float, int]:
    serializer = TransformWithStateInPandasSerializer("UTC", False, True, BATCH_ROWS, 2**31 - 1, False)
    serializer.key_offsets = [0]
    started, rows = time.perf_counter(), 0
    for _, _, chunks in load_stream(serializer, io.BytesIO(stream)):
        for _, frame in chunks or ():
            rows += len(frame.iloc[:, 1:])   # the worker hands the processor the value columns
    return time.perf_counter() - started, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=150_000)
    parser.add_argument("--keys", type=int, default=130)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    stream = arrow_stream(args.rows, args.keys)
    result: dict[str, Any] = {"rows": args.rows, "keys": args.keys}
    for name, loader in (("pyspark", tws_input._pyspark_load_stream), ("tws_input", tws_input.load_stream)):
        passes = [one_pass(loader, stream) for _ in range(args.repeat)]
        assert all(rows == args.rows for _, rows in passes)
        seconds = min(s for s, _ in passes)
        result[name] = {"seconds": round(seconds, 4), "us_per_row": round(seconds / args.rows * 1e6, 2)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
