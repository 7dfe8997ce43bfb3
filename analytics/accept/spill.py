"""The valid records an ``accept`` task holds for its Kafka partition: in memory up to ``stream.task_memory_bytes``,
beyond that in a file on the task's local disk, read back memory-mapped.

A task needs its partition's whole batch at once for the choices that span it (first copies, session runs, window
partials), but those read a few narrow columns; the wide ones (a log's message, the tags) are only copied into the
events file and the ``logs`` rows. So a task that has spilled handles the wide columns one slice of rows at a time
(:meth:`HeldRecords.slices`), and what it holds in memory is the narrow columns of its batch plus one slice, whatever
the batch's size in bytes. The Arrow file is written once and mapped, not read: its pages are the kernel's page cache,
which the kernel drops under pressure, not the worker's own memory.

The slices depend only on the records and the budget, so a replayed batch (the same records, the same settings)
is cut into the same slices and writes the same ``logs`` blocks, which the table's insert deduplication drops.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow as pa

SLICES_PER_BUDGET = 4
"""A spilled batch's wide columns are handled in slices of at most this fraction of the budget: a slice is copied a
few times over (filtered, split into row groups, made into ``logs`` rows) while the narrow columns stay held."""


class HeldRecords:
    """A task's valid records, in the order they arrived: ``add`` them chunk by chunk, then read them as one
    :meth:`table` and cut them into :meth:`slices`. Use as a context manager: leaving it removes the spill file."""

    def __init__(self, budget_bytes: int, directory: str | None = None) -> None:
        self.budget_bytes = budget_bytes
        self.spilled_bytes = 0
        self._directory = directory
        self._held: list[pa.RecordBatch] = []
        self._held_bytes = 0
        self._path: Path | None = None
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._mapped: pa.MemoryMappedFile | None = None

    def __enter__(self) -> HeldRecords:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def add(self, chunk: pa.RecordBatch) -> None:
        """Keep ``chunk``; once the records held reach the budget, every record so far and from then on goes to the
        spill file."""
        if self._writer is None:
            self._held.append(chunk)
            self._held_bytes += chunk.nbytes
            if self._held_bytes <= self.budget_bytes:
                return
            self._open_spill(chunk.schema)
            chunks, self._held, self._held_bytes = self._held, [], 0
        else:
            chunks = [chunk]
        assert self._writer is not None
        for spilled in chunks:
            self._writer.write_batch(spilled)
            self.spilled_bytes += spilled.nbytes

    @property
    def spilled(self) -> bool:
        return self._writer is not None

    def table(self) -> pa.Table:
        """Every record added (at least one chunk, which may be empty): in memory, or mapped from the spill file."""
        if self._writer is None:
            return pa.Table.from_batches(self._held)
        assert self._path is not None
        self._writer.close()
        self._mapped = pa.memory_map(str(self._path))
        table = pa.ipc.open_file(self._mapped).read_all()   # zero-copy: the buffers are the mapped pages
        self._path.unlink()   # the mapping keeps the pages; nothing is left behind if the task dies from here on
        self._path = None
        return table

    def slices(self, table: pa.Table) -> list[tuple[int, int]]:
        """Row ranges ``[start, end)`` of ``table`` (this holder's :meth:`table`) to handle its wide columns in: the
        whole table when nothing was spilled, else consecutive ranges of about ``budget / SLICES_PER_BUDGET`` bytes
        (at least one row each)."""
        if not self.spilled:
            return [(0, table.num_rows)]
        share = max(1, self.budget_bytes // SLICES_PER_BUDGET)
        ranges, start = [], 0
        for batch in table.to_batches():
            rows = batch.num_rows
            per_slice = max(1, rows * share // max(1, batch.nbytes))
            for offset in range(0, rows, per_slice):
                end = start + min(per_slice, rows - offset)
                ranges.append((start, end))
                start = end
        return ranges

    def close(self) -> None:
        """Drop the mapping and the spill file (if it is still there)."""
        if self._writer is not None and self._path is not None:
            self._writer.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)
        if self._mapped is not None:
            self._mapped.close()
        self._held = []

    def _open_spill(self, schema: pa.Schema) -> None:
        handle, name = tempfile.mkstemp(prefix="eventide-accept-", suffix=".arrow", dir=self._directory)
        os.close(handle)
        self._path = Path(name)
        self._writer = pa.ipc.new_file(str(self._path), schema)
