"""Which copy of an id counts (docs/time-semantics.md, "Duplicates"): pure logic, no Spark."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analytics import accepted_log
from analytics.accept.dedup import AcceptedIds, first_copies, horizon, keys, published_copies
from analytics.accepted_log import BatchMeta
from eventide.config import load_config

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def copies(*records: tuple[str, float, int, int]) -> pa.Table:
    """(id, broker time in seconds after T0, partition, offset) per record, in the batch's row order."""
    return pa.table({
        "id": [r[0] for r in records],
        "kafka_timestamp": pa.array([T0 + timedelta(seconds=r[1]) for r in records], pa.timestamp("us", "UTC")),
        "partition": pa.array([r[2] for r in records], pa.int32()),
        "offset": pa.array([r[3] for r in records], pa.int64()),
    })


def nothing_remembered() -> pa.ChunkedArray:
    return pa.chunked_array([], pa.string())


def test_the_earliest_copy_on_the_broker_clock_counts_wherever_it_sits_in_the_batch():
    batch = copies(("a", 9.0, 0, 5), ("b", 1.0, 0, 6), ("a", 2.0, 1, 3), ("c", 3.0, 1, 4))
    assert first_copies(batch, nothing_remembered()).to_pylist() == [False, True, True, True]


def test_copies_at_the_same_broker_time_are_ordered_by_kafka_position():
    batch = copies(("a", 1.0, 1, 0), ("a", 1.0, 0, 7), ("a", 1.0, 0, 2))
    assert first_copies(batch, nothing_remembered()).to_pylist() == [False, False, True]


def test_an_id_accepted_by_an_earlier_batch_is_a_duplicate_in_every_copy():
    batch = copies(("a", 1.0, 0, 10), ("a", 2.0, 0, 11), ("new", 3.0, 0, 12))
    remembered = pa.chunked_array([pa.array(["x", "a"]), pa.array(["y"])])
    assert first_copies(batch, remembered).to_pylist() == [False, False, True]


def test_an_empty_batch_has_no_first_copies():
    assert first_copies(copies(), nothing_remembered()).to_pylist() == []


def test_a_replayed_batch_takes_what_its_published_file_accepted(tmp_path):
    batch = copies(("a", 1.0, 0, 1), ("a", 2.0, 0, 2), ("b", 3.0, 1, 1))
    file = tmp_path / "000000000007.parquet"
    pq.write_table(batch.filter(pa.array([True, False, True])), file)
    assert published_copies(batch, pq.read_table(file)).to_pylist() == [True, False, True]


@pytest.mark.parametrize("seed", range(5))
def test_first_copies_match_a_plain_reference_on_random_batches_and_horizons(seed: int):
    rng = random.Random(seed)
    records = [(f"id-{rng.randrange(300)}", float(rng.randrange(50)), rng.randrange(4), offset)
               for offset in range(rng.randrange(1, 400))]
    remembered = pa.chunked_array([pa.array([f"id-{rng.randrange(600)}" for _ in range(rng.randrange(0, 200))],
                                            pa.string()) for _ in range(rng.randrange(0, 4))], pa.string())
    before = set(remembered.to_pylist())
    earliest = {}
    for row, (id_, time, partition, offset) in enumerate(records):
        if id_ not in earliest or (time, partition, offset) < earliest[id_][0]:
            earliest[id_] = ((time, partition, offset), row)
    expected = [earliest[id_][1] == row and id_ not in before for row, (id_, *_) in enumerate(records)]
    assert first_copies(copies(*records), remembered).to_pylist() == expected


# Per app: an id is unique within its app (BRIEF §1), so the duplicate key is (app, id).


def app_copies(*records: tuple[str, str, float, int, int]) -> pa.Table:
    """(app, id, broker time in seconds after T0, partition, offset) per record, in the batch's row order."""
    return copies(*[r[1:] for r in records]).add_column(0, "app", pa.array([r[0] for r in records], pa.string()))


def test_two_apps_using_the_same_id_both_count_and_each_apps_copy_counts_once():
    batch = app_copies(("checkout", "a", 1.0, 0, 1), ("search", "a", 2.0, 0, 2),
                       ("checkout", "a", 3.0, 0, 3), ("search", "a", 0.5, 1, 9))
    assert first_copies(batch, nothing_remembered()).to_pylist() == [True, False, False, True]


def test_an_id_another_app_accepted_before_does_not_make_a_duplicate():
    earlier = app_copies(("checkout", "a", 1.0, 0, 1), ("checkout", "b", 1.0, 0, 2))
    remembered = pa.chunked_array([keys(earlier)])
    batch = app_copies(("search", "a", 5.0, 0, 10), ("checkout", "a", 5.0, 0, 11), ("search", "b", 5.0, 0, 12))
    assert first_copies(batch, remembered).to_pylist() == [True, False, True]


@pytest.mark.parametrize(("first", "second"), [(("a:b", "c"), ("a", "b:c")), (("1:x", "y"), ("1", ":x:y")),
                                                (("", "ab"), ("a", "b"))])
def test_keys_of_different_app_and_id_pairs_never_collide(first: tuple[str, str], second: tuple[str, str]):
    batch = app_copies((*first, 1.0, 0, 1), (*second, 2.0, 0, 2))
    assert keys(batch)[0] != keys(batch)[1]
    assert first_copies(batch, nothing_remembered()).to_pylist() == [True, True]


def test_after_a_restart_the_horizon_remembers_from_the_log_exactly_the_keys_it_held_in_memory(tmp_path):
    config = load_config(environ={}, root=str(tmp_path), paths={"data_dir": str(tmp_path / "var")})
    accepted = app_copies(("checkout", "a", 1.0, 0, 1), ("search", "a", 2.0, 0, 2), ("search", "b", 3.0, 0, 3))
    meta = BatchMeta(4, {"t": {"0": 0}}, {"t": {"0": 3}}, 0, 0)
    file = accepted_log.partition_file(config.accepted_events_dir, 4, 0)
    file.parent.mkdir(parents=True)
    pq.write_table(accepted, file)   # what the accepted-events log stores for partition 0
    running = AcceptedIds(config, 0)
    running.remember(4, accepted)
    restarted = AcceptedIds(config, 0)   # a new process: nothing in memory, read back from the file
    assert restarted.of([meta]).to_pylist() == running.of([meta]).to_pylist()
    batch = app_copies(("search", "a", 9.0, 0, 7), ("mobile", "a", 9.0, 0, 8))
    assert first_copies(batch, restarted.of([meta])).to_pylist() == [False, True]


def test_a_partition_is_checked_against_the_batches_that_accepted_events_from_it_within_its_horizon(tmp_path):
    """Dedup runs per Kafka partition: a batch's records of partition 0 are checked against the earlier batches
    holding partition-0 events that reached the broker within the horizon before the partition's earliest record;
    what other partitions accepted, or when, does not matter."""
    config = load_config(environ={}, root=str(tmp_path), paths={"data_dir": str(tmp_path / "var")},
                         stream={"dedup_horizon_s": 60})
    meta_dir = config.accepted_events_dir / "_meta"
    meta_dir.mkdir(parents=True)
    spans = {1: {"0": [0, 10_000, 5, 100]},                              # partition 0, long before
             2: {"0": [50_000, 70_000, 5, 100], "1": [0, 1000, 5, 100]},  # partition 0 within the horizon
             3: {"1": [80_000, 90_000, 5, 100]},                          # only partition 1
             4: {"0": [95_000, 99_000, 5, 100]}}                          # the batch being checked, and later
    for batch_id, partitions in spans.items():
        (meta_dir / f"{batch_id}.json").write_text(json.dumps(BatchMeta(
            batch_id, {}, {}, min(s[0] for s in partitions.values()), max(s[1] for s in partitions.values()),
            partitions=partitions).__dict__))
        accepted_log.batch_dir(config.accepted_events_dir, batch_id).mkdir()
    earliest = 100_000   # the partition's earliest record in batch 4: the horizon reaches back to 40 s
    assert [m.batch_id for m in horizon(config, 4, 0, earliest)] == [2]
    assert [m.batch_id for m in horizon(config, 4, 1, earliest)] == [3]
    assert [m.batch_id for m in horizon(config, 5, 0, earliest)] == [2, 4]


# The horizon's hashes (AcceptedIds.first_copies): the same answer as the horizon's keys, whatever the hashes say.


def horizon_of(config, rng: random.Random, batches: int) -> tuple[AcceptedIds, list[BatchMeta]]:
    """A partition's memory after ``batches`` batches of random accepted ids, and their metas."""
    memory = AcceptedIds(config, 0)
    metas = []
    for batch_id in range(batches):
        ids = sorted({f"id-{rng.randrange(600)}" for _ in range(rng.randrange(0, 150))})
        memory.remember(batch_id, app_copies(*[("shop", i, 0.0, 0, n) for n, i in enumerate(ids)]))
        metas.append(BatchMeta(batch_id, {"t": {"0": 0}}, {"t": {"0": len(ids)}}, 0, 0))
    return memory, metas


@pytest.mark.parametrize("seed", range(5))
def test_first_copies_through_the_horizons_hashes_match_those_through_its_keys(seed: int, tmp_path):
    """Batches leave the horizon as it moves on: their hashes stay behind until rebuilt, and say only 'maybe'."""
    config = load_config(environ={}, root=str(tmp_path), paths={"data_dir": str(tmp_path / "var")})
    rng = random.Random(seed)
    memory, metas = horizon_of(config, rng, 12)
    for horizon_start in range(0, 10, 3):   # the horizon moves on: batches before it are dropped
        within = metas[horizon_start:]
        records = [("shop", f"id-{rng.randrange(900)}", float(rng.randrange(50)), 0, offset)
                   for offset in range(rng.randrange(1, 300))]
        batch = app_copies(*records)
        assert memory.first_copies(batch, within).to_pylist() == first_copies(batch, memory.of(within)).to_pylist()


def test_a_key_whose_hash_collides_with_an_accepted_keys_still_counts(tmp_path, monkeypatch):
    """Every key hashed alike: each one is a 'maybe', and the exact check of the horizon's keys decides."""
    from analytics.accept import dedup

    monkeypatch.setattr(dedup, "hashes", lambda some_keys: np.zeros(len(some_keys), np.int64))
    config = load_config(environ={}, root=str(tmp_path), paths={"data_dir": str(tmp_path / "var")})
    memory, metas = horizon_of(config, random.Random(7), 3)
    accepted_before = set(memory.of(metas).to_pylist())
    new_id = next(f"id-{n}" for n in range(600) if keys(app_copies(("shop", f"id-{n}", 0.0, 0, 0)))[0].as_py()
                  not in accepted_before)
    old_id = next(iter(accepted_before)).split(":", 2)[2]
    batch = app_copies(("shop", new_id, 1.0, 0, 1), ("shop", old_id, 2.0, 0, 2))
    assert memory.first_copies(batch, metas).to_pylist() == [True, False]
