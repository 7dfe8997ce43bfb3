"""Accept batches handed to the stateful queries, one reader batch at a time.

``accept`` reads Kafka every ``stream.accept_interval_s``: each of its batches makes its events' log lines
searchable and is published to the accepted-events log (``analytics.accepted_log``), where the dedup horizon keeps
it. The ``windows`` and ``keyed_windows`` queries take one **reader batch** per micro-batch: the accept batches
published since the previous reader batch, handed over once they span ``stream.trigger_interval_s``. Their
watermark advances between reader batches, so which events are stragglers depends on these groups alone; the
groups are fixed on disk before any reader sees them, so a restarted reader reads the very same groups and judges
every event as an uninterrupted run does. With ``accept_interval_s`` equal to ``trigger_interval_s`` (the default),
or in a run that drains what is in Kafka and stops (``availableNow``: the tests, the benchmarks' drains), every
accept batch is a reader batch of its own, as before reader batches existed.

A reader batch is a directory named by its newest accept batch, ``<dir>/<batch id:012d>/``, holding one file per
events-topic partition, under :attr:`Config.reader_events_dir` (read by ``keyed_windows``, and by ``windows``' late
pass) and :attr:`Config.reader_partials_dir` (read by ``windows``). A reader batch of one accept batch links that
batch's files (no copy); one of several writes each partition's files one after the other, row group by row group,
so each row group keeps its statistics (``analytics.keyed.rows``). Events are handed over before partials (the
windows writer reads the events of the partials it merged), each directory renamed into place whole, after a
sync; a hand-over cut short by a crash is finished, over the same accept batches, before the next one starts (and
after an upgrade from a version without reader batches, a reader that was behind the other reads on one accept
batch at a time, as it did). Once
both readers have read and committed a reader batch newer than another, the older one is deleted: the
accepted-events log, not this directory, is what the dedup horizon and retention keep. Each directory is deleted by
the query that reads it, in its own micro-batch (:func:`expire`): Spark lists a root's batch directories one by one
while it looks for new files, and one deleted in between fails the query.

Why groups and not a shorter trigger for everything: each query pays a fixed cost per micro-batch, and at a low
rate the readers' batches are nearly all fixed cost (docs/performance.md, "Accept often, windows per reader batch").
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from analytics import accepted_log
from analytics.accepted_log import BatchMeta
from analytics.vocabulary import KEYED_WINDOWS_QUERY, WINDOWS_QUERY
from eventide.config import Config

hand_over_lock = threading.Lock()
"""Held while a hand-over decides and publishes: the accept writer and the idle-stream timer both hand over."""


def roots(config: Config) -> list[tuple[Path, Path, Path]]:
    """(accepted-events log root, reader-batch root, the checkpoint of the query reading that root), events first."""
    return [(config.accepted_events_dir, config.reader_events_dir, config.checkpoint_dir / KEYED_WINDOWS_QUERY),
            (config.window_partials_dir, config.reader_partials_dir, config.checkpoint_dir / WINDOWS_QUERY)]


def newest_handed_over(root: Path, reader: Path) -> int:
    """The newest accept batch handed over under ``root``: its newest reader batch (the newest is never deleted,
    see :func:`expire`); before the first one, the newest batch its reader read from the accepted-events log itself
    (a job upgraded to reader batches), else -1."""
    found = [int(d.name) for d in root.iterdir() if d.name.isdigit()] if root.is_dir() else []
    if found:
        return max(found)
    read = accepted_log.last_read(reader)
    return -1 if read is None else read


def hand_over(config: Config, now_ms: int, due: Callable[[list[BatchMeta], int], bool]) -> int | None:
    """Hand the accept batches published since the last reader batch to the readers as one reader batch, if
    ``due(pending, now_ms)`` says their time has come. First finishes a hand-over a crash cut short. Returns the
    new reader batch's id (its newest accept batch), or None."""
    with hand_over_lock:
        places = roots(config)
        newest = [newest_handed_over(target, reader) for _, target, reader in places]
        target_id = max(newest)
        published = accepted_log.metas(config)
        for (source, target, _), since in zip(places, newest, strict=True):
            if since == target_id:
                continue
            lagging = _between(published, since, target_id)
            if any(accepted_log.batch_dir(other, target_id).is_dir() for _, other, _ in places):
                _publish(config, source, target, lagging, target_id)   # a crash cut this hand-over short
            else:   # upgraded while one reader was behind the other: it reads on as it did, batch by batch
                for meta in lagging:
                    _publish(config, source, target, [meta], meta.batch_id)
        pending = _between(published, target_id, None)
        if not pending or not due(pending, now_ms):
            return None
        newest_id = pending[-1].batch_id
        for source, target, _ in places:
            _publish(config, source, target, pending, newest_id)
        return newest_id


def due_after(config: Config, live: bool) -> Callable[[list[BatchMeta], int], bool]:
    """When pending accept batches become a reader batch: right away unless the job runs live with
    ``accept_interval_s`` under ``trigger_interval_s``; then once the oldest was accepted at least
    ``trigger_interval_s`` − ``accept_interval_s`` ago (so a reader batch spans about ``trigger_interval_s``, the
    accept batch that completes it included)."""
    stream = config.stream
    span_ms = (stream.trigger_interval_s - stream.accept_interval) * 1000
    if not live or span_ms <= 0:
        return lambda pending, now_ms: True
    return lambda pending, now_ms: now_ms - pending[0].accepted_at_ms >= span_ms


def due_when_idle(config: Config) -> Callable[[list[BatchMeta], int], bool]:
    """For the idle-stream timer: pending accept batches whose oldest was accepted a whole ``trigger_interval_s``
    ago are handed over even if no new accept batch comes to complete them."""
    span_ms = config.stream.trigger_interval_s * 1000
    return lambda pending, now_ms: now_ms - pending[0].accepted_at_ms >= span_ms


def _between(published: list[BatchMeta], after: int, up_to: int | None) -> list[BatchMeta]:
    return [m for m in published if m.batch_id > after and (up_to is None or m.batch_id <= up_to)]


def _publish(config: Config, source: Path, target: Path, batches: list[BatchMeta], newest_id: int) -> None:
    """Write the files of ``batches`` (published under ``source``) as reader batch ``newest_id`` under ``target``."""
    if accepted_log.batch_dir(target, newest_id).is_dir():
        return
    staged = accepted_log.staging_dir(target, newest_id, uuid.uuid4().hex)
    staged.mkdir(parents=True)
    for partition in range(config.kafka.events_partitions):
        files = [accepted_log.partition_file(source, m.batch_id, partition) for m in batches]
        if len(files) == 1:
            os.link(files[0], staged / files[0].name)   # already synced by the task that wrote it
        else:
            accepted_log.stage_file(staged, partition, _row_groups(files))
    accepted_log.publish_directory(staged, accepted_log.batch_dir(target, newest_id))


def _row_groups(files: list[Path]) -> Iterator[pa.Table]:
    """``files``' row groups in order (each written as one again keeps its statistics), after an empty table of
    their schema (``stage_file`` takes its schema from the first table and skips empty ones)."""
    opened = [pq.ParquetFile(f) for f in files]
    yield opened[0].schema_arrow.empty_table()
    for file in opened:
        for group in range(file.num_row_groups):
            yield file.read_row_group(group)


def expire(config: Config, reader: str) -> list[int]:
    """Delete the reader batches under the root the query ``reader`` reads that both readers have read and
    committed, but the newest. Returns the ids deleted.

    Called by that query's batch writer, on the thread that also lists the root between micro-batches, so a
    directory never goes while Spark lists it (from ``accept``'s batch it once failed ``keyed_windows`` with a
    ``FileNotFoundException`` at 20k events/s)."""
    with hand_over_lock:
        return _expire(config, reader)


def _expire(config: Config, reader: str) -> list[int]:
    read = [accepted_log.last_read(checkpoint) for _, _, checkpoint in roots(config)]
    if any(r is None for r in read):
        return []
    oldest_read = min(r for r in read if r is not None)
    deleted: set[int] = set()
    for _, target, checkpoint in roots(config):
        if checkpoint.name != reader or not target.is_dir():
            continue
        ids = sorted(int(d.name) for d in target.iterdir() if d.name.isdigit())
        for batch_id in ids[:-1]:
            if batch_id < oldest_read:
                shutil.rmtree(accepted_log.batch_dir(target, batch_id), ignore_errors=True)
                deleted.add(batch_id)
        staging_root = accepted_log.staging_dir(target, 0, "").parent
        for leftover in staging_root.glob("*-*"):   # staged by a hand-over a crash cut short, since finished
            if ids and int(leftover.name.split("-")[0]) <= ids[-1]:
                shutil.rmtree(leftover, ignore_errors=True)
    return sorted(deleted)
