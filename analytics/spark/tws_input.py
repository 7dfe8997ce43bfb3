"""The input side of ``transformWithStateInPandas`` in Spark's Python workers, one pandas frame per batch.

PySpark 4.2 hands each key's rows to a stateful processor by converting every Arrow batch to pandas, walking it
row by row (``itertuples``), grouping the rows by key in Python and building a new ``DataFrame`` from the row
tuples of each key: most of the Python workers' time in ``keyed_windows``
(docs/performance.md#the-python-stateful-operator; ``bench/probes/tws_input.py`` times the two loaders).
The rows arrive sorted by key, so the same frames come out of slicing each batch's frame at the key changes.

:func:`load_stream` does that and yields exactly what PySpark's loader yields, key by key and chunk by chunk
(the same rows, the same split at ``maxRecordsPerBatch`` / ``maxBytesPerBatch``), except that a frame's columns
keep their Arrow-derived dtypes (e.g. ``int8``) where PySpark re-infers them from Python objects (``int64``).
``tests/unit/analytics/spark/test_tws_input.py`` checks it against PySpark's own loader. :func:`install` puts it in
place of PySpark's in the worker daemon (``analytics.spark.python_daemon``), only for the PySpark versions it was
checked against: another version keeps its own loader, and results are the same either way.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyspark
from pyspark.sql.conversion import ArrowBatchTransformer
from pyspark.sql.pandas.serializers import ArrowStreamPandasSerializer, TransformWithStateInPandasSerializer
from pyspark.sql.streaming.stateful_processor_util import TransformWithStateInPandasFuncMode

# The PySpark versions whose loader this one reproduces (tests/unit/analytics/spark/test_tws_input.py compares them).
CHECKED_VERSIONS = ("4.2.",)
_NO_BYTES_LIMIT = 2**31 - 1   # PySpark's value for "no maxBytesPerBatch"

_log = logging.getLogger(__name__)
_pyspark_load_stream = TransformWithStateInPandasSerializer.load_stream


def install() -> bool:
    """Use :func:`load_stream` for ``transformWithStateInPandas`` in this process and the workers it forks.
    Returns False (and changes nothing) for a PySpark version it was not checked against."""
    return replace_serializer_method("load_stream", load_stream, "row-by-row input loader")


def replace_serializer_method(name: str, function: Callable[..., Any], pyspark_keeps: str) -> bool:
    """Put ``function`` in place of ``TransformWithStateInPandasSerializer``'s method ``name``, for the PySpark
    versions of :data:`CHECKED_VERSIONS` only; with another, log that PySpark keeps its own (``pyspark_keeps``) and
    return False."""
    if not pyspark.__version__.startswith(CHECKED_VERSIONS):
        _log.warning("pyspark %s: transformWithStateInPandas keeps PySpark's %s (%s is checked against %s)",
                     pyspark.__version__, pyspark_keeps, function.__module__, CHECKED_VERSIONS)
        return False
    setattr(TransformWithStateInPandasSerializer, name, function)
    return True


def load_stream(self: TransformWithStateInPandasSerializer, stream: Any) -> Iterator[tuple[Any, Any, Any]]:
    """(mode, key, chunks) as PySpark's ``TransformWithStateInPandasSerializer.load_stream``: one PROCESS_DATA
    entry per run of equal keys, its chunks an iterator of (key, frame), then PROCESS_TIMER and COMPLETE."""
    # Arrow batches as PySpark's loader reads them (its plain Arrow reader, past the pandas layers)
    batches = super(ArrowStreamPandasSerializer, self).load_stream(stream)
    pieces = (piece for batch in batches for piece in _key_runs(self, batch))
    for key, run in itertools.groupby(pieces, key=lambda piece: piece[0]):
        yield TransformWithStateInPandasFuncMode.PROCESS_DATA, key, _chunks(key, run)
    yield TransformWithStateInPandasFuncMode.PROCESS_TIMER, None, None
    yield TransformWithStateInPandasFuncMode.COMPLETE, None, None


def _key_runs(self: TransformWithStateInPandasSerializer,
              batch: pa.RecordBatch) -> Iterator[tuple[tuple[Any, ...], pd.DataFrame, int]]:
    """(key, rows, chunk limit) for each run of equal keys in ``batch``; the limit is the number of rows at which
    PySpark's loader cuts a chunk while it reads this batch (it depends on the average row size so far)."""
    if batch.num_rows == 0:
        return
    if self.arrow_max_bytes_per_batch != _NO_BYTES_LIMIT:
        # Kept as PySpark keeps it: the serializer's running average decides where chunks end.
        self.total_bytes += sum(buf.size for col in batch.columns for buf in col.buffers() if buf is not None)
        self.total_rows += batch.num_rows
        self.average_arrow_row_size = self.total_bytes / self.total_rows
    limit = _chunk_rows(self.arrow_max_records_per_batch, self.arrow_max_bytes_per_batch,
                        self.average_arrow_row_size)
    frame = _to_pandas(self, batch)
    # As object arrays the key columns hold the Python values PySpark's row tuples carry, and compare with ==.
    # A missing key value (None or NaN) equals another missing one: Spark grouped them as one key (PySpark's
    # tuple comparison splits NaN keys row by row or not, depending on which NaN objects pandas returns).
    values_of_keys = [frame.iloc[:, offset].to_numpy(dtype=object) for offset in self.key_offsets]
    key_columns = [(values, pd.isna(values)) for values in values_of_keys]
    starts = np.zeros(batch.num_rows, dtype=bool)
    starts[0] = True
    for values, missing in key_columns:
        starts[1:] |= (values[1:] != values[:-1]) & ~(missing[1:] & missing[:-1])
    bounds = [*np.flatnonzero(starts).tolist(), batch.num_rows]
    for start, end in itertools.pairwise(bounds):
        # missing values as None: NaN != NaN would split a key whose run spans two batches
        key = tuple(None if missing_at[start] else values[start] for values, missing_at in key_columns)
        yield key, frame.iloc[start:end], limit


def _to_pandas(self: TransformWithStateInPandasSerializer, batch: pa.RecordBatch) -> pd.DataFrame:
    """``batch`` as the frame PySpark's loader builds from it before walking its rows, with its conversions."""
    return pd.concat(ArrowBatchTransformer.to_pandas(
        batch, timezone=self._timezone, schema=self._input_type, struct_in_pandas=self._struct_in_pandas,
        ndarray_as_list=self._ndarray_as_list, prefer_int_ext_dtype=self._prefer_int_ext_dtype,
        df_for_struct=self._df_for_struct), axis=1)


def _chunk_rows(max_records: int, max_bytes: int, average_row_bytes: float) -> int:
    """The smallest row count ``n`` >= 1 at which PySpark's loader cuts a chunk: ``n >= max_records`` or
    ``n * average_row_bytes >= max_bytes`` (its test after each row, in its own float arithmetic)."""
    limit = max(max_records, 1)
    if max_bytes == _NO_BYTES_LIMIT or average_row_bytes <= 0:
        return limit
    by_bytes = max(math.ceil(max_bytes / average_row_bytes), 1)
    while by_bytes > 1 and (by_bytes - 1) * average_row_bytes >= max_bytes:
        by_bytes -= 1
    while by_bytes * average_row_bytes < max_bytes:
        by_bytes += 1
    return min(limit, by_bytes)


def _chunks(key: tuple[Any, ...],
            run: Iterable[tuple[tuple[Any, ...], pd.DataFrame, int]]) -> Iterator[tuple[tuple[Any, ...], pd.DataFrame]]:
    """(key, frame) chunks of one key's rows, cut where PySpark's loader cuts them, each with a fresh index."""
    held: list[pd.DataFrame] = []
    count = 0
    for _, rows, limit in run:
        position = 0
        while position < len(rows):
            # PySpark tests after every row, so a chunk already past a (lowered) limit ends after one more row.
            take = max(limit - count, 1)
            part = rows.iloc[position:position + take]
            position += len(part)
            held.append(part)
            count += len(part)
            if count >= limit:
                yield key, _joined(held)
                held, count = [], 0
    if held:
        yield key, _joined(held)


def _joined(parts: list[pd.DataFrame]) -> pd.DataFrame:
    if len(parts) == 1:
        return parts[0].reset_index(drop=True)
    return pd.concat(parts, ignore_index=True)
