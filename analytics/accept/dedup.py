"""Deduplication by event id within its app (docs/time-semantics.md, "Duplicates"), before any window sees an event.

An id is unique within its ``app`` (BRIEF §1), so the duplicate key is (app, id): two apps that happen to use the
same id never suppress each other's events. The first copy of a key is accepted: earliest on the broker's clock
(Kafka timestamp), ties broken by Kafka position, so every replay of a micro-batch picks the same copy. A later copy
is a duplicate when its key is among the batch's earlier copies or among the events accepted within the horizon
before it; the accepted-events log (``analytics.accepted_log``, which stores ``app`` and ``id``) is that memory, so
it survives restarts with nothing else to checkpoint.

**Per Kafka partition.** The events topic's key is the device (BRIEF §1), and every copy of an event is sent by its
device (the SDK's retries and spool, the gateway's clients re-sending a request), so every copy of an event lands in
the partition of its first copy. So the choice is made where the partition is read: in the Spark task that accepts
the partition's records (``analytics.accept.task``), against the keys its partition accepted within the horizon,
with no shuffle and no state shared between tasks. A copy produced with another key (another device name) lands
elsewhere and is not recognised; docs/time-semantics.md says so.

The keys are kept in the task's Python process between batches (``AcceptedIds``, one per partition), vectorised
(a micro-batch's share of a partition is at most ``stream.max_offsets_per_trigger`` records); a process that has
not seen the partition, or was restarted, reads them back from the partition's files. Doing it in Spark's own
operators cost a shuffle of whole events and a re-read of the horizon's files in every batch.

A key is one string, ``<length of app>:<app>:<id>`` (the length makes it unambiguous whatever the app or id holds),
so the batch's keys are hashed once and the horizon's are probed against them as plain strings, as ids were.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analytics import accepted_log
from analytics.accepted_log import BatchMeta
from eventide.config import Config

POSITION = ("partition", "offset")
KEY_COLUMNS = ("app", "id")
"""An event's duplicate key: its id within its app."""
ORDER = ("kafka_timestamp", *POSITION)
"""What orders a key's copies: broker time, then Kafka position."""
# The columns ``first_copies`` reads: the key and what orders its copies.
COPY_COLUMNS = (*KEY_COLUMNS, *ORDER)


def keys(events: pa.Table) -> pa.Array:
    """The duplicate keys of ``events`` (columns ``app`` and ``id``), one string per row.

    A table without an ``app`` column is taken as one app's events: its keys are the ids (pure-logic tests)."""
    ids = events["id"].combine_chunks() if isinstance(events["id"], pa.ChunkedArray) else events["id"]
    if "app" not in events.column_names:
        return ids
    apps = events["app"].combine_chunks() if isinstance(events["app"], pa.ChunkedArray) else events["app"]
    return pc.binary_join_element_wise(pc.cast(pc.utf8_length(apps), pa.string()), apps, ids, ":")


def horizon(config: Config, batch_id: int, partition: int, earliest_ms: int) -> list[BatchMeta]:
    """The published batches a batch's records of one Kafka partition are checked against: every earlier batch
    holding an event of that partition that reached the broker within the horizon before the partition's
    earliest record in this batch."""
    cutoff = earliest_ms - config.stream.dedup_horizon_ms
    return [m for m in accepted_log.metas(config) if m.batch_id < batch_id
            and (last := m.last_timestamp_of(partition)) is not None and last >= cutoff]


class AcceptedIds:
    """The keys (app, id: :func:`keys`) each published batch accepted from one Kafka partition, held in memory for
    as long as the batch is within the horizon.

    After a restart (or for a batch evicted and needed again) the keys are read back from the batch's file of the
    partition (its ``app`` and ``id`` columns), so the memory is a cache of the accepted-events log and needs no
    checkpoint of its own."""

    def __init__(self, config: Config, partition: int) -> None:
        self._config = config
        self._partition = partition
        self._ids: dict[int, pa.Array] = {}

    def remember(self, batch_id: int, accepted: pa.Table) -> None:
        """Keep the keys of the events ``batch_id`` accepted from the partition (a table with ``app`` and ``id``)."""
        self._ids[batch_id] = keys(accepted.select(list(KEY_COLUMNS)))

    def of(self, batches: list[BatchMeta]) -> pa.ChunkedArray:
        """The keys accepted from the partition by ``batches``; keys of batches not among them are forgotten."""
        wanted = {m.batch_id for m in batches}
        for batch_id in set(self._ids) - wanted:
            del self._ids[batch_id]
        for batch_id in wanted - set(self._ids):
            self._ids[batch_id] = keys(accepted_log.partition_events(self._config, batch_id, self._partition,
                                                                     KEY_COLUMNS))
        return pa.chunked_array([self._ids[b] for b in sorted(wanted)], type=pa.string())

    def nbytes(self, batches: list[BatchMeta]) -> int:
        """Memory held by the keys of ``batches``."""
        return sum(self._ids[m.batch_id].nbytes for m in batches if m.batch_id in self._ids)


def first_copies(batch: pa.Table, remembered: pa.ChunkedArray) -> pa.BooleanArray:
    """Which rows of ``batch`` (``COPY_COLUMNS``) are the first copy of their key (app, id): the earliest of the
    batch's copies (broker time, then position), and only if no batch within the horizon accepted the key before
    (``remembered``: keys as :func:`keys` makes them)."""
    if batch.num_rows == 0:
        return pa.array([], pa.bool_())
    encoded = pc.dictionary_encode(keys(batch))
    codes = encoded.indices.to_numpy()
    keep = np.ones(batch.num_rows, dtype=bool)
    # Only keys with several copies in the batch need ordering (a few %): sorting every row was most of the cost.
    repeated = np.flatnonzero(np.bincount(codes)[codes] > 1)
    if len(repeated):
        order = pc.sort_indices(batch.take(pa.array(repeated)),
                                sort_keys=[(c, "ascending") for c in ORDER]).to_numpy()
        earliest = np.zeros(len(repeated), dtype=bool)
        earliest[order[np.unique(codes[repeated][order], return_index=True)[1]]] = True   # each key's first
        keep[repeated] = earliest
    if len(remembered):
        # The horizon's keys (rate x horizon / partitions, millions at a high rate) are probed against the batch's
        # distinct keys, not hashed into a set of their own in every batch (that once dominated accept's work;
        # docs/performance.md#dedup-per-partition-in-the-tasks).
        seen = pc.drop_null(pc.index_in(remembered, value_set=encoded.dictionary))
        if len(seen):
            accepted_before = np.zeros(len(encoded.dictionary), dtype=bool)
            accepted_before[seen.to_numpy()] = True
            keep &= ~accepted_before[codes]
    return pa.array(keep)


def published_copies(batch: pa.Table, stored: pa.Table) -> pa.BooleanArray:
    """Which rows of ``batch`` a batch already published accepted (``stored``: the positions, ``partition`` and
    ``offset``, of the events it published; its files are the truth on a replay)."""
    stored = stored.select(list(POSITION))
    stored = stored.append_column("_accepted", pa.array(np.ones(stored.num_rows, dtype=bool)))
    marked = (batch.select(list(POSITION)).append_column("_row", pa.array(np.arange(batch.num_rows)))
              .join(stored, list(POSITION), join_type="left outer"))
    keep = np.zeros(batch.num_rows, dtype=bool)
    keep[marked["_row"].to_numpy()] = marked["_accepted"].fill_null(False).to_numpy(zero_copy_only=False)
    return pa.array(keep)
