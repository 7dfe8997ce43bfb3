"""The output side of ``transformWithStateInPandas`` in Spark's Python workers: a key's frames joined with the next
keys' before they become Arrow.

PySpark 4.2 turns every frame a stateful processor yields into an Arrow record batch of its own, column by column
through pandas (``PandasToArrowConversion``): ~1.5 ms per frame of ``keyed_windows``' 28 output columns, whatever its
rows, while that query yields one to three frames of a few rows for each key a batch touched
(docs/performance.md#the-python-stateful-operator; ``bench/probes/tws_output.py`` times both). :func:`dump_stream`
writes the same rows in the same order, but joins consecutive frames of the same columns and dtypes into one frame
(up to ``maxRecordsPerBatch`` rows) before PySpark's own conversion makes a record batch of it.

Each key's iterator is still consumed whole, in turn, as PySpark consumes it: a processor's generator runs while its
key is the state API's current key, so nothing of the next key is read before the last frame of this one.
:func:`install` puts it in place in the worker daemon (``analytics.spark.python_daemon``), for the PySpark versions
it was checked against (``tests/unit/analytics/spark/test_tws_output.py``); another version keeps its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.pandas.serializers import ArrowStreamPandasUDFSerializer, TransformWithStateInPandasSerializer

from analytics.spark.tws_input import replace_serializer_method

_TEXT = "text"   # the kind of object and string columns (:func:`_shape`)


def install() -> bool:
    """Use :func:`dump_stream` for ``transformWithStateInPandas`` in this process and the workers it forks.
    Returns False (and changes nothing) for a PySpark version it was not checked against (the loader's,
    ``analytics.spark.tws_input.CHECKED_VERSIONS``)."""
    return replace_serializer_method("dump_stream", dump_stream, "frame-by-frame output writer")


def dump_stream(self: TransformWithStateInPandasSerializer, iterator: Iterable[Any], stream: Any) -> None:
    """Write what the processor yielded for each key (``iterator``: PySpark's ``((frames, spark type),)`` per key
    and per timer pass) as PySpark's ``TransformWithStateInPandasSerializer.dump_stream`` does, with consecutive
    frames of one shape joined (:func:`joined_frames`)."""
    limit = self.arrow_max_records_per_batch
    ArrowStreamPandasUDFSerializer.dump_stream(
        self, ([(frame, spark_type)] for frame, spark_type in joined_frames(iterator, limit)), stream)


def joined_frames(iterator: Iterable[Any], limit: int) -> Iterator[tuple[pd.DataFrame, Any]]:
    """(frame, spark type) to convert: the frames of ``iterator``'s entries in order, consecutive ones of the same
    shape (:func:`_shape`) and Spark type joined while they hold at most ``limit`` rows together (a larger frame
    alone); any other frame (of another pandas extension dtype, say) alone, as it came."""
    held: list[pd.DataFrame] = []
    held_type: Any = None
    held_shape: tuple[Any, ...] | None = None
    rows = 0
    for packed in iterator:
        frames, spark_type = packed[0]
        for frame in frames:
            shape = _shape(frame)
            if held and (shape is None or shape != held_shape or rows + len(frame) > limit
                         or (spark_type is not held_type and spark_type != held_type)):
                yield _joined(held), held_type
                held, rows = [], 0
            if shape is None:
                yield frame, spark_type
                continue
            held.append(frame)
            held_type, held_shape, rows = spark_type, shape, rows + len(frame)
    if held:
        yield _joined(held), held_type


def _shape(frame: pd.DataFrame) -> tuple[Any, ...] | None:
    """The frame's column names and the kinds of their dtypes, when the names are distinct and every dtype a numpy
    one or pandas' string dtype; None otherwise. Object and string columns are one kind: pandas infers a column's
    string dtype from its values (an empty or all-missing one stays object), and both hold the values of the same
    Spark string field."""
    dtypes = frame.dtypes.tolist()
    if frame.columns.has_duplicates or not all(isinstance(d, (np.dtype, pd.StringDtype)) for d in dtypes):
        return None
    return (*frame.columns.tolist(), *(_TEXT if d == np.dtype(object) or isinstance(d, pd.StringDtype) else d
                                       for d in dtypes))


def _joined(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """One frame of ``frames``' rows, each column's values concatenated as numpy arrays (pandas infers its string
    columns again, as it did for each frame): ``pd.concat`` leaves a string column in several Arrow chunks, which
    PySpark's conversion rejects."""
    if len(frames) == 1:
        return frames[0]
    arrays = [[column.to_numpy() for _, column in frame.items()] for frame in frames]
    columns = frames[0].columns
    return pd.DataFrame({name: np.concatenate([a[i] for a in arrays]) for i, name in enumerate(columns)},
                        columns=columns, copy=False)
