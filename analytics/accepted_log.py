"""The accepted-events log: validated, deduplicated events, handed from the ``accept`` query to the stateful ones.

The ``accept`` query writes one Parquet file per micro-batch, ``<dir>/<batch id:012d>.parquet``, and the stateful
queries read the directory with Spark's file source, one file per micro-batch, so their batches are the accept
query's batches. A file is published atomically: written aside (``_tmp/``), its metadata saved
(``_meta/<batch id>.json``: the Kafka offsets the batch read, its broker-clock span, its size), then renamed into
place; names starting with ``_`` are invisible to the file source. Before that rename the file and the metadata
are synced to disk (and the metadata's directory), and after it the directory the file was renamed into, so after
a power loss a published file is whole or absent, never empty or cut. A replayed accept batch whose file exists
writes nothing: the hand-over is exactly-once without Kafka transactions, and a downstream query that read the
file before a crash reads the very same events again.

A reader killed between choosing its next file (Spark's file source writes ``sources/0/<n>`` first) and planning
the batch that reads it (``offsets/<N>``) would, once restarted, plan a batch over that orphaned entry *and* the
next new file: two accept batches under one watermark, so late events judged otherwise than in a run never killed.
``forget_unplanned_files`` removes such an entry before a reader starts; Spark then chooses that file again, alone.

Beside each events file, ``publish_partials`` writes the batch's window partials (``analytics.windows.partials``)
as ``<partials dir>/<batch id:012d>.parquet``, the same way: the ``windows`` query reads those, one per micro-batch,
and the ``keyed_windows`` query the events. A batch's partials are published after its events file (the windows
writer reads the events of the batch whose partials it merged); an accept batch replayed after a crash in between
publishes them.

Why files and not a Kafka topic: Spark's Kafka sink is at-least-once, so a replayed batch would hand its events
over twice, and the windows would need a second deduplication (docs/architecture.md, "Accepted events").
The driver publishes and reads these files with local-filesystem calls (``pathlib``, ``pyarrow``), and renames are
atomic on a POSIX filesystem: on a multi-host cluster ``stream.checkpoint_dir`` must be a shared POSIX mount (NFS),
not HDFS or an object store (docs/operations.md).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from analytics.checkpoint import BatchInfo, Offsets
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
    events: int = 0           # accepted events in the file, and its size (filled in by ``publish``)
    size_bytes: int = 0


def events_file(config: Config, batch_id: int) -> Path:
    return config.accepted_events_dir / f"{batch_id:012d}.parquet"


def _meta_file(config: Config, batch_id: int) -> Path:
    return config.accepted_events_dir / _META / f"{batch_id}.json"


def _batch_id(events_path: str) -> int:
    return int(Path(events_path.removeprefix("file:")).name.split(".")[0])


def partials_file(config: Config, batch_id: int) -> Path:
    return config.window_partials_dir / f"{batch_id:012d}.parquet"


def events_file_of(config: Config, log_file: str) -> Path:
    """The events file of the batch of a file a reader's file-source log names (an events or a partials file)."""
    return events_file(config, _batch_id(log_file))


def published(config: Config, batch_id: int) -> bool:
    """The batch's events file exists: it is renamed into place only once it and its metadata are on disk, so an
    existing file is whole, even after a power loss."""
    return events_file(config, batch_id).exists()


def publish(config: Config, row_groups: Sequence[pa.Table], meta: BatchMeta) -> None:
    """Write the batch's events (``envelope.accepted_schema``'s columns and any others, one schema) as its one
    file, atomically, each table of ``row_groups`` as row groups of its own, in order; a no-op when it is already
    published. The stored metadata is ``meta`` with the file's event count and size."""
    if published(config, meta.batch_id):
        return
    events = sum(rows.num_rows for rows in row_groups)
    # One file per batch, so a reader taking one file per trigger takes exactly one accept batch.
    _write_atomically(row_groups, events_file(config, meta.batch_id), before_rename=lambda size: _save_meta(
        config, meta.batch_id, asdict(meta) | {"events": events, "size_bytes": size}))


def publish_partials(config: Config, batch_id: int, rows: Callable[[], pa.Table]) -> None:
    """Write the batch's window partials (``window_partials.SCHEMA``, computed by ``rows`` only when needed) as its
    one partials file, atomically; a no-op when it is already published (a replayed batch)."""
    if not partials_file(config, batch_id).exists():
        _write_atomically([rows()], partials_file(config, batch_id))


def _save_meta(config: Config, batch_id: int, meta: dict[str, object]) -> Path:
    """Write the batch's metadata (until its events file is renamed into place no reader looks at it, so a plain
    overwrite is safe); returns its path, for ``_write_atomically`` to sync with the events file."""
    path = _meta_file(config, batch_id)
    _make_directory(path.parent)
    path.write_text(json.dumps(meta))
    return path


def _write_atomically(row_groups: Sequence[pa.Table], target: Path,
                      before_rename: Callable[[int], Path | None] | None = None) -> None:
    """Write ``row_groups`` (one schema; each table its own row groups) aside (``_tmp/``, invisible to Spark's
    file source), sync it, then rename the file to ``target`` and sync ``target``'s directory: once this returns
    the file is published, and a power loss at any moment leaves it whole or absent. ``before_rename`` gets the
    file's size and may write a file of its own that must be on disk before the rename (synced with its directory).
    """
    staging = target.parent / _TMP / f"{target.stem}-{uuid.uuid4().hex}.parquet"
    _make_directory(staging.parent)
    try:
        with pq.ParquetWriter(staging, row_groups[0].schema) as writer:
            for rows in row_groups:
                if rows.num_rows:
                    writer.write_table(rows)
        companion = before_rename(staging.stat().st_size) if before_rename is not None else None
        # Data before name: without these syncs the rename can reach the disk before the data (an empty or cut
        # file published). Every write comes before the first sync, so one journal commit can carry them all.
        # The staging name itself need not be durable, only the rename's (the target directory's sync).
        sync_file(staging)
        if companion is not None:
            sync_file(companion)
            sync_directory(companion.parent)
        staging.rename(target)
        sync_directory(target.parent)
    finally:
        staging.unlink(missing_ok=True)


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


_known: dict[Path, BatchMeta] = {}   # metadata never changes once published: read each file once per process


def metas(config: Config) -> list[BatchMeta]:
    """Metadata of every published batch still kept, oldest first."""
    found = []
    for path in (config.accepted_events_dir / _META).glob("*.json"):
        if path not in _known:
            if not published(config, int(path.stem)):
                continue   # metadata of a batch whose file is still being renamed into place (or was deleted)
            _known[path] = BatchMeta(**json.loads(path.read_text()))
        found.append(_known[path])
    return sorted(found, key=lambda m: m.batch_id)


def read_stream(spark: SparkSession, config: Config, schema: StructType) -> DataFrame:
    """The accepted events as a stream, one accept batch per micro-batch, in the order they were published."""
    return _one_file_per_batch(spark, config.accepted_events_dir, schema)


def read_partials_stream(spark: SparkSession, config: Config, schema: StructType) -> DataFrame:
    """The window partials as a stream, one accept batch per micro-batch, in the order they were published."""
    return _one_file_per_batch(spark, config.window_partials_dir, schema)


def _one_file_per_batch(spark: SparkSession, directory: Path, schema: StructType) -> DataFrame:
    directory.mkdir(parents=True, exist_ok=True)
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(directory))


def read_files(files: list[str], columns: Sequence[str]) -> pa.Table:
    """``columns`` of the accepted events in ``files`` (one or more, as a reader's file-source log names them:
    ``file:`` URIs), read in the driver."""
    return pa.concat_tables([pq.read_table(unquote(urlparse(f).path), columns=list(columns)) for f in files])


def forget_unplanned_files(checkpoint: Path) -> list[int]:
    """Drop the file-source log batches of a reader's checkpoint that no planned micro-batch covers (written just
    before a crash, see the module docstring); returns the log batches dropped. Run before the reader starts.

    Only entries past the newest planned batch's end offset are touched: nothing any batch read, or will replay,
    changes. A compacted log file (``N.compact``, which also holds every earlier entry) keeps those and loses only
    its own batch's entries."""
    log_dir, offsets_dir = checkpoint / "sources" / "0", checkpoint / "offsets"
    planned = [int(p.name) for p in offsets_dir.glob("[0-9]*")] if offsets_dir.exists() else []
    if not log_dir.exists():
        return []
    planned_end = (int(json.loads((offsets_dir / str(max(planned))).read_text().splitlines()[2])
                       .get("logOffset", -1)) if planned else -1)
    dropped = []
    for path in log_dir.iterdir():
        name = path.name.removesuffix(".compact")
        if not name.isdigit() or int(name) <= planned_end:
            continue
        log_batch = int(name)
        if path.name.endswith(".compact"):
            header, *entries = path.read_text().splitlines()
            kept = [e for e in entries if e.strip() and int(json.loads(e)["batchId"]) != log_batch]
            staged = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
            staged.write_text("\n".join([header, *kept]))
            staged.replace(path)
        else:
            path.unlink()
        # Hadoop's local filesystem keeps a checksum beside each file: a stale one would fail the next read.
        path.with_name(f".{path.name}.crc").unlink(missing_ok=True)
        dropped.append(log_batch)
    return sorted(dropped)


def _source_log_entries(checkpoint: Path, log_batch: int) -> list[dict[str, object]]:
    """The files a query's file source recorded for its log batch ``log_batch`` (``sources/0/N``, or the next
    ``N.compact`` file once Spark has compacted the log: every tenth batch holds all entries up to it)."""
    log_dir = checkpoint / "sources" / "0"
    path = log_dir / str(log_batch)
    if not path.exists():
        compacts = sorted(int(p.name.split(".")[0]) for p in log_dir.glob("*.compact"))
        path = log_dir / f"{next((c for c in compacts if c >= log_batch), log_batch)}.compact"
        if not path.exists():
            return []
    entries = [json.loads(line) for line in path.read_text().splitlines()[1:] if line.strip()]
    return [e for e in entries if int(e["batchId"]) == log_batch]


def files_read(checkpoint: Path, info: BatchInfo) -> list[str]:
    """The accepted-events files a downstream query's micro-batch read (its file-source log range)."""
    start, end = int(info.start_offsets.get("logOffset", -1)), int(info.end_offsets.get("logOffset", -1))
    return [str(e["path"]) for n in range(start + 1, end + 1) for e in _source_log_entries(checkpoint, n)]


def _newest_batch_read(checkpoint: Path, log_offset: int) -> int | None:
    """The newest accept batch among the files a downstream query had read by its log batch ``log_offset``
    (files are read in order, one per log batch)."""
    if log_offset < 0:
        return None
    return max((_batch_id(str(e["path"])) for e in _source_log_entries(checkpoint, log_offset)), default=None)


def kafka_offsets_reached(config: Config, checkpoint: Path, log_offset: int) -> Offsets:
    """The Kafka offsets a downstream query's results reach once it has read file-source batch ``log_offset``:
    the end offsets of the newest accept batch among the files it read."""
    newest = _newest_batch_read(checkpoint, log_offset)
    meta_path = _meta_file(config, newest) if newest is not None else None
    return json.loads(meta_path.read_text())["end_offsets"] if meta_path and meta_path.exists() else {}


def last_read(checkpoint: Path) -> int | None:
    """The newest accept batch a downstream query has read in a committed micro-batch (None: none yet)."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")]
    if not commits:
        return None
    offsets = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    return _newest_batch_read(checkpoint, int(json.loads(offsets[2]).get("logOffset", -1)))


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
            events_file(config, meta.batch_id).unlink(missing_ok=True)
            partials_file(config, meta.batch_id).unlink(missing_ok=True)
            _meta_file(config, meta.batch_id).unlink(missing_ok=True)
            _known.pop(_meta_file(config, meta.batch_id), None)
            deleted.append(meta.batch_id)
    return deleted
