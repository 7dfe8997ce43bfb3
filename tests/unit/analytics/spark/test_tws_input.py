"""The vectorised input loader of transformWithStateInPandas hands the processor what PySpark's own loader hands
it: the same keys in the same order, the same rows in the same chunks (cut at maxRecordsPerBatch and
maxBytesPerBatch), on Arrow streams built here (no Spark needed)."""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.pandas.serializers import TransformWithStateInPandasSerializer

from analytics.spark import tws_input

SCHEMA = pa.schema([("app", pa.string()), ("bucket", pa.int32()), ("t", pa.int64()), ("level_code", pa.int8()),
                    ("metric_value", pa.float64()), ("id", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
NO_BYTES_LIMIT = 2**31 - 1


def arrow_stream(rows: list[dict[str, Any]], batch_sizes: list[int]) -> bytes:
    """The rows (already in key order, as Spark sends them) as one Arrow IPC stream cut into these batches."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        start = 0
        for size in batch_sizes:
            writer.write_batch(pa.RecordBatch.from_pylist(rows[start:start + size], schema=SCHEMA))
            start += size
        assert start == len(rows)
    return sink.getvalue()


def loaded(load_stream: Any, stream: bytes, max_records: int, max_bytes: int, key_offsets: list[int]) -> list:
    """What a worker's processor sees: (mode, key, [(key, rows as plain tuples, columns, index)])."""
    serializer = new_serializer(max_records, max_bytes)
    serializer.key_offsets = key_offsets
    seen = []
    for mode, key, chunks in load_stream(serializer, io.BytesIO(stream)):
        frames = None if chunks is None else [(chunk_key, plain(frame), list(frame.columns), list(frame.index))
                                              for chunk_key, frame in chunks]
        seen.append((mode, normalised(key), frames))
    return seen


def new_serializer(max_records: int, max_bytes: int) -> TransformWithStateInPandasSerializer:
    """The serializer as a worker makes it."""
    return TransformWithStateInPandasSerializer(
        timezone="UTC", safecheck=False, assign_cols_by_name=True, prefer_int_ext_dtype=False,
        arrow_max_records_per_batch=max_records, arrow_max_bytes_per_batch=max_bytes,
        int_to_decimal_coercion_enabled=False)


def plain(frame: pd.DataFrame) -> list[tuple]:
    """Row values without dtypes (int8 and int64 alike) and with one spelling of missing."""
    return [tuple(normalised(v) for v in row) for row in frame.itertuples(index=False, name=None)]


def normalised(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(normalised(v) for v in value)
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NaT:
        return "<missing>"
    return value.item() if isinstance(value, np.generic) else value


def assert_same_as_pyspark(stream: bytes, max_records: int = 10_000, max_bytes: int = NO_BYTES_LIMIT,
                           key_offsets: list[int] | None = None) -> list:
    offsets = key_offsets if key_offsets is not None else [0, 1]
    theirs = loaded(tws_input._pyspark_load_stream, stream, max_records, max_bytes, offsets)
    ours = loaded(tws_input.load_stream, stream, max_records, max_bytes, offsets)
    assert ours == theirs
    return ours


def event(app: str | None, bucket: int | None, i: int) -> dict[str, Any]:
    return {"app": app, "bucket": bucket, "t": 1_700_000_000_000 + i, "level_code": -1 if i % 3 else 2,
            "metric_value": None if i % 4 == 0 else i / 10, "id": None if i % 5 == 0 else f"id-{i}" * (1 + i % 7),
            "ts": pd.Timestamp(1_700_000_000_000 + i, unit="ms", tz="UTC")}


def test_given_keys_in_runs_each_key_gets_its_rows_in_order_even_across_batches():
    keys = [("a", 1)] * 3 + [("a", 2)] * 4 + [("b", 2)] * 5 + [("c", 0)]
    rows = [event(app, bucket, i) for i, (app, bucket) in enumerate(keys)]
    seen = assert_same_as_pyspark(arrow_stream(rows, [2, 4, 6, 1]))   # ("a", 2) and ("b", 2) span batches
    data = [(key, chunks) for mode, key, chunks in seen if chunks is not None]
    assert [key for key, _ in data] == [("a", 1), ("a", 2), ("b", 2), ("c", 0)]
    assert [[len(rows) for _, rows, _, _ in chunks] for _, chunks in data] == [[3], [4], [5], [1]]
    assert [mode.name for mode, _, _ in seen[-2:]] == ["PROCESS_TIMER", "COMPLETE"]


def test_a_key_with_more_rows_than_max_records_comes_in_chunks_of_max_records():
    rows = [event("a", 1, i) for i in range(23)] + [event("b", 1, i) for i in range(23, 25)]
    seen = assert_same_as_pyspark(arrow_stream(rows, [7, 7, 7, 4]), max_records=5)
    assert [len(rows) for _, rows, _, index in seen[0][2]] == [5, 5, 5, 5, 3]
    assert all(index == list(range(len(index))) for _, _, _, index in seen[0][2])


def test_chunks_end_where_pyspark_ends_them_by_bytes_as_the_average_row_size_changes():
    # ids grow from batch to batch, so the running average row size, hence the chunk length, changes mid-key
    rows = [{**event("a", 1, i), "id": "x" * (1 + 40 * (i // 10))} for i in range(60)]
    seen = assert_same_as_pyspark(arrow_stream(rows, [10] * 6), max_records=1_000, max_bytes=700)
    lengths = [len(rows) for _, rows, _, _ in seen[0][2]]
    assert len(set(lengths[:-1])) > 1, lengths   # the stream really exercises a changing limit


def test_max_records_zero_means_no_limit_as_in_pyspark():
    # PySpark 4.2 takes maxRecordsPerBatch = 0 as no limit (4.1 cut after every row).
    rows = [event("a", 1, i) for i in range(3)] + [event("b", 1, 3)]
    seen = assert_same_as_pyspark(arrow_stream(rows, [2, 2]), max_records=0)
    assert [len(rows) for _, rows, _, _ in seen[0][2]] == [3]


def test_rows_whose_key_is_missing_are_one_key_as_spark_grouped_them():
    # PySpark's loader compares NaN keys by object identity, so whether such rows stay together varies; Spark
    # grouped them as one key, and so does this loader.
    keys = [(None, 1), (None, 1), (None, None), (None, None), (None, None), ("a", None)]
    rows = [event(app, bucket, i) for i, (app, bucket) in enumerate(keys)]
    ours = loaded(tws_input.load_stream, arrow_stream(rows, [3, 3]), 10_000, NO_BYTES_LIMIT, [0, 1])
    groups = [([chunk_key for chunk_key, _, _, _ in chunks], sum(len(rows) for _, rows, _, _ in chunks))
              for _, _, chunks in ours if chunks is not None]
    assert groups == [([(None, 1)], 2), ([(None, None)], 3), ([("a", None)], 1)]


@pytest.mark.parametrize("seed", range(20))
def test_random_streams_load_the_same(seed: int):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    key_count = int(rng.integers(1, 30))
    keys = sorted(rng.integers(0, key_count, n).tolist())
    rows = [event(f"app-{k % 3}", k, i) for i, k in enumerate(keys)]
    sizes = []
    while sum(sizes) < n:
        sizes.append(min(int(rng.integers(1, 120)), n - sum(sizes)))
    max_records = int(rng.integers(1, 50))
    max_bytes = NO_BYTES_LIMIT if seed % 2 else int(rng.integers(200, 5_000))
    assert_same_as_pyspark(arrow_stream(rows, sizes), max_records, max_bytes, key_offsets=[[0, 1], [1]][seed % 2])


def test_install_is_limited_to_checked_pyspark_versions(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(TransformWithStateInPandasSerializer, "load_stream", tws_input._pyspark_load_stream)
    monkeypatch.setattr(tws_input.pyspark, "__version__", "9.0.0")
    assert not tws_input.install()
    assert TransformWithStateInPandasSerializer.load_stream is tws_input._pyspark_load_stream
    monkeypatch.setattr(tws_input.pyspark, "__version__", "4.2.1")
    assert tws_input.install()
    assert TransformWithStateInPandasSerializer.load_stream is tws_input.load_stream
