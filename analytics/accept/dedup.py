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

A key is one string, ``<length of app>:<app>:<id>`` (the length makes it unambiguous whatever the app or id holds).
The memory also holds the horizon keys' 64-bit hashes, sorted, each with its place (``HorizonHashes``), so a
batch's keys are looked up there (a binary search each) instead of every horizon key being probed: at a real-time
pace a batch holds a second of events and the horizon minutes of them, and probing the whole horizon in every batch
cost more than the rest of the dedup. A hash says only where to look: a batch key whose hash is held is compared with
the key at that place, so a hash collision never drops an event.
"""

from __future__ import annotations

from collections.abc import Callable

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
        self._hashes = HorizonHashes()

    def remember(self, batch_id: int, accepted: pa.Table) -> None:
        """Keep the keys of the events ``batch_id`` accepted from the partition (a table with ``app`` and ``id``)."""
        self._keep(batch_id, keys(accepted.select(list(KEY_COLUMNS))))

    def of(self, batches: list[BatchMeta]) -> pa.ChunkedArray:
        """The keys accepted from the partition by ``batches``; keys of batches not among them are forgotten."""
        wanted = self._hold(batches)
        return pa.chunked_array([self._ids[b] for b in sorted(wanted)], type=pa.string())

    def first_copies(self, batch: pa.Table, batches: list[BatchMeta]) -> pa.BooleanArray:
        """:func:`first_copies` of ``batch`` against the keys ``batches`` accepted (the horizon): each of the batch's
        keys looked up by its hash, and compared with the keys held where its hash is."""
        self._hold(batches)

        def accepted_before(distinct: pa.Array) -> np.ndarray:
            asked, batch_ids, rows = self._hashes.where(hashes(distinct))
            found = np.zeros(len(distinct), dtype=bool)
            for batch_id in np.unique(batch_ids).tolist():
                held = self._ids.get(batch_id)
                if held is None:     # a batch dropped, its hashes not yet: a stale place
                    continue
                at = (batch_ids == batch_id) & (rows < len(held))   # a row past the keys: a stale place too
                ask, row = asked[at], rows[at]
                same = pc.equal(distinct.take(pa.array(ask)), held.take(pa.array(row)))
                found[ask[same.to_numpy(zero_copy_only=False)]] = True
            return found

        return first_copies_by(batch, accepted_before)

    def nbytes(self, batches: list[BatchMeta]) -> int:
        """Memory held by the keys of ``batches`` (and the hashes of all it holds)."""
        return sum(self._ids[m.batch_id].nbytes for m in batches if m.batch_id in self._ids) + self._hashes.nbytes

    def _hold(self, batches: list[BatchMeta]) -> set[int]:
        """Hold the keys of ``batches`` (read back from their files if not in memory), and only those; their ids."""
        wanted = {m.batch_id for m in batches}
        for batch_id in set(self._ids) - wanted:
            del self._ids[batch_id]
            self._hashes.drop(batch_id)
        for batch_id in wanted - set(self._ids):
            self._keep(batch_id, keys(accepted_log.partition_events(self._config, batch_id, self._partition,
                                                                    KEY_COLUMNS)))
        return wanted

    def _keep(self, batch_id: int, accepted_keys: pa.Array) -> None:
        self._ids[batch_id] = accepted_keys
        self._hashes.add(batch_id, hashes(accepted_keys))


def hashes(some_keys: pa.Array) -> np.ndarray:
    """A 64-bit hash of each key: Python's string hash, which differs between processes (``HorizonHashes`` lives in
    one)."""
    return np.fromiter(map(hash, some_keys.to_pylist()), dtype=np.int64, count=len(some_keys))


class HorizonHashes:
    """The hashes of the keys each batch accepted, sorted, each with its place (batch and row), so that where a key
    may be is a binary search. New hashes go to a smaller sorted array, merged into the main one once it holds an
    eighth as many: an insert into the whole horizon's array copies all of it. A batch dropped leaves its hashes in
    place (stale places, which the caller skips) until they are half of what is held, which is then rebuilt without
    them."""

    RECENT_SHARE = 8

    def __init__(self) -> None:
        empty = np.empty(0, np.int64)
        self._sorted, self._recent = (empty, empty), (empty, empty)   # (hashes, places), by hash
        self._held: dict[int, int] = {}   # batch id -> its hashes held
        self._stale = 0

    def add(self, batch_id: int, batch_hashes: np.ndarray) -> None:
        """Hold ``batch_hashes``, the hashes of the keys ``batch_id`` accepted, row by row."""
        self.drop(batch_id)
        self._held[batch_id] = len(batch_hashes)
        order = np.argsort(batch_hashes, kind="stable")
        self._recent = _merged(self._recent, (batch_hashes[order], (batch_id << _ROW_BITS) | order))
        if self.RECENT_SHARE * len(self._recent[0]) > len(self._sorted[0]):
            self._sorted, self._recent = _merged(self._sorted, self._recent), (self._recent[0][:0],) * 2

    def drop(self, batch_id: int) -> None:
        """Forget ``batch_id``'s hashes."""
        gone = self._held.pop(batch_id, None)
        if gone is None:
            return
        self._stale += gone
        if 2 * self._stale > len(self._sorted[0]) + len(self._recent[0]):
            hashes_, places = _merged(self._sorted, self._recent)
            live = np.isin(places >> _ROW_BITS, np.fromiter(self._held, np.int64, len(self._held)))
            self._sorted, self._recent = (hashes_[live], places[live]), (hashes_[:0],) * 2
            self._stale = 0

    def where(self, asked: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each place a hash of ``asked`` is held at: (index into ``asked``, batch id, row), stale places included."""
        found = [_places(part, asked) for part in (self._sorted, self._recent)]
        index, places = (np.concatenate(parts) for parts in zip(*found, strict=True))
        return index, places >> _ROW_BITS, places & ((1 << _ROW_BITS) - 1)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self._sorted, *self._recent))


_ROW_BITS = 32
"""A place is ``batch id << 32 | row``: a batch's rows in one partition stay below 2^32."""


def _merged(held: tuple[np.ndarray, np.ndarray], more: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``held`` (hashes sorted, their places) with ``more`` (the same) added, still sorted by hash."""
    at = np.searchsorted(held[0], more[0])
    return np.insert(held[0], at, more[0]), np.insert(held[1], at, more[1])


def _places(held: tuple[np.ndarray, np.ndarray], asked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index into ``asked``, place) for every held entry whose hash is one of ``asked``."""
    first, end = np.searchsorted(held[0], asked, "left"), np.searchsorted(held[0], asked, "right")
    count = end - first
    index = np.repeat(np.arange(len(asked)), count)
    offsets = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return index, held[1][np.repeat(first, count) + offsets]


def first_copies(batch: pa.Table, remembered: pa.ChunkedArray) -> pa.BooleanArray:
    """Which rows of ``batch`` (``COPY_COLUMNS``) are the first copy of their key (app, id): the earliest of the
    batch's copies (broker time, then position), and only if no batch within the horizon accepted the key before
    (``remembered``: keys as :func:`keys` makes them)."""
    return first_copies_by(batch, lambda distinct: accepted_among(remembered, distinct))


def accepted_among(remembered: pa.ChunkedArray, distinct: pa.Array) -> np.ndarray:
    """Which of the ``distinct`` keys are among ``remembered``."""
    accepted_before = np.zeros(len(distinct), dtype=bool)
    if len(remembered) and len(distinct):
        # The horizon's keys (rate x horizon / partitions, millions at a high rate) are probed against the few
        # keys asked, not hashed into a set of their own (docs/performance.md#dedup-per-partition-in-the-tasks).
        seen = pc.drop_null(pc.index_in(remembered, value_set=distinct))
        accepted_before[seen.to_numpy()] = True
    return accepted_before


def first_copies_by(batch: pa.Table, accepted_before: Callable[[pa.Array], np.ndarray]) -> pa.BooleanArray:
    """:func:`first_copies`, the horizon asked through ``accepted_before(distinct keys)``: which of the batch's
    distinct keys a batch within the horizon accepted."""
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
    keep &= ~accepted_before(encoded.dictionary)[codes]
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
