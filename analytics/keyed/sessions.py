"""Session windows (BRIEF §2): per (app, user), or (app, device) for events without a user, a maximal run of
events each less than G after the previous; the session is ``[first, last + G)``, emitted once the watermark
reaches ``last + G``.

Pure logic over one session key's state; ``analytics.keyed.query`` runs it inside Spark's
``transformWithStateInPandas`` with an event-time timer at the earliest open session's end. Spark's own
``session_window`` is not used because its rules differ from the brief at the edges: it merges events exactly G
apart, and it accepts an event whose session was already emitted as the start of a second, overlapping session.

Rules for a micro-batch with watermark W (BRIEF §3: a contribution to a window that is already closed is dropped):
- the batch's events, the open sessions and the recently closed sessions are merged into runs (a gap < G joins);
- a run that touches a closed session (emitted, or reached by W) cannot change it: its new events are dropped
  stragglers attributed to that session;
- a run that is already closed by W (``last + G <= W``) is dropped as a whole, attributed to the session it would
  have formed;
- any other run becomes (or extends) an open session.
Closed sessions are remembered for ``stream.session_memory_s`` after they end; after that an event that would
have joined one is still dropped (its own session is closed too, by far) but is attributed to the session the
late events form by themselves.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analytics.keyed.events import Events
from analytics.vocabulary import LEVEL_COLUMNS, LEVEL_FIELDS

COUNT_COLUMNS = ("event_count", "metric_count", "log_count", *LEVEL_FIELDS)


def _empty_counts() -> np.ndarray:
    return np.zeros((0, len(COUNT_COLUMNS)), dtype=np.int64)


@dataclass
class SessionState:
    open_first: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    open_last: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    open_counts: np.ndarray = field(default_factory=_empty_counts)
    closed_first: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    closed_last: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    def next_due(self, gap_ms: int, memory_ms: int) -> int | None:
        """When the state next needs the watermark: the earliest open session end, else the earliest time a
        closed session can be forgotten."""
        if len(self.open_last):
            return int(self.open_last.min()) + gap_ms
        if len(self.closed_last):
            return int(self.closed_last.min()) + gap_ms + memory_ms
        return None

    @property
    def empty(self) -> bool:
        return not len(self.open_last) and not len(self.closed_last)


@dataclass(frozen=True)
class Dropped:
    """Dropped stragglers and the session each would have belonged to."""

    events: Events
    window_start: np.ndarray
    window_end: np.ndarray


def _event_counts(events: Events) -> np.ndarray:
    counts = np.zeros((len(events), len(COUNT_COLUMNS)), dtype=np.int64)
    counts[:, 0] = 1
    counts[:, 1] = ~events.is_log
    counts[:, 2] = events.is_log
    for code in range(len(LEVEL_COLUMNS)):
        counts[:, 3 + code] = events.level == code
    return counts


def run_counts(events: np.ndarray, level_counts: np.ndarray) -> np.ndarray:
    """COUNT_COLUMNS of runs from each run's event count and its logs per level (one column per LEVEL_COLUMNS):
    every accepted log has one of the levels, so the rest are metrics."""
    events = np.asarray(events, np.int64)
    levels = np.asarray(level_counts, np.int64).reshape(len(events), len(LEVEL_COLUMNS))
    logs = levels.sum(axis=1)
    return np.column_stack([events, events - logs, logs, levels])


def add_events(state: SessionState, events: Events, watermark: int, gap_ms: int) -> Dropped:
    """Take a batch's events of one key; returns the dropped stragglers."""
    return add_bucket_events({"": state}, np.full(len(events), "", dtype=object), events, watermark, gap_ms)[1]


def add_bucket_events(bucket: SessionBucket, session_keys: np.ndarray, events: Events, watermark: int,
                      gap_ms: int) -> tuple[np.ndarray, Dropped]:
    """Take a batch's events of many session keys (event i belongs to ``session_keys[i]``) into ``bucket``, whose
    states are updated in place (a key seen first gets one); returns each dropped straggler's session key and the
    stragglers. Each event is a run of its own (:func:`add_bucket_runs`)."""
    dropped_keys, dropped_at, start, end = add_bucket_runs(
        bucket, session_keys, events.t, events.t, _event_counts(events), watermark, gap_ms)
    return dropped_keys, Dropped(events.take(dropped_at), start, end)


def add_bucket_runs(bucket: SessionBucket, session_keys: np.ndarray, first: np.ndarray, last: np.ndarray,
                    counts: np.ndarray, watermark: int, gap_ms: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Take a batch's runs of many session keys into ``bucket`` (states updated in place; a key seen first gets
    one). Run i of ``session_keys[i]`` spans ``[first[i], last[i]]`` and holds ``counts[i]`` (COUNT_COLUMNS): a
    single event, or events of one key already joined by gaps under G (``analytics.keyed.runs``), which the
    rule joins all the same. Returns, for each dropped run, its session key, its position in the input and the
    session it is attributed to (start, end).

    All keys in one pass of array operations: a bucket sees tens of keys per batch, and a pass per key cost more than
    the rest of the stateful query (docs/performance.md#the-python-stateful-operator). Per key the rule is the module's:
    the key's closed sessions, open sessions and new runs, sorted as (first, last, source, index) intervals, merge into
    runs wherever an interval starts less than G after the run's latest end. A run is dropped or merged whole, as each
    of its events would be: its events are less than G apart, so they always end up in one run."""
    empty = np.empty(0, np.int64)
    if not len(first):
        return np.empty(0, dtype=object), empty, empty, empty
    codes, names = pd.factorize(pd.Series(session_keys, dtype=object), sort=False)
    states = [bucket[name] if name in bucket else bucket.setdefault(name, SessionState()) for name in names]
    n_keys = len(states)

    width = len(COUNT_COLUMNS)
    open_sizes = np.array([len(s.open_first) for s in states], dtype=np.int64)
    closed_sizes = np.array([len(s.closed_first) for s in states], dtype=np.int64)
    o_key = np.repeat(np.arange(n_keys), open_sizes)
    o_first = _stacked([s.open_first for s in states], np.int64)
    o_last = _stacked([s.open_last for s in states], np.int64)
    o_counts = _stacked([s.open_counts for s in states], np.int64, width).reshape(-1, width)
    c_key = np.repeat(np.arange(n_keys), closed_sizes)
    n_c, n_o, n_e = len(c_key), len(o_key), len(first)

    # Intervals; source 0 = closed session, 1 = open session, 2 = new run. An open session the watermark has
    # reached is closed already, even if its timer fires only after this input.
    due = o_last + gap_ms <= watermark
    key = np.concatenate([c_key, o_key, codes]).astype(np.int64)
    run_input_first, run_input_last = np.asarray(first, np.int64), np.asarray(last, np.int64)
    first = np.concatenate([_stacked([s.closed_first for s in states], np.int64), o_first, run_input_first])
    last = np.concatenate([_stacked([s.closed_last for s in states], np.int64), o_last, run_input_last])
    source = np.concatenate([np.zeros(n_c, np.int8), np.where(due, 0, 1).astype(np.int8), np.full(n_e, 2, np.int8)])
    # Within a key, global positions order opens and runs as their per-key positions would.
    index = np.concatenate([np.full(n_c, -1, np.int64), np.arange(n_o), np.arange(n_e)])
    order = np.lexsort((index, source, last, first, key))
    key, first, last, source, index = key[order], first[order], last[order], source[order], index[order]
    starts = run_starts(key, first, last, gap_ms)
    run_start = np.flatnonzero(starts)
    run = np.cumsum(starts) - 1
    is_closed, is_open, is_fresh = source == 0, source == 1, source == 2
    has_fresh = np.add.reduceat(is_fresh.astype(np.int64), run_start) > 0
    has_closed = np.add.reduceat(is_closed.astype(np.int64), run_start) > 0
    run_first = first[run_start]
    run_last = np.maximum.reduceat(last, run_start)
    dropped_run = has_fresh & (has_closed | (run_last + gap_ms <= watermark))
    merged_run = has_fresh & ~dropped_run

    # Dropped runs, each attributed to the first closed session of its run, else to the run itself.
    closed_at = np.flatnonzero(is_closed)
    attributed_runs, first_of_run = np.unique(run[closed_at], return_index=True)
    attributed_start, attributed_end = run_first.copy(), run_last + gap_ms
    attributed_start[attributed_runs] = first[closed_at[first_of_run]]
    attributed_end[attributed_runs] = last[closed_at[first_of_run]] + gap_ms
    fresh_at = np.flatnonzero(is_fresh)
    dropped_at = fresh_at[dropped_run[run[fresh_at]]]
    dropped_inputs = index[dropped_at]

    # Merged runs become open sessions (replacing the open sessions they absorbed), counting both.
    contribution = np.zeros((len(key), width), dtype=np.int64)
    contribution[fresh_at] = np.asarray(counts, np.int64).reshape(-1, width)[index[fresh_at]]
    absorbed_at = np.flatnonzero(is_open & merged_run[run])
    contribution[absorbed_at] = o_counts[index[absorbed_at]]
    run_counts = np.add.reduceat(contribution, run_start, axis=0)
    keep_open = np.ones(n_o, dtype=bool)
    keep_open[index[absorbed_at]] = False
    new_runs = np.flatnonzero(merged_run)
    if len(new_runs):
        # Per key: its kept open sessions in their order, then its new ones in run order (a stable sort by key).
        all_key = np.concatenate([o_key[keep_open], key[run_start[new_runs]]])
        regrouped = np.argsort(all_key, kind="stable")
        all_first = np.concatenate([o_first[keep_open], run_first[new_runs]])[regrouped]
        all_last = np.concatenate([o_last[keep_open], run_last[new_runs]])[regrouped]
        all_counts = np.concatenate([o_counts[keep_open], run_counts[new_runs]])[regrouped]
        edges = np.searchsorted(all_key[regrouped], np.arange(n_keys + 1))
        for code in np.unique(key[run_start[new_runs]]).tolist():   # only keys whose open sessions changed
            state, part = states[code], slice(edges[code], edges[code + 1])
            state.open_first, state.open_last = all_first[part], all_last[part]
            state.open_counts = all_counts[part]
    return (np.asarray(names, dtype=object)[codes[dropped_inputs]], dropped_inputs,
            attributed_start[run[dropped_at]], attributed_end[run[dropped_at]])


def _stacked(arrays: list[np.ndarray], dtype: type, width: int = 0) -> np.ndarray:
    """The arrays one after the other as ``dtype`` (rows of ``width`` columns when given); empty when there are none."""
    if not arrays:
        return np.empty((0, width) if width else 0, dtype=dtype)
    return np.concatenate(arrays).astype(dtype, copy=False)


def run_starts(key: np.ndarray, first: np.ndarray, last: np.ndarray, gap_ms: int) -> np.ndarray:
    """Where the runs of intervals ``[first, last]`` start, the intervals sorted by ``key`` (integer codes) and
    ``first``: at a new key, or where an interval starts G or more after every earlier end of its key (sorted by
    start, the latest end so far of the key is the latest end of the current run). The rule's join: under G apart."""
    starts = np.ones(len(key), dtype=bool)
    if len(key) > 1:
        starts[1:] = (key[1:] != key[:-1]) | (first[1:] - _latest_end_per_key(key, last)[:-1] >= gap_ms)
    return starts


def _latest_end_per_key(key: np.ndarray, last: np.ndarray) -> np.ndarray:
    """The running maximum of ``last`` within each run of equal ``key`` (``key`` sorted)."""
    low, span = int(last.min()), int(last.max()) - int(last.min()) + 1
    if int(key[-1]) * span < 2**62:
        # one cumulative max over (key, end) folded into one int64: a later key always ranks above
        folded = key * span + (last - low)
        return np.maximum.accumulate(folded) - key * span + low
    latest = last.copy()   # times too far apart to fold: one pass per key
    bounds = [0, *(np.flatnonzero(np.diff(key)) + 1).tolist(), len(key)]
    for a, b in itertools.pairwise(bounds):
        latest[a:b] = np.maximum.accumulate(last[a:b])
    return latest


@dataclass(frozen=True)
class OpenSessions:
    """What a batch changed of the open sessions of the keys it touched: every open session of a changed key as it
    now stands (``keys``, ``first``, ``last``, ``counts``), and the starts of the ones no longer open under that start
    (``gone_keys``, ``gone_first``: merged into a run that starts earlier). Written as provisional rows keyed by
    (session key, start), so a newer version of the same row replaces an older one (BRIEF §3's correction rule); the
    final row of a session, once the watermark passes its end, retires its provisional one."""

    keys: np.ndarray
    first: np.ndarray
    last: np.ndarray
    counts: np.ndarray
    gone_keys: np.ndarray
    gone_first: np.ndarray


def open_before(bucket: SessionBucket, session_keys: np.ndarray) -> dict[str, np.ndarray | None]:
    """Each of a batch's session keys with its open sessions' starts before the batch is taken in (None: a key the
    bucket did not hold), for :func:`open_changes`. Only keys in the batch can change, and
    :func:`add_bucket_runs` gives a key whose open sessions change new arrays, so the arrays' identity tells."""
    return {name: bucket[name].open_first if name in bucket else None
            for name in pd.unique(pd.Series(session_keys, dtype=object))}


def open_changes(bucket: SessionBucket, before: dict[str, np.ndarray | None], watermark: int,
                 gap_ms: int) -> OpenSessions:
    """The open sessions the batch changed (see :class:`OpenSessions`), after :func:`add_bucket_runs`. A session the
    watermark has reached (``last + G <= W``) is left out: it is closed, and its timer emits it in this batch."""
    changed = [(name, old) for name, old in before.items()
               if name in bucket and bucket[name].open_first is not old]
    states = [bucket[name] for name, _ in changed]
    names = np.array([name for name, _ in changed], dtype=object)
    width = len(COUNT_COLUMNS)
    # Every changed key's sessions in one set of arrays (``owner``: the key's index in ``changed``): a key holds a
    # session or two, and numpy's cost per call on arrays that small outweighed the work.
    owner = np.repeat(np.arange(len(states)), [len(state.open_first) for state in states])
    first = _stacked([state.open_first for state in states], np.int64)
    last = _stacked([state.open_last for state in states], np.int64)
    counts = _stacked([state.open_counts for state in states], np.int64, width).reshape(-1, width)
    still_open = last + gap_ms > watermark
    # A start the key held before the batch and holds no more: (key, start) pairs compared as Python values.
    held_old = [(i, old) for i, (_, old) in enumerate(changed) if old is not None and len(old)]
    old_owner = np.repeat([i for i, _ in held_old], [len(old) for _, old in held_old]).astype(np.int64)
    old_first = _stacked([old for _, old in held_old], np.int64)
    held_now = set(zip(owner.tolist(), first.tolist(), strict=True))
    gone = np.fromiter((pair not in held_now for pair in zip(old_owner.tolist(), old_first.tolist(), strict=True)),
                       dtype=bool, count=len(old_first))
    return OpenSessions(
        keys=names[owner[still_open]], first=first[still_open], last=last[still_open], counts=counts[still_open],
        gone_keys=names[old_owner[gone]], gone_first=old_first[gone])


def emit_due(state: SessionState, watermark: int, gap_ms: int, memory_ms: int) -> dict[str, np.ndarray]:
    """Emit the open sessions the watermark has closed (``last + G <= W``); forget closed sessions that ended
    more than ``memory_ms`` before the watermark. Returns columns ``session_start``, ``last_event_time`` and the
    COUNT_COLUMNS, one entry per emitted session."""
    due = state.open_last + gap_ms <= watermark
    out = {"session_start": state.open_first[due], "last_event_time": state.open_last[due]}
    counts = state.open_counts[due]
    out.update({name: counts[:, i] for i, name in enumerate(COUNT_COLUMNS)})
    closed_first = np.concatenate([state.closed_first, state.open_first[due]])
    closed_last = np.concatenate([state.closed_last, state.open_last[due]])
    remember = closed_last + gap_ms + memory_ms > watermark
    state.closed_first, state.closed_last = closed_first[remember], closed_last[remember]
    state.open_first, state.open_last = state.open_first[~due], state.open_last[~due]
    state.open_counts = state.open_counts[~due]
    return out


# A bucket of session keys shares one state row and one timer: most keys see a few events per batch, and a state
# row or timer per key would cost Spark round trips per key that dwarf the work.
SessionBucket = MutableMapping[str, SessionState]
_KEY_SEPARATOR = "\x1f"
Packed = tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes, str]


class StoredBucket(MutableMapping[str, SessionState]):
    """A bucket as its state row stored it, each key's :class:`SessionState` built only when asked for.

    A batch touches a few of a bucket's keys, but the bucket holds every key seen within ``stream.session_memory_s``
    (a day by default): building a state per key at every load and joining them all again at every save made a
    batch's cost grow with the bucket, not with the batch. Keys never asked for stay in the stored arrays, and
    :func:`pack`, :func:`bucket_empty` and :func:`bucket_next_due` read them there, in array operations."""

    def __init__(self, packed: Packed) -> None:
        o_key, o_first, o_last, o_counts, c_key, c_first, c_last, keys = packed
        self.names = keys.split(_KEY_SEPARATOR) if keys else []
        self._index = {name: i for i, name in enumerate(self.names)}
        self.o_key, self.c_key = np.frombuffer(o_key, np.int32), np.frombuffer(c_key, np.int32)
        self.o_first, self.o_last = np.frombuffer(o_first, np.int64), np.frombuffer(o_last, np.int64)
        self.o_counts = np.frombuffer(o_counts, np.int64).reshape(-1, len(COUNT_COLUMNS))
        self.c_first, self.c_last = np.frombuffer(c_first, np.int64), np.frombuffer(c_last, np.int64)
        # pack() writes each key's sessions contiguously, in key order.
        self.o_bounds = np.searchsorted(self.o_key, np.arange(len(self.names) + 1))
        self.c_bounds = np.searchsorted(self.c_key, np.arange(len(self.names) + 1))
        self.built: dict[str, SessionState] = {}   # keys asked for or set (stored or new), in that order
        self.removed: set[str] = set()

    def __getitem__(self, name: str) -> SessionState:
        if name in self.built:
            return self.built[name]
        i = self._index.get(name)
        if i is None or name in self.removed:
            raise KeyError(name)
        o, c = slice(self.o_bounds[i], self.o_bounds[i + 1]), slice(self.c_bounds[i], self.c_bounds[i + 1])
        state = self.built[name] = SessionState(self.o_first[o].copy(), self.o_last[o].copy(),
                                                self.o_counts[o].copy(), self.c_first[c].copy(),
                                                self.c_last[c].copy())
        return state

    def __setitem__(self, name: str, state: SessionState) -> None:
        self.removed.discard(name)
        self.built[name] = state

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self.built.pop(name, None)
        self.removed.add(name)

    def __contains__(self, name: object) -> bool:
        return name in self.built or (name in self._index and name not in self.removed)

    def __iter__(self) -> Iterator[str]:
        # stored keys in their stored order, then new ones: the order of a dict built key by key from the row
        yield from (n for n in self.names if n not in self.removed)
        yield from (n for n in self.built if n not in self._index)

    def __len__(self) -> int:
        return len(self.names) - len(self.removed) + sum(1 for n in self.built if n not in self._index)

    def untouched(self) -> np.ndarray:
        """Per stored key: True when it was neither asked for, set nor removed (its stored sessions stand)."""
        untouched = np.ones(len(self.names), dtype=bool)
        for name in (*self.built, *self.removed):
            i = self._index.get(name)
            if i is not None:
                untouched[i] = False
        return untouched


def pack(bucket: SessionBucket) -> Packed:
    """Serialize a bucket: per-session arrays tagged with their key's index, and the keys (a key without sessions
    is left out). The keys of a :class:`StoredBucket` that were never asked for are copied as stored."""
    if isinstance(bucket, StoredBucket):
        return _pack_stored(bucket)
    keys = [k for k, s in bucket.items() if not s.empty]
    states = [bucket[k] for k in keys]

    def cat(arrays: list[np.ndarray], dtype: type) -> bytes:
        return _stacked(arrays, dtype).tobytes()

    open_key = [np.full(len(s.open_first), i, np.int32) for i, s in enumerate(states)]
    closed_key = [np.full(len(s.closed_first), i, np.int32) for i, s in enumerate(states)]
    return (cat(open_key, np.int32), cat([s.open_first for s in states], np.int64),
            cat([s.open_last for s in states], np.int64), cat([s.open_counts for s in states], np.int64),
            cat(closed_key, np.int32), cat([s.closed_first for s in states], np.int64),
            cat([s.closed_last for s in states], np.int64), _KEY_SEPARATOR.join(keys))


def _pack_stored(bucket: StoredBucket) -> Packed:
    """:func:`pack` of a :class:`StoredBucket`: the same bytes as packing it key by key."""
    untouched = bucket.untouched()
    keys = [n for n in bucket if n not in bucket.built or not bucket.built[n].empty]
    new_index = {name: i for i, name in enumerate(keys)}
    stored_to_new = np.array([new_index[n] if untouched[i] else -1 for i, n in enumerate(bucket.names)],
                             dtype=np.int64)
    built = [(new_index[n], s) for n, s in bucket.built.items() if n in new_index]
    width = len(COUNT_COLUMNS)

    def rows(key: np.ndarray, stored: list[np.ndarray], picks: list[Callable[[SessionState], np.ndarray]]
             ) -> list[np.ndarray]:
        """The key index and each column of one kind of session (open or closed): the untouched keys' stored rows
        and the built states' rows, grouped by key in key order (a key's rows in their own order)."""
        kept = untouched[key]
        index = np.concatenate([stored_to_new[key[kept]],
                                *(np.full(len(picks[0](s)), i, np.int64) for i, s in built)])
        order = np.argsort(index, kind="stable")
        columns = [np.concatenate([column[kept], *(pick(s) for _, s in built)])[order]
                   for column, pick in zip(stored, picks, strict=True)]
        return [index[order], *columns]

    o_key, o_first, o_last, o_counts = rows(
        bucket.o_key, [bucket.o_first, bucket.o_last, bucket.o_counts],
        [lambda s: s.open_first, lambda s: s.open_last, lambda s: s.open_counts.reshape(-1, width)])
    c_key, c_first, c_last = rows(bucket.c_key, [bucket.c_first, bucket.c_last],
                                  [lambda s: s.closed_first, lambda s: s.closed_last])
    return (o_key.astype(np.int32).tobytes(), o_first.astype(np.int64).tobytes(), o_last.astype(np.int64).tobytes(),
            o_counts.astype(np.int64).tobytes(), c_key.astype(np.int32).tobytes(), c_first.astype(np.int64).tobytes(),
            c_last.astype(np.int64).tobytes(), _KEY_SEPARATOR.join(keys))


def unpack(packed: Packed | None) -> SessionBucket:
    """A bucket from its state row (None: a new, empty bucket)."""
    return {} if packed is None else StoredBucket(packed)


def bucket_empty(bucket: SessionBucket) -> bool:
    """Whether no key of the bucket has a session left."""
    if isinstance(bucket, StoredBucket) and bucket.untouched().any():
        return False   # a stored key always has a session (pack leaves out the keys without)
    states = bucket.built.values() if isinstance(bucket, StoredBucket) else bucket.values()
    return all(state.empty for state in states)


def bucket_next_due(bucket: SessionBucket, gap_ms: int, memory_ms: int) -> int | None:
    """The earliest :meth:`SessionState.next_due` of the bucket's keys (None: no session)."""
    dues = []
    if isinstance(bucket, StoredBucket):
        untouched = bucket.untouched()
        o_count, c_count = np.diff(bucket.o_bounds), np.diff(bucket.c_bounds)
        # A key's open sessions decide its due time; its closed ones only when it has no open session.
        for last, bounds, count, picked, wait in (
                (bucket.o_last, bucket.o_bounds, o_count, untouched & (o_count > 0), gap_ms),
                (bucket.c_last, bucket.c_bounds, c_count, untouched & (o_count == 0) & (c_count > 0),
                 gap_ms + memory_ms)):
            if picked.any():
                nonempty = count > 0   # the keys' rows are contiguous: a minimum per non-empty key's slice
                minima = np.minimum.reduceat(last, bounds[:-1][nonempty])
                dues.append(int(minima[picked[nonempty]].min()) + wait)
        states = list(bucket.built.values())
    else:
        states = list(bucket.values())
    dues += [d for s in states if (d := s.next_due(gap_ms, memory_ms)) is not None]
    return min(dues) if dues else None
