"""The joining output writer of transformWithStateInPandas sends the JVM what PySpark's own writer sends: the same rows,
in the same order, of the same Arrow types, in fewer record batches; and it runs each key's processor output in turn,
as PySpark does, never reading ahead into the next key (no Spark needed)."""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.pandas.serializers import TransformWithStateInPandasSerializer
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType

from analytics.keyed.logic import _output
from analytics.keyed.schema import OUTPUT_SCHEMA
from analytics.spark import tws_input, tws_output

_SPARK_TYPES = {"string": StringType(), "long": LongType(), "int": IntegerType(), "double": DoubleType()}
KEYED_OUTPUT = StructType([StructField(c.split()[0], _SPARK_TYPES[c.split()[1]]) for c in OUTPUT_SCHEMA.split(", ")])
PYSPARK_DUMP = TransformWithStateInPandasSerializer.dump_stream


def new_serializer(max_records: int = 10_000) -> TransformWithStateInPandasSerializer:
    """The serializer as a worker makes it."""
    return TransformWithStateInPandasSerializer(
        timezone="UTC", safecheck=False, assign_cols_by_name=True, prefer_int_ext_dtype=False,
        arrow_max_records_per_batch=max_records, arrow_max_bytes_per_batch=2**31 - 1,
        int_to_decimal_coercion_enabled=False)


def written(dump: Any, per_key: list[list[pd.DataFrame]], spark_type: StructType = KEYED_OUTPUT,
            max_records: int = 10_000) -> tuple[pa.Table | None, int]:
    """What ``dump`` writes for these keys' frames (one iterator entry per key, as the worker's mapper yields them):
    the rows as one table (None: nothing written), and the number of record batches."""
    stream = io.BytesIO()
    dump(new_serializer(max_records), (((iter(frames), spark_type),) for frames in per_key), stream)
    raw = stream.getvalue()
    if not raw:
        return None, 0
    (marker,) = struct.unpack("!i", raw[:4])   # START_ARROW_STREAM, then the Arrow stream
    assert marker == -6
    batches = list(pa.ipc.open_stream(io.BytesIO(raw[4:])))
    return pa.Table.from_batches(batches), len(batches)


def assert_same_as_pyspark(per_key: list[list[pd.DataFrame]], spark_type: StructType = KEYED_OUTPUT,
                           max_records: int = 10_000) -> tuple[pa.Table | None, int, int]:
    theirs, their_batches = written(PYSPARK_DUMP, per_key, spark_type, max_records)
    ours, our_batches = written(tws_output.dump_stream, per_key, spark_type, max_records)
    if theirs is None:
        assert ours is None
    else:
        assert ours is not None and ours.schema == theirs.schema and ours.equals(theirs)
    return ours, our_batches, their_batches


def open_sessions(key: int, n: int) -> pd.DataFrame:
    """A keyed_windows output frame of ``n`` open-session rows for session bucket ``key``."""
    return _output(n, {"row_type": "open_session", "window_kind": "session", "app": f"app-{key % 3}", "kind": "user",
                       "name": np.array([f"user-{key}-{i}" for i in range(n)], dtype=object), "series_tags": "",
                       "watermark_ms": 1_700_000_000_000, "window_start_ms": np.arange(n, dtype=np.int64) + key,
                       "window_end_ms": np.arange(n, dtype=np.int64) + key + 30_000, "event_count": np.full(n, key)})


def stragglers(key: int, n: int) -> pd.DataFrame:
    return _output(n, {"row_type": "straggler", "window_kind": "sliding", "app": "app", "kind": "metric",
                       "name": "latency", "series_tags": "{}", "watermark_ms": 5, "event_time_ms": np.arange(n),
                       "lateness_ms": np.arange(n) + 1, "event_id": np.array([f"id-{key}-{i}" for i in range(n)],
                                                                           dtype=object)})


def test_given_the_frames_of_many_keys_the_same_rows_arrive_in_one_batch():
    per_key = [[open_sessions(k, 1 + k % 3), stragglers(k, 2)] for k in range(40)]
    table, ours, theirs = assert_same_as_pyspark(per_key)
    assert table is not None and table.num_rows == sum(1 + k % 3 + 2 for k in range(40))
    assert (ours, theirs) == (1, 80)


def test_empty_frames_and_keys_without_frames_change_nothing():
    per_key = [[], [open_sessions(1, 0)], [open_sessions(2, 2)], [], [open_sessions(3, 0), open_sessions(4, 1)]]
    table, ours, _ = assert_same_as_pyspark(per_key)
    assert table is not None and table.num_rows == 3 and ours == 1


def test_nothing_yielded_writes_nothing_as_in_pyspark():
    assert assert_same_as_pyspark([[], [], []])[:2] == (None, 0)


def test_batches_hold_at_most_max_records_rows_unless_one_frame_is_larger():
    per_key = [[open_sessions(k, 4)] for k in range(10)] + [[open_sessions(99, 25)], [open_sessions(100, 3)]]
    _, ours, theirs = assert_same_as_pyspark(per_key, max_records=10)
    # 10 frames of 4 rows: two per batch (5 batches), the 25-row frame alone, the last frame alone
    assert (ours, theirs) == (7, 12)


def test_frames_of_other_columns_or_dtypes_are_converted_apart_in_their_order():
    schema = StructType([StructField("a", LongType()), StructField("b", StringType())])
    per_key = [
        [pd.DataFrame({"a": np.array([1, 2]), "b": np.array(["x", None], dtype=object)})],
        [pd.DataFrame({"b": np.array(["y"], dtype=object), "a": np.array([3])})],      # columns by name
        [pd.DataFrame({"a": np.array([4.0, np.nan]), "b": np.array(["z", "w"], dtype=object)})],   # float, NaN
        [pd.DataFrame({"a": pd.array([5, None], dtype="Int64"), "b": np.array(["v", "u"], dtype=object)})],
        [pd.DataFrame({"a": np.array([6]), "b": np.array(["t"], dtype=object)})],
    ]
    table, ours, theirs = assert_same_as_pyspark(per_key, spark_type=schema)
    assert table is not None
    assert table.column(0).combine_chunks().field("a").to_pylist() == [1, 2, 3, 4, None, 5, None, 6]
    assert ours == theirs   # each frame's shape differs from the one before it


class Keys:
    """The worker's mapper as PySpark runs it: the state API's current key is set when a key's entry is taken, and
    the processor's generator, which reads and writes that key's state, runs as its frames are taken."""

    def __init__(self, frames_per_key: int) -> None:
        self.current: int | None = None
        self.frames_per_key = frames_per_key
        self.seen: list[tuple[int, int]] = []

    def processor(self, key: int) -> Iterator[pd.DataFrame]:
        for i in range(self.frames_per_key):
            assert self.current == key, "a key's output was read after the next key was taken"
            self.seen.append((key, i))
            yield open_sessions(key, 1)

    def entries(self, keys: int) -> Iterator[tuple[tuple[Iterator[pd.DataFrame], StructType]]]:
        for key in range(keys):
            self.current = key
            yield ((self.processor(key), KEYED_OUTPUT),)


@pytest.mark.parametrize("max_records", [1, 2, 10_000])
def test_each_key_is_written_out_whole_before_the_next_key_is_taken(max_records: int):
    keys = Keys(frames_per_key=3)
    tws_output.dump_stream(new_serializer(max_records), keys.entries(5), io.BytesIO())
    assert keys.seen == [(k, i) for k in range(5) for i in range(3)]


@pytest.mark.parametrize("seed", range(10))
def test_random_outputs_write_the_same_rows(seed: int):
    rng = np.random.default_rng(seed)
    makers = [open_sessions, stragglers]
    per_key = [[makers[int(rng.integers(0, 2))](k, int(rng.integers(0, 6))) for _ in range(int(rng.integers(0, 4)))]
               for k in range(int(rng.integers(1, 60)))]
    assert_same_as_pyspark(per_key, max_records=int(rng.integers(1, 40)))


def test_install_is_limited_to_the_pyspark_versions_the_loader_was_checked_against(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(TransformWithStateInPandasSerializer, "dump_stream", PYSPARK_DUMP)
    monkeypatch.setattr(tws_input.pyspark, "__version__", "9.0.0")
    assert not tws_output.install()
    assert TransformWithStateInPandasSerializer.dump_stream is PYSPARK_DUMP
    monkeypatch.setattr(tws_input.pyspark, "__version__", "4.2.1")
    assert tws_output.install()
    assert TransformWithStateInPandasSerializer.dump_stream is tws_output.dump_stream
