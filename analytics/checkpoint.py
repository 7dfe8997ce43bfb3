"""What each micro-batch of a query read: its offset range and watermark, from the query's checkpoint.

``batch_info`` reads the query's offset log, the write-ahead log Spark writes *before* it runs a batch
(``<checkpoint>/offsets/<batch id>``: ``v1``, the batch metadata with ``batchWatermarkMs``, one line of source
offsets). Inside ``foreachBatch`` it tells exactly which records the batch read and which watermark Spark applied,
so work done beside the aggregation (the straggler count) uses the very same batch and watermark. Plain files:
no Spark needed to read them.
"""

from __future__ import annotations

import json
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


def batch_info(checkpoint: Path, batch_id: int) -> BatchInfo:
    """The offset range and watermark of ``batch_id`` from the query's offset log (its single source: Kafka
    offsets per topic and partition, or a file source's ``{"logOffset": n}``)."""
    lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
    metadata = json.loads(lines[1])
    end = json.loads(lines[2])
    if batch_id > 0:
        start = json.loads((checkpoint / "offsets" / str(batch_id - 1)).read_text().splitlines()[2])
    elif "logOffset" in end:
        start = {"logOffset": -1}   # a file source (the accepted-events log) starts before its first entry
    else:
        # Batch 0 starts at the offsets the source resolved when the query was first started.
        start = json.loads(_json_after_header((checkpoint / "sources" / "0" / "0").read_text()))
    return BatchInfo(batch_id, int(metadata.get("batchWatermarkMs", 0)), start, end)
