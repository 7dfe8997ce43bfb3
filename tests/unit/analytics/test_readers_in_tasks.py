"""The readers' writers run in Spark's tasks (issue 40): what one task computes from its own part of a batch (one
events file, its rows), and how the driver merges the parts, must equal what the whole batch gave in one place.
Pure Arrow and files; the end-to-end rules are in tests/integration (stragglers, corrections, sessions)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analytics import sinks
from analytics.keyed import runs as session_runs
from analytics.spark.checkpoint import BatchInfo
from analytics.windows.stragglers import (
    CORRECTION_COLUMNS,
    EVENT_COLUMNS,
    corrections,
    late_contributions,
    late_events,
    merged_corrections,
    stragglers,
)
from eventide.config import load_config

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
G = 300_000


def accepted(seconds_after_t0: list[float], first_offset: int = 0, partition: int = 0) -> pa.Table:
    """Accepted events (the late pass's columns and one it does not read) at these corrected times."""
    n = len(seconds_after_t0)
    offsets = list(range(first_offset, first_offset + n))
    return pa.table({
        "app": ["shop"] * n, "kind": ["metric"] * n, "name": [f"m{o % 3}" for o in offsets], "series_tags": [""] * n,
        "partition": pa.array([partition] * n, pa.int32()), "offset": offsets, "id": [f"e{o}" for o in offsets],
        "device": ["d1"] * n, "metric_value": [1.0] * n,
        "corrected_event_time": pa.array([T0 + timedelta(seconds=s) for s in seconds_after_t0],
                                         pa.timestamp("us", tz="UTC")),
    })


def sorted_rows(table: pa.Table) -> list[tuple]:
    return sorted(tuple(row.values()) for row in table.to_pylist())


def test_a_file_s_late_events_are_read_alone_and_give_the_late_pass_of_the_whole_file(tmp_path: Path) -> None:
    config = load_config(environ={})   # tumbling 10 s and 60 s, hopping 300 s every 60 s
    events = accepted([10, 65, 69.9995, 70, 75, 200, 3])
    path = tmp_path / "000000000001.parquet"
    pq.write_table(events, path)
    info = BatchInfo(1, T0_MS + 70_000, {}, {})

    late = late_events(f"file:{path}", info.watermark_ms)

    assert late.column_names == list(EVENT_COLUMNS)
    assert late["id"].to_pylist() == ["e0", "e1", "e2", "e6"]
    assert sorted_rows(late_contributions(late, config, info)) == sorted_rows(
        late_contributions(events, config, info))


def test_a_file_without_late_events_gives_no_rows_and_the_late_pass_s_columns(tmp_path: Path) -> None:
    path = tmp_path / "000000000002.parquet"
    pq.write_table(accepted([80, 90]), path)

    late = late_events(str(path), T0_MS + 70_000)

    assert late.num_rows == 0
    assert late.column_names == list(EVENT_COLUMNS)
    config = load_config(environ={})
    assert stragglers(late_contributions(late, config, BatchInfo(2, T0_MS + 70_000, {}, {}))).num_rows == 0


def test_corrections_merged_over_a_batch_s_files_equal_those_of_the_whole_batch() -> None:
    config = load_config(environ={})
    info = BatchInfo(3, T0_MS + 200_000, {}, {})
    # one series' windows corrected by events of both files, with their latest lateness in either
    first, second = accepted([150, 185, 61.5, 121], 0, partition=0), accepted([170, 190, 100, 130], 4, partition=1)
    whole = corrections(late_contributions(pa.concat_tables([first, second]), config, info))

    merged = merged_corrections([corrections(late_contributions(part, config, info)) for part in (first, second)])

    assert merged.column_names == list(CORRECTION_COLUMNS)
    assert whole.num_rows > 0
    assert sorted_rows(merged) == sorted_rows(whole)
    assert sorted_rows(merged_corrections([whole])) == sorted_rows(whole)


def keyed_events(rows: list[tuple[str, int, int]]) -> pa.Table:
    """Accepted events of users (key, partition, time ms), one app, offsets in order."""
    n = len(rows)
    return pa.table({
        "app": ["shop"] * n, "user": [k for k, _, _ in rows], "device": ["phone"] * n,
        "corrected_event_time": pa.array(np.array([t for _, _, t in rows], np.int64) * 1000,
                                         pa.timestamp("us", tz="UTC")),
        "partition": pa.array([p for _, p, _ in rows], pa.int32()), "offset": list(range(n)),
        "id": [f"e{i}" for i in range(n)],
    })


def dropped(runs: list[tuple[str, int, int, int, int]], with_partition: bool = True) -> pa.Table:
    """Dropped runs (key, head partition, run size, first ms, last ms)."""
    columns = {"app": ["shop"] * len(runs), "kind": ["user"] * len(runs), "name": [r[0] for r in runs],
               "first_ms": [r[3] for r in runs], "last_ms": [r[4] for r in runs]}
    if with_partition:
        columns |= {"head_partition": pa.array([r[1] for r in runs], pa.int32()),
                    "run_events": [r[2] for r in runs]}
    return pa.table(columns)


def test_a_run_formed_within_its_partition_takes_only_that_partition_s_events() -> None:
    # user ua in two partitions at overlapping times: a run per partition; only the one of partition 1 dropped
    events = keyed_events([("ua", 0, 1_000), ("ua", 1, 2_000), ("ua", 0, 3_000), ("ua", 1, 4_000), ("ub", 1, 2_500)])

    taken = session_runs.events_of_runs(dropped([("ua", 1, 2, 2_000, 4_000)]), events)

    assert sorted(taken["id"].to_pylist()) == ["e1", "e3"]
    assert "run_index" not in taken.column_names


def test_a_run_formed_over_the_whole_batch_takes_its_events_of_every_partition() -> None:
    # the run's head is in partition 0, two of its three events in partition 1: formed across partitions
    events = keyed_events([("ua", 0, 1_000), ("ua", 1, 2_000), ("ua", 1, 3_000), ("ua", 0, 900_000)])

    taken = session_runs.events_of_runs(dropped([("ua", 0, 3, 1_000, 3_000)]), events)
    without_partition = session_runs.events_of_runs(dropped([("ua", 0, 3, 1_000, 3_000)], False), events)

    assert sorted(taken["id"].to_pylist()) == sorted(without_partition["id"].to_pylist()) == ["e0", "e1", "e2"]


class _Rows(sinks.TaskWriter):
    def tables(self, rows: pa.Table) -> tuple[list[tuple[str, pa.Table]], pa.Table | None]:
        return [("a", rows), ("b", rows.slice(0, 0))], rows.slice(0, 1)


def test_a_writing_task_inserts_its_rows_and_reports_their_counts_and_its_result(monkeypatch) -> None:
    inserted = []
    monkeypatch.setattr(sinks, "insert_tables", lambda config, rows, query: inserted.append((query, rows)))
    writer = _Rows(load_config(environ={}), "q")
    batch = pa.record_batch({"x": [1, 2, 3]})

    [report] = list(writer(iter([batch, batch])))

    assert [(query, [(t, r.num_rows) for t, r in rows]) for query, rows in inserted] == [("q", [("a", 6), ("b", 0)])]
    assert report.schema == sinks.TASK_REPORT
    assert report["table"].to_pylist() == ["a", None]
    assert report["rows"].to_pylist() == [6, 0]
    assert report["message"].to_pylist() == [None, None]
    assert pa.ipc.open_stream(report["result"][1].as_py()).read_all().to_pylist() == [{"x": 1}]
    assert list(writer(iter([]))) == [] and list(writer(iter([batch.slice(0, 0)]))) == []
    assert len(inserted) == 1


@pytest.mark.parametrize("files", [1, 3])
def test_the_late_pass_of_a_batch_split_by_file_equals_the_pass_over_all_its_events(tmp_path: Path,
                                                                                    files: int) -> None:
    config = load_config(environ={})
    info = BatchInfo(4, T0_MS + 200_000, {}, {})
    times = list(np.random.default_rng(7).uniform(-200, 400, 600))
    parts = [accepted(times[i::files], first_offset=i * 1000, partition=i) for i in range(files)]
    paths = []
    for i, part in enumerate(parts):
        paths.append(f"file:{tmp_path / f'p{i}.parquet'}")
        pq.write_table(part, tmp_path / f"p{i}.parquet")
    whole = late_contributions(pa.concat_tables(parts), config, info)

    per_file = [late_contributions(late_events(p, info.watermark_ms), config, info) for p in paths]

    assert sorted_rows(pa.concat_tables([stragglers(late) for late in per_file])) == sorted_rows(stragglers(whole))
    assert sorted_rows(merged_corrections([corrections(late) for late in per_file])) == sorted_rows(
        corrections(whole))


def test_a_task_s_waits_for_the_store_are_reported_to_the_driver(monkeypatch) -> None:
    def away_then_back(config, rows, query):
        sinks.log.warning("%s: store unreachable at x; the micro-batch waits and retries in 1 s", query)

    monkeypatch.setattr(sinks, "insert_tables", away_then_back)
    [report] = list(_Rows(load_config(environ={}), "q")(iter([pa.record_batch({"x": [1]})])))

    assert report["message"].to_pylist()[-1] == "q: store unreachable at x; the micro-batch waits and retries in 1 s"
    assert not any(isinstance(h, sinks._Kept) for h in sinks.log.handlers)
