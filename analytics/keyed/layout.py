"""Which state row of ``keyed_windows`` holds a session key: the session layout, fixed when the query's checkpoint is
created and recorded in it.

Session keys (users, devices) are hashed into ``stream.session_buckets`` buckets, and a bucket is one key of Spark's
stateful operator. Every operator key a micro-batch touches costs Spark's Python operator a fixed price (its state
calls and its frames), so at a steady rate a batch costs about as much per bucket touched as per event
(docs/performance.md#the-python-stateful-operator). Two layouts:

- **shared**: the buckets are shared by every app (``session_buckets`` operator keys in all); the app travels in
  each session key. Every checkpoint created since the layout is recorded.
- **per app**: each app has ``session_buckets`` buckets of its own (apps × ``session_buckets`` operator keys); the
  layout of checkpoints created before, kept for them.

A session key must stay in its bucket for the checkpoint's whole life (moved to another, its open session would
start again as a second one), so the layout and the bucket count are recorded in the checkpoint when it is first
used, and a start whose ``stream.session_buckets`` differs from the record is refused with the field's name.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from eventide.config import ConfigError
from eventide.durable import sync_directory, sync_file

RECORD = "eventide-session-layout.json"
"""The record's file name in the query's checkpoint directory (Spark ignores files it does not know there)."""


@dataclass(frozen=True)
class SessionLayout:
    per_app: bool
    buckets: int


def session_layout(checkpoint: Path, buckets: int) -> SessionLayout:
    """The layout of the ``keyed_windows`` checkpoint at ``checkpoint`` for ``buckets`` (``stream.session_buckets``):
    as recorded; else per app when the checkpoint already has batches (created before the record existed), shared
    when it has none; recorded then. Raises :class:`ConfigError` when the record holds another bucket count."""
    record = checkpoint / RECORD
    if record.exists():
        stored = json.loads(record.read_text())
        layout = SessionLayout(per_app=bool(stored["per_app"]), buckets=int(stored["buckets"]))
        if layout.buckets != buckets:
            raise ConfigError(
                f"stream.session_buckets is {buckets}, but the keyed_windows checkpoint {checkpoint} holds sessions "
                f"in {layout.buckets} buckets: set it back to {layout.buckets}, or start on fresh checkpoints "
                "(docs/operations.md#upgrades-and-checkpoint-compatibility)")
        return layout
    has_batches = any((checkpoint / "offsets").glob("[0-9]*"))
    layout = SessionLayout(per_app=has_batches, buckets=buckets)
    checkpoint.mkdir(parents=True, exist_ok=True)
    written = record.with_name(f".{RECORD}.{os.getpid()}")
    written.write_text(json.dumps(asdict(layout)))
    sync_file(written)
    written.replace(record)
    sync_directory(checkpoint)
    return layout
