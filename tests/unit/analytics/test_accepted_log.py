"""The accepted-events log's bookkeeping, on files laid out the way Spark and the accept query write them."""

from __future__ import annotations

import json
from pathlib import Path

from analytics import accepted_log
from analytics.accepted_log import BatchMeta
from analytics.spark import checkpoint as spark_checkpoint
from analytics.spark.checkpoint import BatchInfo
from eventide.config import Config, load_config

HOUR_MS = 3_600_000


def config_in(tmp_path: Path) -> Config:
    return load_config(environ={}, root=str(tmp_path), paths={"data_dir": str(tmp_path / "var")})


def publish_fake(config: Config, batch_id: int, last_ms: int, end_offset: int) -> None:
    """A published batch as ``accepted_log.publish`` leaves it (the Parquet content does not matter here)."""
    (config.accepted_events_dir / "_meta").mkdir(parents=True, exist_ok=True)
    meta = BatchMeta(batch_id, {"t": {"0": end_offset - 10}}, {"t": {"0": end_offset}}, last_ms - 1000, last_ms,
                     10, 100)
    (config.accepted_events_dir / "_meta" / f"{batch_id}.json").write_text(json.dumps(meta.__dict__))
    accepted_log.batch_dir(config.accepted_events_dir, batch_id).mkdir(parents=True)
    events_file(config, batch_id).write_bytes(b"parquet")


def events_file(config: Config, batch_id: int) -> Path:
    """The batch's file of partition 0."""
    return accepted_log.partition_file(config.accepted_events_dir, batch_id, 0)


def reader_read(config: Config, checkpoint: Path, batches: list[int], committed: int, compact_at: int | None = None
                ) -> None:
    """A downstream query that read accept batch ``batches[n]`` in its log batch n, and committed log batches
    up to ``committed``; with ``compact_at``, Spark has compacted the log entries up to that batch."""
    log = checkpoint / "sources" / "0"
    log.mkdir(parents=True)
    entries = [{"path": f"file://{events_file(config, b)}", "timestamp": 0, "batchId": n}
               for n, b in enumerate(batches)]
    for n, entry in enumerate(entries):
        if compact_at is not None and n <= compact_at:
            if n == compact_at:
                (log / f"{n}.compact").write_text("v1\n" + "\n".join(json.dumps(e) for e in entries[: n + 1]))
        else:
            (log / str(n)).write_text("v1\n" + json.dumps(entry))
    for n in range(committed + 1):
        (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
        (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
        (checkpoint / "offsets" / str(n)).write_text('v1\n{"batchWatermarkMs":0}\n' + json.dumps({"logOffset": n}))
        (checkpoint / "commits" / str(n)).write_text("v1\n{}")


def test_a_batch_is_deleted_only_once_every_reader_committed_past_it_and_it_is_past_retention(tmp_path):
    config = config_in(tmp_path)
    now = 100 * HOUR_MS
    for batch in range(6):
        publish_fake(config, batch, now - (10 - batch) * HOUR_MS, 100 * (batch + 1))
    publish_fake(config, 6, now, 700)                              # recent: kept whatever the readers did
    windows, keyed = tmp_path / "ck" / "windows", tmp_path / "ck" / "keyed"
    reader_read(config, windows, [0, 1, 2, 3, 4, 5, 6], committed=6, compact_at=3)
    reader_read(config, keyed, [0, 1, 2, 3], committed=2)          # has read batch 3, committed up to batch 2

    assert accepted_log.expire(config, [windows, keyed], now) == [0, 1]
    assert [m.batch_id for m in accepted_log.metas(config)] == [2, 3, 4, 5, 6]
    assert not events_file(config, 0).exists() and events_file(config, 2).exists()


def test_nothing_is_deleted_before_every_reader_has_committed_a_batch(tmp_path):
    config = config_in(tmp_path)
    publish_fake(config, 0, 0, 100)
    windows, keyed = tmp_path / "ck" / "windows", tmp_path / "ck" / "keyed"
    reader_read(config, windows, [0], committed=0)
    (keyed / "commits").mkdir(parents=True)
    assert accepted_log.expire(config, [windows, keyed], 100 * HOUR_MS) == []


def test_files_of_a_batch_and_the_kafka_offsets_a_reader_reached_survive_log_compaction(tmp_path):
    config = config_in(tmp_path)
    for batch in range(5):
        publish_fake(config, batch, HOUR_MS, 100 * (batch + 1))
    windows = tmp_path / "ck" / "windows"
    reader_read(config, windows, [0, 1, 2, 3, 4], committed=4, compact_at=2)

    compacted = BatchInfo(2, 0, {"logOffset": 0}, {"logOffset": 2})
    assert spark_checkpoint.files_read(windows, compacted) == [
        f"file://{events_file(config, b)}" for b in (1, 2)]
    assert spark_checkpoint.files_read(windows, BatchInfo(4, 0, {"logOffset": 3}, {"logOffset": 4})) == [
        f"file://{events_file(config, 4)}"]
    assert accepted_log.kafka_offsets_reached(config, windows, 1) == {"t": {"0": 200}}
    assert accepted_log.kafka_offsets_reached(config, windows, 4) == {"t": {"0": 500}}
    assert accepted_log.kafka_offsets_reached(config, windows, -1) == {}


def test_a_file_chosen_but_never_planned_is_forgotten_before_the_reader_starts_again(tmp_path):
    """A reader killed after its file source logged its next file (log batch 4) but before it planned the batch
    reading it (offsets end at log batch 3): the entry goes, so the restarted reader chooses that file alone."""
    config = config_in(tmp_path)
    checkpoint = tmp_path / "windows"
    reader_read(config, checkpoint, batches=[0, 1, 2, 3, 4], committed=3)
    (checkpoint / "sources" / "0" / ".4.crc").write_bytes(b"crc")

    assert spark_checkpoint.forget_unplanned_files(checkpoint) == [4]

    assert sorted(p.name for p in (checkpoint / "sources" / "0").iterdir()) == ["0", "1", "2", "3"]
    assert spark_checkpoint.files_read(checkpoint, BatchInfo(3, 0, {"logOffset": 2}, {"logOffset": 3})) == [
        f"file://{events_file(config, 3)}"]


def test_a_compacted_log_batch_never_planned_keeps_every_earlier_entry(tmp_path):
    config = config_in(tmp_path)
    checkpoint = tmp_path / "windows"
    reader_read(config, checkpoint, batches=[0, 1, 2, 3, 4], committed=3, compact_at=4)
    (checkpoint / "sources" / "0" / ".4.compact.crc").write_bytes(b"crc")

    assert spark_checkpoint.forget_unplanned_files(checkpoint) == [4]

    compact = (checkpoint / "sources" / "0" / "4.compact").read_text().splitlines()
    assert compact[0] == "v1" and [json.loads(e)["batchId"] for e in compact[1:]] == [0, 1, 2, 3]
    assert not (checkpoint / "sources" / "0" / ".4.compact.crc").exists()
    assert spark_checkpoint.files_read(checkpoint, BatchInfo(3, 0, {"logOffset": 2}, {"logOffset": 3})) == [
        f"file://{events_file(config, 3)}"]


def test_a_planned_batch_keeps_its_files_even_before_it_is_committed(tmp_path):
    config = config_in(tmp_path)
    checkpoint = tmp_path / "windows"
    reader_read(config, checkpoint, batches=[0, 1, 2, 3, 4], committed=3)
    (checkpoint / "offsets" / "4").write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":4}')

    assert spark_checkpoint.forget_unplanned_files(checkpoint) == []
    assert spark_checkpoint.forget_unplanned_files(tmp_path / "never_started") == []


def test_publishing_writes_each_partition_s_rows_once_in_their_row_groups_pads_the_rest_and_leaves_nothing_aside(
        tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    config = config_in(tmp_path)
    rows = pa.table({"id": ["a", "b", "c"], "offset": [1, 2, 3]})
    meta = BatchMeta(7, {"t": {"0": 0}}, {"t": {"0": 3}}, 1000, 2000, events=3,
                     partitions={"1": [1000, 2000, 3, 0]})
    for root in (config.accepted_events_dir, config.window_partials_dir):
        accepted_log.stage_file(accepted_log.staging_dir(root, 7, "one"), 1,
                                [rows.slice(0, 2), rows.slice(2, 0), rows.slice(2)])
    accepted_log.stage_file(accepted_log.staging_dir(config.accepted_events_dir, 7, "failed"), 1, [rows])
    accepted_log.publish(config, meta, "one")
    accepted_log.stage_file(accepted_log.staging_dir(config.accepted_events_dir, 7, "again"), 1, [rows.slice(0, 1)])
    accepted_log.publish(config, meta, "again")     # a replayed batch: its files are the truth
    files = accepted_log.events_files(config, 7)
    assert [f.name for f in files] == [f"{p:05d}.parquet" for p in range(config.kafka.events_partitions)]
    assert pq.read_table(files[1]).equals(rows)
    assert all(pq.read_table(f).num_rows == 0 and pq.read_schema(f) == rows.schema for f in files if f != files[1])
    groups = pq.ParquetFile(files[1]).metadata
    assert [groups.row_group(i).num_rows for i in range(groups.num_row_groups)] == [2, 1]
    assert [f.name for f in accepted_log.partials_files(config, 7)] == [f.name for f in files]
    stored = accepted_log.meta(config, 7)
    assert (stored.events, stored.first_timestamp_ms, stored.last_timestamp_ms) == (3, 1000, 2000)
    assert stored.size_bytes == sum(f.stat().st_size for f in files)
    assert accepted_log.partition_events(config, 7, 1, ["id"])["id"].to_pylist() == ["a", "b", "c"]
    for root in (config.accepted_events_dir, config.window_partials_dir):
        assert not list((root / "_tmp").iterdir())


def test_a_backlog_older_than_the_retention_keeps_the_files_a_later_batch_s_dedup_horizon_still_needs(tmp_path):
    """Catching up on a backlog hours old: every file is past the retention by the wall clock, yet the files
    within the dedup horizon of the newest batch's broker time are kept, and deleted once outside it."""
    config = config_in(tmp_path)
    now, horizon = 100 * HOUR_MS, config.stream.dedup_horizon_ms
    backlog = now - 10 * HOUR_MS                                   # broker time of the backlog being read
    step = horizon // 4
    for batch in range(4):                                         # all within the horizon of batch 3's earliest
        publish_fake(config, batch, backlog + batch * step, 100 * (batch + 1))
    windows, keyed = tmp_path / "ck" / "windows", tmp_path / "ck" / "keyed"
    reader_read(config, windows, [0, 1, 2, 3], committed=3)
    reader_read(config, keyed, [0, 1, 2, 3], committed=3)

    assert accepted_log.expire(config, [windows, keyed], now) == []
    assert [m.batch_id for m in accepted_log.metas(config)] == [0, 1, 2, 3]

    for batch in range(4, 7):                                      # the backlog moves on by 3/4 of a horizon
        publish_fake(config, batch, backlog + batch * step, 100 * (batch + 1))
    windows, keyed = tmp_path / "ck2" / "windows", tmp_path / "ck2" / "keyed"
    reader_read(config, windows, list(range(7)), committed=6)
    reader_read(config, keyed, list(range(7)), committed=6)

    # Batch 6's earliest is at 6 steps − 1 s: batches 0 and 1 end more than a horizon (4 steps) before it.
    assert accepted_log.expire(config, [windows, keyed], now) == [0, 1]
    assert [m.batch_id for m in accepted_log.metas(config)] == [2, 3, 4, 5, 6]
    assert not events_file(config, 1).exists() and events_file(config, 2).exists()


def test_the_listing_follows_batches_published_and_metadata_deleted_by_another_process(tmp_path):
    """metas() keeps what it read between listings: a batch published since appears, one whose metadata is gone
    (expired by the driver, seen from a task's process) disappears, and metadata whose batch is not yet renamed into
    place waits."""
    config = config_in(tmp_path)
    for batch in (3, 1, 2):
        publish_fake(config, batch, HOUR_MS, 100 * batch)
    assert [m.batch_id for m in accepted_log.metas(config)] == [1, 2, 3]
    (config.accepted_events_dir / "_meta" / "2.json").unlink()
    publish_fake(config, 4, HOUR_MS, 400)
    meta = BatchMeta(5, {"t": {"0": 490}}, {"t": {"0": 500}}, HOUR_MS - 1000, HOUR_MS, 10, 100)
    (config.accepted_events_dir / "_meta" / "5.json").write_text(json.dumps(meta.__dict__))   # not yet in place
    assert [m.batch_id for m in accepted_log.metas(config)] == [1, 3, 4]
    accepted_log.batch_dir(config.accepted_events_dir, 5).mkdir(parents=True)
    assert [m.batch_id for m in accepted_log.metas(config)] == [1, 3, 4, 5]
    assert accepted_log.metas(config) == accepted_log.metas(config)
