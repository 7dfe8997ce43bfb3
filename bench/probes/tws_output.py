"""What writing ``keyed_windows``' output costs a Spark Python worker: PySpark's writer (one Arrow record batch per
frame) against ``analytics.spark.tws_output``'s (consecutive frames joined, then one record batch). At a steady rate
each 5-s reader batch visits every session bucket that moved and yields a frame or two of a few rows for each
(docs/performance.md#the-python-stateful-operator), so the cost per frame, not per row, is what counts.

``--keys`` keys, each yielding ``--frames`` frames of ``--rows`` open-session rows (the query's 28 output columns),
written by each writer ``--repeat`` times into memory. Prints JSON: milliseconds per pass (the best) and per frame,
and the record batches each wrote:

    .venv/bin/python -m bench.probes.tws_output --keys 100 --frames 2 --rows 3
"""

from __future__ import annotations

import argparse
import io
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql.pandas.serializers import TransformWithStateInPandasSerializer
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType

from analytics.keyed.logic import _output
from analytics.keyed.schema import OUTPUT_SCHEMA
from analytics.spark import tws_output

_SPARK_TYPES = {"string": StringType(), "long": LongType(), "int": IntegerType(), "double": DoubleType()}
KEYED_OUTPUT = StructType([StructField(c.split()[0], _SPARK_TYPES[c.split()[1]]) for c in OUTPUT_SCHEMA.split(", ")])


def frame(key: int, rows: int) -> pd.DataFrame:
    """Open-session rows of one session bucket, as the query's processor yields them."""
    names = np.array([f"user-{key}-{i}" for i in range(rows)], dtype=object)
    return _output(rows, {"row_type": "open_session", "window_kind": "session", "app": f"app-{key % 5}",
                          "kind": "user", "name": names, "series_tags": "", "watermark_ms": 1_700_000_000_000,
                          "window_start_ms": np.arange(rows, dtype=np.int64), "event_count": np.ones(rows, np.int64),
                          "window_end_ms": np.arange(rows, dtype=np.int64) + 30_000})


def timed(dump: Callable[..., None], per_key: list[list[pd.DataFrame]], repeat: int) -> tuple[float, int]:
    """Seconds per pass (the best of ``repeat``) and the record batches a pass wrote."""
    best, raw = float("inf"), b""
    for _ in range(repeat):
        serializer = TransformWithStateInPandasSerializer(
            timezone="UTC", safecheck=False, assign_cols_by_name=True, prefer_int_ext_dtype=False,
            arrow_max_records_per_batch=10_000, arrow_max_bytes_per_batch=2**31 - 1,
            int_to_decimal_coercion_enabled=False)
        sink = io.BytesIO()
        start = time.perf_counter()
        dump(serializer, (((iter(frames), KEYED_OUTPUT),) for frames in per_key), sink)
        best = min(best, time.perf_counter() - start)
        raw = sink.getvalue()
    batches = len(list(pa.ipc.open_stream(io.BytesIO(raw[4:])))) if raw else 0
    return best, batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--frames", type=int, default=2, help="frames per key")
    parser.add_argument("--rows", type=int, default=3, help="rows per frame")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    per_key = [[frame(k, args.rows) for _ in range(args.frames)] for k in range(args.keys)]
    frames = args.keys * args.frames
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "keys": args.keys, "frames": frames,
                           "rows": frames * args.rows}
    for name, dump in (("pyspark", TransformWithStateInPandasSerializer.dump_stream),
                       ("joined", tws_output.dump_stream)):
        seconds, batches = timed(dump, per_key, args.repeat)
        out[name] = {"ms_per_pass": round(seconds * 1e3, 2), "ms_per_frame": round(seconds * 1e3 / frames, 3),
                     "record_batches": batches}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
