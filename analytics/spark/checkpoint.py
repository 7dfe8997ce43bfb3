"""Spark's checkpoint files, read (and, for one repair, edited) as plain files: the one place that knows their layout.

A query's checkpoint holds, per micro-batch ``N``:
- ``offsets/N``, the write-ahead log Spark writes *before* it runs the batch: ``v1``, the batch metadata (with
  ``batchWatermarkMs``), one line of source offsets (Kafka: ``{topic: {partition: offset}}``; a file source:
  ``{"logOffset": n}``);
- ``commits/N``, written once the batch's sink has finished;
- for a file source, ``sources/0/<log batch>``: the files the source chose for a log batch, before the batch that
  reads them is planned (every tenth log batch is compacted into ``<n>.compact``, which holds all entries up to it).

``batch_info`` tells, inside ``foreachBatch``, exactly which records the batch read and which watermark Spark
applied, so work done beside the aggregation (the straggler count) uses the very same batch and watermark. No Spark
is needed to read them. A Spark upgrade that changes this layout changes this module only.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Offsets = dict[str, Any]   # Kafka: {topic: {partition: offset}}; file source: {"logOffset": n}


@dataclass(frozen=True)
class BatchInfo:
    batch_id: int
    watermark_ms: int
    start_offsets: Offsets
    end_offsets: Offsets

    @property
    def has_records(self) -> bool:
        return self.start_offsets != self.end_offsets


def _json_after_header(text: str) -> str:
    return text[text.index("{"):]


def _planned_offsets(checkpoint: Path, batch_id: int) -> Offsets:
    """The source offsets ``offsets/<batch_id>`` planned the batch to read up to."""
    return json.loads((checkpoint / "offsets" / str(batch_id)).read_text().splitlines()[2])


def batch_info(checkpoint: Path, batch_id: int) -> BatchInfo:
    """The offset range and watermark of ``batch_id`` from the query's offset log (its single source: Kafka
    offsets per topic and partition, or a file source's ``{"logOffset": n}``)."""
    lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
    metadata = json.loads(lines[1])
    end = json.loads(lines[2])
    if batch_id > 0:
        start = _planned_offsets(checkpoint, batch_id - 1)
    elif "logOffset" in end:
        start = {"logOffset": -1}   # a file source (the accepted-events log) starts before its first entry
    else:
        # Batch 0 starts at the offsets the source resolved when the query was first started.
        start = json.loads(_json_after_header((checkpoint / "sources" / "0" / "0").read_text()))
    return BatchInfo(batch_id, int(metadata.get("batchWatermarkMs", 0)), start, end)


def planned_batches(checkpoint: Path) -> list[int]:
    """The micro-batches the query has planned (an ``offsets/N`` file each), oldest first."""
    return sorted(int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*"))


def newest_committed_offsets(checkpoint: Path) -> Offsets | None:
    """The source offsets the query's newest committed batch read up to (None: no batch committed yet)."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")]
    return _planned_offsets(checkpoint, max(commits)) if commits else None


def source_log_entries(checkpoint: Path, log_batch: int) -> list[dict[str, object]]:
    """The files a query's file source recorded for its log batch ``log_batch`` (``sources/0/N``, or the next
    ``N.compact`` file once Spark has compacted the log)."""
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
    """The files a file-source query's micro-batch read (its log range), as the source recorded them (``file:``
    URIs)."""
    start, end = int(info.start_offsets.get("logOffset", -1)), int(info.end_offsets.get("logOffset", -1))
    return [str(e["path"]) for n in range(start + 1, end + 1) for e in source_log_entries(checkpoint, n)]


def forget_unplanned_files(checkpoint: Path) -> list[int]:
    """Drop the file-source log batches of a query's checkpoint that no planned micro-batch covers (chosen just
    before a crash, see ``analytics.accepted_log``); returns the log batches dropped. Run before the query starts.

    Only entries past the newest planned batch's end offset are touched: nothing any batch read, or will replay,
    changes. A compacted log file (``N.compact``, which also holds every earlier entry) keeps those and loses only
    its own batch's entries."""
    log_dir, offsets_dir = checkpoint / "sources" / "0", checkpoint / "offsets"
    planned = [int(p.name) for p in offsets_dir.glob("[0-9]*")] if offsets_dir.exists() else []
    if not log_dir.exists():
        return []
    planned_end = int(_planned_offsets(checkpoint, max(planned)).get("logOffset", -1)) if planned else -1
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
