"""Accept batches handed to the windows and sessions queries: one reader batch each when they are due, the groups
fixed on disk, a hand-over cut short by a crash finished over the same batches."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analytics import accepted_log, reader_batches
from analytics.accepted_log import BatchMeta
from eventide.config import Config, load_config
from tests.unit.analytics.test_accepted_log import reader_read

PARTITIONS = 2


def config_in(tmp_path: Path, **stream: object) -> Config:
    return load_config(environ={}, root=str(tmp_path), paths={"data_dir": str(tmp_path / "var")},
                       kafka={"events_partitions": PARTITIONS}, stream=stream)


def accept(config: Config, batch_id: int, accepted_at_ms: int) -> None:
    """Accept batch ``batch_id`` as ``accepted_log.publish`` leaves it: partition p's events file holds two
    rows, x = 10 × batch + p, each row its own row group."""
    for root in (config.accepted_events_dir, config.window_partials_dir):
        staged = accepted_log.staging_dir(root, batch_id, "a")
        for partition in range(PARTITIONS):
            value = 10 * batch_id + partition
            accepted_log.stage_file(staged, partition, [pa.table({"x": [value]}), pa.table({"x": [value]})])
    accepted_log.publish(config, BatchMeta(batch_id, {"t": {"0": batch_id}}, {"t": {"0": batch_id + 1}}, 0, 0,
                                           accepted_at_ms=accepted_at_ms), "a")


def reader_batch_ids(root: Path) -> list[int]:
    return sorted(int(d.name) for d in root.iterdir() if d.name.isdigit()) if root.is_dir() else []


def values(root: Path, batch_id: int, partition: int) -> list[int]:
    return pq.read_table(accepted_log.partition_file(root, batch_id, partition))["x"].to_pylist()


def test_live_with_a_shorter_accept_interval_accept_batches_are_grouped_until_they_span_the_trigger(tmp_path):
    # Given accept every 1 s and the windows every 5 s,
    config = config_in(tmp_path, trigger_interval_s=5, accept_interval_s=1)
    due = reader_batches.due_after(config, live=True)
    # when accept batches 0..5 are accepted a second apart, each handing over after it is published,
    handed = []
    for batch in range(6):
        accept(config, batch, 1_000 * batch)
        handed.append(reader_batches.hand_over(config, 1_000 * batch + 300, due))
    # then batches 0..4 become one reader batch (the oldest waited 4.3 s: with the next accept interval, 5 s),
    assert handed == [None, None, None, None, 4, None]
    for root in (config.reader_events_dir, config.reader_partials_dir):
        assert reader_batch_ids(root) == [4]
        # each partition's file holding the five batches' rows in order, their row groups kept.
        assert values(root, 4, 1) == [v for b in range(5) for v in (10 * b + 1,) * 2]
        assert pq.ParquetFile(accepted_log.partition_file(root, 4, 1)).num_row_groups == 10
    # and batch 5 waits for the next one.
    assert reader_batches.hand_over(config, 9_000, reader_batches.due_when_idle(config)) is None
    # Once it waited a whole trigger interval with no accept batch after it, the idle timer hands it over alone.
    assert reader_batches.hand_over(config, 10_000, reader_batches.due_when_idle(config)) == 5
    assert values(config.reader_events_dir, 5, 0) == [50, 50]


@pytest.mark.parametrize("live", [False, True])
def test_every_accept_batch_is_a_reader_batch_when_draining_or_when_accept_runs_at_the_trigger(tmp_path, live):
    config = config_in(tmp_path, trigger_interval_s=5, accept_interval_s=None if live else 1)
    due = reader_batches.due_after(config, live)
    for batch in range(3):
        accept(config, batch, 1_000 * batch)
        assert reader_batches.hand_over(config, 1_000 * batch, due) == batch
    # A reader batch of one accept batch links its files: the same inode, nothing copied.
    events = accepted_log.partition_file(config.accepted_events_dir, 1, 0)
    assert accepted_log.partition_file(config.reader_events_dir, 1, 0).stat().st_ino == events.stat().st_ino


def test_a_hand_over_cut_short_by_a_crash_is_finished_over_the_same_accept_batches(tmp_path):
    config = config_in(tmp_path, trigger_interval_s=5, accept_interval_s=1)
    due = reader_batches.due_after(config, live=True)
    for batch in range(3):
        accept(config, batch, 0)
    # Given a crash after the events of batches 0..2 were handed over, before their partials were,
    [(events_source, events_root, _), _] = reader_batches.roots(config)
    reader_batches._publish(config, events_source, events_root, accepted_log.metas(config), 2)
    accept(config, 3, 60_000)
    # when accept's next batch hands over (batch 3 not due yet),
    assert reader_batches.hand_over(config, 60_000, due) is None
    # then the partials are handed over as the same reader batch, and batch 3 is left for the next one.
    assert reader_batch_ids(config.reader_partials_dir) == [2]
    assert values(config.reader_partials_dir, 2, 0) == [0, 0, 10, 10, 20, 20]
    assert reader_batches.hand_over(config, 64_000, due) == 3


def test_a_job_upgraded_to_reader_batches_hands_over_from_the_batch_after_the_last_one_read(tmp_path):
    config = config_in(tmp_path)
    for batch in range(4):
        accept(config, batch, 0)
    # Given readers that read accept batches 0..2 from the accepted-events log itself (before reader batches),
    for query in ("windows", "keyed_windows"):
        reader_read(config, config.checkpoint_dir / query, [0, 1, 2], committed=2)
    # then the first reader batch holds batch 3 alone.
    assert reader_batches.hand_over(config, 0, reader_batches.due_after(config, live=False)) == 3
    assert values(config.reader_events_dir, 3, 1) == [31, 31]
    assert reader_batch_ids(config.reader_events_dir) == [3]


def test_after_an_upgrade_a_reader_behind_the_other_reads_on_one_accept_batch_at_a_time(tmp_path):
    config = config_in(tmp_path, trigger_interval_s=5, accept_interval_s=1)
    for batch in range(5):
        accept(config, batch, 0)
    # Given readers stopped by the upgrade at different batches: windows had read 0..1, keyed_windows 0..3,
    reader_read(config, config.checkpoint_dir / "windows", [0, 1], committed=1)
    reader_read(config, config.checkpoint_dir / "keyed_windows", [0, 1, 2, 3], committed=3)
    # when accept hands over (batch 4 due),
    assert reader_batches.hand_over(config, 60_000, reader_batches.due_after(config, live=True)) == 4
    # then windows gets batches 2 and 3 one at a time, as before the upgrade, then 4 with keyed_windows,
    assert reader_batch_ids(config.reader_partials_dir) == [2, 3, 4]
    assert reader_batch_ids(config.reader_events_dir) == [4]
    # and its late pass reads the events of 2 and 3 from the accepted-events log, where they still are.
    partials_file = accepted_log.partition_file(config.reader_partials_dir, 3, 1).as_uri()
    assert accepted_log.events_file_of(config, partials_file) == accepted_log.partition_file(
        config.accepted_events_dir, 3, 1)
    assert accepted_log.events_file_of(config, accepted_log.partition_file(config.reader_partials_dir, 4, 1).as_uri()
                                       ) == accepted_log.partition_file(config.reader_events_dir, 4, 1)


def test_a_reader_deletes_its_batches_once_both_readers_committed_a_newer_one_and_the_newest_stays(tmp_path):
    config = config_in(tmp_path)
    due = reader_batches.due_after(config, live=False)
    for batch in range(4):
        accept(config, batch, 0)
        reader_batches.hand_over(config, 0, due)
    assert reader_batches.expire(config, "windows") == []         # no reader has read anything
    reader_read_batches(config, "windows", [0, 1, 2])
    reader_read_batches(config, "keyed_windows", [0, 1])
    assert reader_batches.expire(config, "windows") == [0]        # keyed_windows still reads 1
    assert reader_batch_ids(config.reader_partials_dir) == [1, 2, 3]
    # Each query deletes only the directory it reads (its own thread lists it between its micro-batches).
    assert reader_batch_ids(config.reader_events_dir) == [0, 1, 2, 3]
    assert reader_batches.expire(config, "keyed_windows") == [0]
    assert reader_batch_ids(config.reader_events_dir) == [1, 2, 3]
    # The accepted-events log keeps its batches: its own retention and the dedup horizon decide.
    assert [m.batch_id for m in accepted_log.metas(config)] == [0, 1, 2, 3]


def reader_read_batches(config: Config, query: str, batches: list[int]) -> None:
    """The query read (and committed) these reader batches, one per micro-batch."""
    import json
    checkpoint = config.checkpoint_dir / query
    log = checkpoint / "sources" / "0"
    log.mkdir(parents=True)
    for n, batch in enumerate(batches):
        root = config.reader_partials_dir if query == "windows" else config.reader_events_dir
        entry = {"path": accepted_log.partition_file(root, batch, 0).as_uri(), "timestamp": 0, "batchId": n}
        (log / str(n)).write_text("v1\n" + json.dumps(entry))
        for kind, text in (("offsets", '{"batchWatermarkMs":0}\n' + json.dumps({"logOffset": n})), ("commits", "{}")):
            (checkpoint / kind).mkdir(exist_ok=True)
            (checkpoint / kind / str(n)).write_text("v1\n" + text)


def test_accept_never_runs_less_often_than_the_windows_take_batches(tmp_path):
    assert config_in(tmp_path, trigger_interval_s=2, accept_interval_s=3).stream.accept_interval == 2
    assert config_in(tmp_path, trigger_interval_s=5, accept_interval_s=1).stream.accept_interval == 1
    assert config_in(tmp_path, trigger_interval_s=5, accept_interval_s=None).stream.accept_interval == 5
