"""The accepted events ``keyed_windows`` reads, written first in each batch file so Spark can skip the rest.

``keyed_windows`` takes one row per session run (its head, ``analytics.keyed.runs``) and every event of a sliding
series: a small part of a batch. Reading the whole file to find them decoded every other row for nothing
(docs/performance.md#sessions-as-runs-keyed-rows-first). So ``accept``, which marks the runs, also marks these rows
(``keyed_row``) and writes them in row groups of their own, the others after (per slice, when a task handles its
batch in slices: ``analytics.accept.spill``). The query filters on the mark; Spark pushes the filter down to its
Parquet reader, whose row-group statistics let it skip the unmarked rows' groups undecoded.

The marks depend on the configuration (the session gap forms the runs, the sliding series pick events), so each
row also carries ``keyed_selection``, a fingerprint of what the marks were chosen for. A file marked for another
selection (the configuration changed while the file waited) or written before marks existed (null) is read whole,
as before, and the query's own rules pick its rows: the marks only ever save reading, never decide a result.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column
from pyspark.sql import functions as F

from analytics.keyed import runs as session_runs
from eventide.config import Config

KEYED_ROW = "keyed_row"
SELECTION = "keyed_selection"
FIELDS: dict[str, pa.DataType] = {KEYED_ROW: pa.bool_(), SELECTION: pa.int64()}


def selection(config: Config) -> int:
    """The fingerprint of the configuration that decides which rows ``keyed_windows`` reads."""
    stream = config.stream
    chosen = json.dumps({"session_gap_ms": stream.session_gap_s * 1000,
                         "sliding_log_levels": sorted(stream.sliding_log_levels),
                         "sliding_series": [s.model_dump() for s in stream.sliding_series]}, sort_keys=True)
    return int.from_bytes(hashlib.sha256(chosen.encode()).digest()[:8], "big", signed=True)


def sliding_series(config: Config) -> Column:
    """Events of the series that get sliding windows: logs at the configured levels, plus selected series."""
    wanted = (F.col("kind") == "log") & F.col("level").isin(*config.stream.sliding_log_levels)
    for selector in config.stream.sliding_series:
        match = (F.col("kind") == selector.kind) & (F.col("name") == selector.name)
        if selector.app != "*":
            match &= F.col("app") == selector.app
        wanted |= match
    return wanted


def _sliding_series_rows(events: pa.Table, config: Config) -> np.ndarray:
    """:func:`sliding_series` over an Arrow table, as a boolean mask (null counts as not wanted, as in Spark's
    filter)."""
    levels = pa.array(config.stream.sliding_log_levels, pa.string())
    wanted = pc.and_kleene(pc.equal(events["kind"], "log"), pc.is_in(events["level"], value_set=levels))
    for selector in config.stream.sliding_series:
        match = pc.and_kleene(pc.equal(events["kind"], selector.kind), pc.equal(events["name"], selector.name))
        if selector.app != "*":
            match = pc.and_kleene(match, pc.equal(events["app"], selector.app))
        wanted = pc.or_kleene(wanted, match)
    return np.asarray(pc.fill_null(wanted, False), dtype=bool)


def row_groups(events: pa.Table, config: Config) -> list[pa.Table]:
    """``events`` (a batch's accepted events with their run columns, runs formed with the configured gap) split
    into the file's row groups: the rows ``keyed_windows`` reads, then the others, each with :data:`FIELDS`."""
    is_run_head = np.asarray(pc.fill_null(events[session_runs.EVENTS], 0), dtype=np.int64) > 0
    keyed = is_run_head | _sliding_series_rows(events, config)
    fingerprint = selection(config)

    def part(rows: np.ndarray, marked: bool) -> pa.Table:
        table = events.filter(pa.array(rows))
        n = table.num_rows
        return (table.append_column(pa.field(KEYED_ROW, FIELDS[KEYED_ROW]), pa.array(np.full(n, marked)))
                .append_column(pa.field(SELECTION, FIELDS[SELECTION]),
                               pa.array(np.full(n, fingerprint, dtype=np.int64))))

    return [part(keyed, True), part(~keyed, False)]


def read_filter(config: Config) -> Column:
    """The rows of a file ``keyed_windows`` needs to read: the marked ones, or all of a file marked otherwise or
    not at all. Plain comparisons of the file's columns, so Spark pushes them down to Parquet."""
    return ((F.col(KEYED_ROW) == F.lit(True)) | F.col(SELECTION).isNull()
            | (F.col(SELECTION) != F.lit(selection(config))))
