"""The accepted-events log: validated, deduplicated events, handed from the ``accept`` query to the stateful ones.

Each ``accept`` micro-batch is published as one directory, ``<dir>/<batch id:012d>/``, holding one Parquet file per
partition of the events topic, ``<partition:05d>.parquet`` (``kafka.events_partitions`` files, empty ones for
partitions the batch read nothing from). The files are written by the Spark tasks that accepted the events, each
task its partition's file, aside (``_tmp/<batch id>-<attempt>/``, invisible to Spark's file source like every name
starting with ``_``); once every task has succeeded the driver saves the batch's metadata (``_meta/<batch id>.json``:
the Kafka offsets the batch read, its broker-clock span, per partition and in all, its size) and renames the
directory into place: one ``rename(2)``, so a reader lists the whole batch or none of it. Each file is synced by the
task that wrote it, the metadata and the staged directory by the driver before the rename, and the log directory
after it, so after a power loss a published batch is whole or absent. A replayed accept batch whose directory
exists publishes nothing again: the hand-over is exactly-once without Kafka transactions, and a downstream query
that read the batch before a crash reads the very same events again.

The stateful queries do not read this directory itself: ``analytics.reader_batches`` hands its batches to them,
one **reader batch** (one accept batch, or several published since the last one) per directory of
:attr:`Config.reader_events_dir` and :attr:`Config.reader_partials_dir`, which they read with Spark's file source
(``recursiveFileLookup``), taking ``kafka.events_partitions`` files per micro-batch: files are taken oldest first,
and a reader batch's files are all older than the next one's, so each micro-batch of theirs is one reader batch.
Batches published before the per-partition layout (one file, ``<dir>/<batch id:012d>.parquet``) are still read by
the dedup horizon and the late passes; a reader must have read them all before the job is upgraded
(docs/operations.md, "Upgrading").

A reader killed between choosing its next files (Spark's file source writes ``sources/0/<n>`` first) and planning
the batch that reads them (``offsets/<N>``) would, once restarted, plan a batch over that orphaned entry *and* the
next new files: two reader batches under one watermark, so late events judged otherwise than in a run never killed.
``analytics.spark.checkpoint.forget_unplanned_files`` removes such an entry before a reader starts; Spark then
chooses those files again, alone.

Beside each batch's events, its window partials (``analytics.windows.partials``) are published the same way, one
file per partition under ``<partials dir>/<batch id:012d>/``: the ``windows`` query reads those (as reader batches), the
``keyed_windows`` query the events. A batch's partials are published after its events (the windows writer reads the
events of the batch whose partials it merged); an accept batch replayed after a crash in between publishes them.

Why files and not a Kafka topic: Spark's Kafka sink is at-least-once, so a replayed batch would hand its events
over twice, and the windows would need a second deduplication (docs/architecture.md, "Accepted events").
Tasks and driver publish and read these files with local-filesystem calls (``pathlib``, ``pyarrow``), and renames
are atomic on a POSIX filesystem: on a multi-host cluster ``stream.checkpoint_dir`` must be a shared POSIX mount
(NFS) that every executor mounts at the same path, not HDFS or an object store (docs/operations.md).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from analytics.spark.checkpoint import Offsets, newest_committed_offsets, source_log_entries
from eventide.config import Config
from eventide.durable import sync_directory, sync_file

if TYPE_CHECKING:   # the stream readers run with a Spark session; the file helpers need none
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

_META = "_meta"
_TMP = "_tmp"


@dataclass(frozen=True)
class BatchMeta:
    """What one published accept batch holds and where in Kafka it came from."""

    batch_id: int
    start_offsets: Offsets
    end_offsets: Offsets
    first_timestamp_ms: int   # broker clock (Kafka timestamp) of the batch's earliest and latest valid record
    last_timestamp_ms: int
    events: int = 0           # accepted events in the batch's files, and their size (filled in by ``publish``)
    size_bytes: int = 0
    partitions: dict[str, list[int]] = field(default_factory=dict)
    """Per Kafka partition with valid records: [first, last broker timestamp (ms), accepted events, file size].
    Empty in batches published before the per-partition layout."""
    accepted_at_ms: int = 0
    """Wall clock when ``accept`` started the batch (0 in batches published before reader batches): how long it
    has waited for its reader batch (``analytics.reader_batches``)."""

    def last_timestamp_of(self, partition: int) -> int | None:
        """The latest broker time of the partition's valid records in the batch (None: it had none); for a batch
        of the one-file layout, the batch's."""
        if not self.partitions:
            return self.last_timestamp_ms
        span = self.partitions.get(str(partition))
        return span[1] if span else None

    def partition_events(self, partition: int) -> int:
        """Accepted events of the partition in the batch (the batch's, in the one-file layout)."""
        return self.partitions.get(str(partition), [0, 0, 0, 0])[2] if self.partitions else self.events

    def partition_bytes(self, partition: int) -> int:
        """Size of the partition's file (the batch's file, in the one-file layout)."""
        return self.partitions.get(str(partition), [0, 0, 0, 0])[3] if self.partitions else self.size_bytes


def batch_dir(root: Path, batch_id: int) -> Path:
    """Where a published batch's files are, under ``root`` (the events or the partials directory)."""
    return root / f"{batch_id:012d}"


def partition_file(root: Path, batch_id: int, partition: int) -> Path:
    return batch_dir(root, batch_id) / f"{partition:05d}.parquet"


def _single_file(root: Path, batch_id: int) -> Path:
    """A batch's one file in the layout before per-partition files."""
    return root / f"{batch_id:012d}.parquet"


def _batch_files(root: Path, batch_id: int) -> list[Path]:
    directory = batch_dir(root, batch_id)
    if directory.is_dir():
        return sorted(directory.glob("*.parquet"))
    single = _single_file(root, batch_id)
    return [single] if single.exists() else []


def events_files(config: Config, batch_id: int) -> list[Path]:
    """The files of a published batch's events (none when it is not published)."""
    return _batch_files(config.accepted_events_dir, batch_id)


def partials_files(config: Config, batch_id: int) -> list[Path]:
    """The files of a published batch's window partials."""
    return _batch_files(config.window_partials_dir, batch_id)


def partition_events(config: Config, batch_id: int, partition: int, columns: Sequence[str]) -> pa.Table:
    """``columns`` of the events a published batch accepted from one Kafka partition (its file, or its rows of the
    batch's one file in the earlier layout)."""
    path = partition_file(config.accepted_events_dir, batch_id, partition)
    if path.exists():
        return pq.read_table(path, columns=list(columns))
    single = _single_file(config.accepted_events_dir, batch_id)
    wanted = list(dict.fromkeys([*columns, "partition"]))
    table = pq.read_table(single, columns=wanted, filters=[("partition", "=", partition)])
    return table.select(list(columns))


def _meta_file(config: Config, batch_id: int) -> Path:
    return config.accepted_events_dir / _META / f"{batch_id}.json"


def local_path(name: str) -> Path:
    """The path of a file as a reader's file-source log names it (a ``file:`` URI), or as given (a path)."""
    return Path(unquote(urlparse(name).path) if name.startswith("file:") else name)


def _batch_id(name: str) -> int:
    """The accept batch of a file a reader's file-source log names (either layout)."""
    file = local_path(name)
    return int(file.parent.name) if file.parent.name.isdigit() else int(file.name.split(".")[0])


def events_file_of(config: Config, log_file: str) -> Path:
    """The events file holding the events of a file a reader's file-source log names (an events or a partials
    file: the same reader batch and partition; before reader batches, the accept batch's file or one file)."""
    file = local_path(log_file)
    batch_id = _batch_id(log_file)
    if file.parent.name.isdigit():
        handed = batch_dir(config.reader_events_dir, batch_id) / file.name
        if file.parent.parent in (config.reader_events_dir, config.reader_partials_dir) and handed.exists():
            return handed
        # Before reader batches, or a reader batch of one accept batch handed to ``windows`` alone after an upgrade
        # (``analytics.reader_batches.hand_over``): the accept batch's own file.
        return batch_dir(config.accepted_events_dir, batch_id) / file.name
    return _single_file(config.accepted_events_dir, batch_id)


def published(config: Config, batch_id: int) -> bool:
    """The batch's events are published: its directory (or one file) is renamed into place only once its files
    and its metadata are on disk, so what exists is whole, even after a power loss."""
    return _published(config.accepted_events_dir, batch_id)


def partials_published(config: Config, batch_id: int) -> bool:
    """The batch's window partials are published (the same way)."""
    return _published(config.window_partials_dir, batch_id)


def _published(root: Path, batch_id: int) -> bool:
    return batch_dir(root, batch_id).is_dir() or _single_file(root, batch_id).exists()


def staging_dir(root: Path, batch_id: int, attempt: str) -> Path:
    """Where the tasks of one attempt at a batch write its files (``root``: the events or the partials directory),
    invisible to readers until ``publish`` renames it into place."""
    return root / _TMP / f"{batch_id:012d}-{attempt}"


def stage_file(staging: Path, partition: int, row_groups: Iterable[pa.Table]) -> int:
    """Write one partition's file of a batch into ``staging`` (run by the task that made the rows): each table of
    ``row_groups`` (one schema, at least one table; an iterator is consumed as it is written, so a task need not
    hold them all) as row groups of its own, in order, synced to disk. A retried task replaces the file of its failed
    attempt. Returns the file's size."""
    _make_directory(staging)
    target = staging / f"{partition:05d}.parquet"
    partial = staging / f".{partition:05d}-{uuid.uuid4().hex}.parquet"
    groups = iter(row_groups)
    first = next(groups)
    try:
        with pq.ParquetWriter(partial, first.schema) as writer:
            for rows in itertools.chain([first], groups):
                if rows.num_rows:
                    writer.write_table(rows)
        sync_file(partial)
        partial.rename(target)
    finally:
        partial.unlink(missing_ok=True)
    return target.stat().st_size


def publish(config: Config, meta: BatchMeta, attempt: str) -> None:
    """Publish the files the tasks of ``attempt`` staged for batch ``meta.batch_id`` (at least one task staged its
    partition's): first its events, then its window partials, each padded to one file per topic partition
    (``kafka.events_partitions``) with empty files, then renamed into place whole; the metadata (``meta`` with the
    events' size) is on disk before the events are. What is already published stays as it is (a replayed batch);
    staged files of other attempts at the batch (tasks that failed) are removed."""
    events_root, partials_root = config.accepted_events_dir, config.window_partials_dir
    files = config.kafka.events_partitions
    if not published(config, meta.batch_id):
        staged = staging_dir(events_root, meta.batch_id, attempt)
        _pad(staged, files)
        size = sum(f.stat().st_size for f in staged.glob("*.parquet"))
        publish_directory(staged, batch_dir(events_root, meta.batch_id),
                          before_rename=lambda: _save_meta(config, meta.batch_id, asdict(meta) | {"size_bytes": size}))
    if not partials_published(config, meta.batch_id):
        staged = staging_dir(partials_root, meta.batch_id, attempt)
        _pad(staged, files)
        publish_directory(staged, batch_dir(partials_root, meta.batch_id))
    for root in (events_root, partials_root):
        for leftover in (root / _TMP).glob(f"{meta.batch_id:012d}-*"):
            shutil.rmtree(leftover, ignore_errors=True)


def _pad(staged: Path, files: int) -> None:
    """One file per partition in ``staged``: an empty one (synced), of the staged files' schema, for each partition
    no task wrote."""
    schema = pq.read_schema(next(staged.glob("*.parquet")))
    for partition in range(files):
        if not (staged / f"{partition:05d}.parquet").exists():
            stage_file(staged, partition, [schema.empty_table()])


def _save_meta(config: Config, batch_id: int, meta: dict[str, object]) -> Path:
    """Write the batch's metadata (until its events are renamed into place no reader looks at it, so a plain
    overwrite is safe); returns its path, for ``publish_directory`` to sync before the rename."""
    path = _meta_file(config, batch_id)
    _make_directory(path.parent)
    path.write_text(json.dumps(meta))
    return path


def publish_directory(staged: Path, target: Path, before_rename: Callable[[], Path] | None = None) -> None:
    """Rename the directory ``staged`` (its files already synced) to ``target``, after syncing ``staged`` itself
    (the names of its files) and the file ``before_rename`` writes (with its directory), and sync ``target``'s
    parent after: once this returns the batch is published, and a power loss at any moment leaves it whole or
    absent."""
    companion = before_rename() if before_rename is not None else None
    sync_directory(staged)
    if companion is not None:
        sync_file(companion)
        sync_directory(companion.parent)
    _make_directory(target.parent)
    staged.rename(target)
    sync_directory(target.parent)


def _make_directory(directory: Path) -> None:
    """``mkdir -p``, syncing the parent of each directory it creates (once per directory, not per batch)."""
    if directory.is_dir():
        return
    missing = [d for d in (directory, *directory.parents) if not d.exists()]
    directory.mkdir(parents=True, exist_ok=True)
    for created in reversed(missing):
        sync_directory(created.parent)


def meta(config: Config, batch_id: int) -> BatchMeta:
    """The metadata of a published batch."""
    return BatchMeta(**json.loads(_meta_file(config, batch_id).read_text()))


# Metadata never changes once published: each file is read once per process. Per ``_meta`` directory: file name →
# its metadata, and the same oldest first, kept until a name comes or goes (several listings a second at a real-time
# pace: tasks' dedup horizons, the provisional rounds, the writer).
_known: dict[Path, dict[str, BatchMeta]] = {}
_ordered: dict[Path, list[BatchMeta]] = {}
_known_lock = threading.Lock()       # the driver lists from several threads (accept's writer, its helper threads)


def metas(config: Config) -> list[BatchMeta]:
    """Metadata of every published batch still kept, oldest first."""
    directory = config.accepted_events_dir / _META
    try:
        listed = {name for name in os.listdir(directory) if name.endswith(".json")}
    except FileNotFoundError:
        listed = set()
    with _known_lock:
        known = _known.setdefault(directory, {})
        changed = directory not in _ordered
        for gone in known.keys() - listed:
            del known[gone]   # expired (by this process or, for a Spark task's process, by the driver)
            changed = True
        for name in listed - known.keys():
            if not published(config, int(name.removesuffix(".json"))):
                continue   # metadata of a batch whose file is still being renamed into place (or was deleted)
            known[name] = BatchMeta(**json.loads((directory / name).read_text()))
            changed = True
        if changed:
            _ordered[directory] = sorted(known.values(), key=lambda m: m.batch_id)
        return list(_ordered[directory])


def read_stream(spark: SparkSession, config: Config, schema: StructType) -> DataFrame:
    """The accepted events as a stream, one reader batch (``analytics.reader_batches``) per micro-batch, in the order
    they were handed over."""
    return _one_batch_per_trigger(spark, config, config.reader_events_dir, schema)


def read_partials_stream(spark: SparkSession, config: Config, schema: StructType) -> DataFrame:
    """The window partials as a stream, one reader batch per micro-batch, in the order they were handed over."""
    return _one_batch_per_trigger(spark, config, config.reader_partials_dir, schema)


def _one_batch_per_trigger(spark: SparkSession, config: Config, directory: Path, schema: StructType) -> DataFrame:
    """The files under ``directory`` as a stream, a reader batch's files (one per topic partition) per
    micro-batch."""
    directory.mkdir(parents=True, exist_ok=True)
    return (spark.readStream.schema(schema).option("recursiveFileLookup", "true")
            .option("maxFilesPerTrigger", config.kafka.events_partitions).parquet(str(directory)))


def read_files(files: list[str], columns: Sequence[str]) -> pa.Table:
    """``columns`` of the accepted events in ``files`` (one or more, as a reader's file-source log names them:
    ``file:`` URIs)."""
    return pa.concat_tables([pq.read_table(local_path(f), columns=list(columns)) for f in files])


def newest_batch_read(checkpoint: Path, log_offset: int) -> int | None:
    """The newest accept batch among the files a downstream query had read by its log batch ``log_offset``
    (files are read in order, one per log batch)."""
    if log_offset < 0:
        return None
    return max((_batch_id(str(e["path"])) for e in source_log_entries(checkpoint, log_offset)), default=None)


def kafka_offsets_reached(config: Config, checkpoint: Path, log_offset: int) -> Offsets:
    """The Kafka offsets a downstream query's results reach once it has read file-source batch ``log_offset``:
    the end offsets of the newest accept batch among the files it read."""
    newest = newest_batch_read(checkpoint, log_offset)
    meta_path = _meta_file(config, newest) if newest is not None else None
    return json.loads(meta_path.read_text())["end_offsets"] if meta_path and meta_path.exists() else {}


def last_read(checkpoint: Path) -> int | None:
    """The newest accept batch a downstream query has read in a committed micro-batch (None: none yet)."""
    offsets = newest_committed_offsets(checkpoint)
    return None if offsets is None else newest_batch_read(checkpoint, int(offsets.get("logOffset", -1)))


def expire(config: Config, readers: list[Path], now_ms: int) -> list[int]:
    """Delete the batches no reader and no later batch's dedup horizon can still need. Returns the ids deleted.

    A batch goes only when all three hold: every reader (checkpoint dirs of the downstream queries) has read it
    and committed; its newest event reached the broker more than ``stream.accepted_retention_s`` before ``now_ms``
    (wall clock); and, with deduplication on, it is outside the dedup horizon of the newest published batch (its
    ``last_timestamp_ms`` before that batch's ``first_timestamp_ms`` − ``stream.dedup_horizon_ms``, the cut-off
    ``dedup.horizon`` applies). The last rule matters while the job catches up on a backlog older than the
    retention (a restart after a long outage): the wall-clock rule then passes every file, yet a re-sent copy
    later in the backlog must still be checked against them. It assumes that a later batch's earliest record
    reached the broker no earlier than the newest batch's earliest (broker time grows with the offsets read).

    Disk use stays bounded during a catch-up: the files kept beyond the readers' lag are those within the
    horizon of the newest batch's broker time, the very files the horizon's ids come from (``horizon_bytes`` in
    ``dedup_state``); once caught up, the wall-clock rule keeps at least as much (startup refuses a horizon longer
    than the retention)."""
    read_by_all = [last_read(checkpoint) for checkpoint in readers]
    if any(r is None for r in read_by_all):
        return []
    kept = metas(config)
    horizon = now_ms - config.stream.accepted_retention_s * 1000
    if config.stream.deduplicate and kept:
        horizon = min(horizon, kept[-1].first_timestamp_ms - config.stream.dedup_horizon_ms)
    deleted = []
    for meta in kept:
        if meta.batch_id < min(read_by_all) and meta.last_timestamp_ms < horizon:  # type: ignore[type-var]
            for root in (config.accepted_events_dir, config.window_partials_dir):
                shutil.rmtree(batch_dir(root, meta.batch_id), ignore_errors=True)
                _single_file(root, meta.batch_id).unlink(missing_ok=True)
            _meta_file(config, meta.batch_id).unlink(missing_ok=True)   # metas() forgets it at its next listing
            deleted.append(meta.batch_id)
    return deleted
