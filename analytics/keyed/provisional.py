"""Provisional open sessions: the sessions in progress of the session keys each ``accept`` batch touched, as they
stand after that batch, before the ``keyed_windows`` query has taken it.

``keyed_windows`` takes a reader batch every ``stream.trigger_interval_s`` (``analytics.reader_batches``), so the
sessions in progress it writes (``open_sessions``) move at that pace plus its batch's run time. ``accept`` runs more
often and already joins each batch's events of a session key into runs (``analytics.keyed.runs``). After publishing
a batch, its driver takes the runs of every key the batch touched into that key's open sessions as last written (by
this driver, or by the query: read from ``open_sessions_now``) and writes the key's open sessions again, marked
``provisional``, with ``version`` ``2k`` for accept batch ``k``; the query writes ``2c + 1``, ``c`` being the newest
accept batch of its micro-batch (``analytics.rounds.reader_version``).

A provisional row stands until the query has taken batch ``k`` (``sql/0020_provisional_open_sessions.sql``: readers
take ``open_sessions_now``): from then on the query's own rows say what is open for that key (it writes every open
session of a key it touched), so a provisional session it would not confirm never lingers.

Nothing here decides what is final or what is a straggler. A key is left to the query alone (no provisional rows
until the query has taken this batch) when the watermark could make the query judge it otherwise: when one of its
runs starts at or behind the highest watermark the query can apply while it takes these batches
(``analytics.rounds.watermark_bound_ms``; only such a run can touch a closed session or be closed itself), or one of
its open sessions ends there (the query closes it). For every other key the query's rule joins the same runs
into the same sessions: runs less than G apart join (``analytics.keyed.sessions``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from clickhouse_connect.driver.exceptions import ClickHouseError

from analytics import accepted_log
from analytics.keyed import runs as session_runs
from analytics.keyed.sessions import COUNT_COLUMNS, run_counts, run_starts
from analytics.progress import record_round
from analytics.rounds import AcceptRounds, Pending, covered, provisional_version
from analytics.sinks import Newest, timed
from analytics.vocabulary import ACCEPT_QUERY, KEYED_WINDOWS_QUERY, epoch_ms
from eventide.config import Config
from store.client import StoreUnavailable, connect
from store.pipeline import PROVISIONAL_SESSIONS

log = logging.getLogger(__name__)

SessionKey = tuple[str, str, str]
"""(app, key kind, session key): ``open_sessions``' key but for the gap and the start."""

OUTCOMES_KEPT = 10_000
outcomes: Newest[int, tuple[int, int]] = Newest(OUTCOMES_KEPT)
"""The newest accept batches' outcome in this driver: batch id → (session keys its events touched that were left to
the ``keyed_windows`` query, when its rows were written, epoch ms). Read by the benchmark: the events of a batch with
none left moved their sessions then."""

_WIDTH = len(COUNT_COLUMNS)
_RUN_COLUMNS = (*session_runs.EVENT_COLUMNS, session_runs.GAP, session_runs.EVENTS, session_runs.LAST,
                *session_runs.LEVEL_COUNTS)


KEY_CODES_MAX = 500_000
"""Session keys a driver numbers before it starts over (:class:`KeyCodes`): what the numbering holds in memory."""


class KeyCodes:
    """Session keys numbered 0, 1, 2… in the order first seen, so that a round's lookups over thousands of keys are
    array operations on integers (a tuple of strings hashes in Python, at a cost per key that outweighed the round's
    merge). Kept by one thread; started over past :data:`KEY_CODES_MAX` keys."""

    def __init__(self) -> None:
        self._code_of: dict[SessionKey, int] = {}
        self._keys: list[SessionKey] = []

    def __len__(self) -> int:
        return len(self._keys)

    def codes(self, keys: Iterable[SessionKey]) -> np.ndarray:
        """Each key's code, a new one for a key not seen before."""
        code_of, known = self._code_of, self._keys
        out = []
        for key in keys:
            code = code_of.get(key)
            if code is None:
                code = code_of[key] = len(known)
                known.append(key)
            out.append(code)
        return np.array(out, np.int64)

    def known(self, keys: Iterable[SessionKey]) -> np.ndarray:
        """The codes of those of ``keys`` numbered already."""
        return np.array([c for c in map(self._code_of.get, keys) if c is not None], np.int64)

    def keys(self, codes: np.ndarray) -> list[SessionKey]:
        """The keys of ``codes``."""
        known = self._keys
        return [known[c] for c in codes.tolist()]


@dataclass(frozen=True)
class Runs:
    """Session runs, one per entry: its key's code (:class:`KeyCodes`), first and last corrected event time (ms) and
    its COUNT_COLUMNS."""

    keys: np.ndarray
    first: np.ndarray
    last: np.ndarray
    counts: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class BatchRuns:
    """One accept batch's session runs; ``newest_event_ms`` its latest corrected event time (None: no events)."""

    runs: Runs | None
    """None when its files hold no runs of the job's gap (published before runs, or with another gap)."""
    newest_event_ms: int | None


@dataclass(frozen=True)
class Standing:
    """The open sessions of some session keys (codes), flat, as they stand after accept batch ``covered[i]`` for key
    ``keys[i]`` (each key once; a key may have none). Session ``j`` belongs to ``key[j]``, spans ``first[j]`` to
    ``last[j]`` and holds ``counts[j]`` (COUNT_COLUMNS); grouped by key, by start within a key. Flat, because a
    round takes thousands of keys and a Python object per key cost more than the round's merge."""

    keys: np.ndarray
    covered: np.ndarray
    key: np.ndarray
    first: np.ndarray
    last: np.ndarray
    counts: np.ndarray

    @classmethod
    def empty(cls) -> Standing:
        return cls(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), *_empty())

    def __len__(self) -> int:
        return len(self.keys)

    def of_keys(self, keys: np.ndarray, among: bool = True) -> Standing:
        """The part of ``keys`` (``among``), or of every other key."""
        if not len(self.keys):
            return self
        keep_keys = np.isin(self.keys, keys) == among
        keep_rows = np.isin(self.key, keys) == among
        return Standing(self.keys[keep_keys], self.covered[keep_keys], self.key[keep_rows], self.first[keep_rows],
                        self.last[keep_rows], self.counts[keep_rows])

    def __or__(self, other: Standing) -> Standing:
        """Both, of keys neither holds twice; rows stay grouped by key."""
        if not len(other.keys):
            return self
        if not len(self.keys):
            return other
        return Standing(np.concatenate([self.keys, other.keys]), np.concatenate([self.covered, other.covered]),
                        np.concatenate([self.key, other.key]), np.concatenate([self.first, other.first]),
                        np.concatenate([self.last, other.last]), np.concatenate([self.counts, other.counts]))


@dataclass(frozen=True)
class Round:
    """What a round writes, keys by code: the open sessions of the keys it took (``keys``: touched, not left to the
    query before) that it did not leave to the query (``open``, covering ``covered``); the starts no longer open
    (``retired_key``, ``retired_first``); and the keys it left to the query (``left``)."""

    covered: int
    keys: np.ndarray
    open: Standing
    retired_key: np.ndarray
    retired_first: np.ndarray
    left: np.ndarray


def batch_runs(events: pa.Table, gap_ms: int, codes: KeyCodes) -> BatchRuns:
    """The session runs of an accept batch's events (its files' :data:`_RUN_COLUMNS`): one per run head, its key
    numbered by ``codes``."""
    newest = int(epoch_ms(events["corrected_event_time"]).max()) if events.num_rows else None
    if not events.num_rows:
        return BatchRuns(Runs(np.empty(0, np.int64), *_empty()), newest)
    gaps = pc.unique(events[session_runs.GAP]).to_pylist() if session_runs.GAP in events.column_names else [None]
    if gaps != [gap_ms]:
        return BatchRuns(None, newest)
    heads = events.filter(pc.greater(events[session_runs.EVENTS], 0))
    kind, name = session_runs.session_keys(heads)
    keys = codes.codes(zip(heads["app"].to_pylist(), kind.to_pylist(), name.to_pylist(), strict=True))
    levels = np.column_stack([np.asarray(heads[c], np.int64) for c in session_runs.LEVEL_COUNTS])
    return BatchRuns(Runs(keys, epoch_ms(heads["corrected_event_time"]),
                          np.asarray(heads[session_runs.LAST], np.int64),
                          run_counts(np.asarray(heads[session_runs.EVENTS], np.int64), levels)), newest)


def provisional_round(touched: np.ndarray, base: Standing, pending: Mapping[int, Runs], batch_id: int, bound_ms: int,
                      gap_ms: int) -> Round:
    """The open sessions of the ``touched`` keys (codes, sorted, distinct) after accept batch ``batch_id``: each
    key's ``base`` sessions (none for a key absent there), joined with its runs of the ``pending`` accept batches
    after the one its base covers, up to ``batch_id``, as the session rule joins them (runs less than G apart form
    one session). A key with such a run starting at or behind ``bound_ms``, or a base session ending there
    (``last + G <= bound_ms``), is ``left`` to the query (module docstring). In array operations over every key at
    once: a round touches thousands."""
    covers = np.full(len(touched), -1, np.int64)
    base_at = _positions(touched, base.keys)
    covers[base_at[base_at >= 0]] = base.covered[base_at >= 0]

    run_parts = []
    oldest = int(covers.min()) if len(covers) else batch_id
    for source, runs in sorted(pending.items()):
        if not oldest < source <= batch_id or not len(runs):   # every base covers it, or it is after the round
            continue
        at = _positions(touched, runs.keys)
        take = at >= 0
        take[take] = covers[at[take]] < source
        run_parts.append((at[take], runs.first[take], runs.last[take], runs.counts[take]))
    b_key = _positions(touched, base.key)
    held = b_key >= 0
    r_key, r_first, r_last, r_counts = _joined(run_parts)
    b_key, b_first, b_last, b_counts = b_key[held], base.first[held], base.last[held], base.counts[held]

    behind = np.zeros(len(touched), bool)
    behind[r_key[r_first <= bound_ms]] = True
    behind[b_key[b_last + gap_ms <= bound_ms]] = True
    keep_runs, keep_base = ~behind[r_key], ~behind[b_key]
    key = np.concatenate([b_key[keep_base], r_key[keep_runs]])
    first = np.concatenate([b_first[keep_base], r_first[keep_runs]])
    last = np.concatenate([b_last[keep_base], r_last[keep_runs]])
    counts = np.concatenate([b_counts[keep_base], r_counts[keep_runs]])
    if len(key):
        by = np.lexsort((last, first, key))
        key, first, last, counts = key[by], first[by], last[by], counts[by]
        at = np.flatnonzero(run_starts(key, first, last, gap_ms))
        key, last, counts = key[at], np.maximum.reduceat(last, at), np.add.reduceat(counts, at, axis=0)
        first = first[at]
    # A base start no longer among its key's starts was joined into an earlier one: retired.
    held_first, held_key = b_first[keep_base], b_key[keep_base]
    gone = ~np.isin(_pairs(held_key, held_first), _pairs(key, first))
    written = np.unique(key)
    standing = Standing(touched[written], np.full(len(written), batch_id, np.int64), touched[key], first, last,
                        counts.reshape(-1, _WIDTH))
    return Round(batch_id, touched, standing, touched[held_key[gone]], held_first[gone], touched[behind])


def _positions(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Where each of ``keys`` is in ``sorted_keys``; -1 where it is not."""
    at = np.searchsorted(sorted_keys, keys)
    found = at < len(sorted_keys)
    found[found] = sorted_keys[at[found]] == keys[found]
    return np.where(found, at, -1)


def _pairs(code: np.ndarray, first: np.ndarray) -> np.ndarray:
    """(key code, start) as one int64 each, for set operations: starts are epoch ms, under 2^42 until 2109."""
    return (code.astype(np.int64) << 42) | first.astype(np.int64)


def round_rows(result: Round, codes: KeyCodes, gap_ms: int, version: int, written_at: datetime) -> pa.Table:
    """``open_sessions`` rows of a round: each open session (``is_open``), each retired start (not), provisional."""
    opened = result.open
    key = np.concatenate([opened.key, result.retired_key])
    first = np.concatenate([opened.first, result.retired_first])
    last = np.concatenate([opened.last, result.retired_first])
    counts = np.concatenate([opened.counts, np.zeros((len(result.retired_key), _WIDTH), np.int64)])
    is_open = np.concatenate([np.ones(len(opened.key), np.uint8), np.zeros(len(result.retired_key), np.uint8)])
    n = len(key)
    app, kind, name = zip(*codes.keys(key), strict=True) if n else ((), (), ())
    ms = pa.timestamp("ms", tz="UTC")
    return pa.table({
        "gap_ms": pa.array(np.full(n, gap_ms), pa.uint64()), "app": pa.array(app, pa.string()),
        "key_kind": pa.array(kind, pa.string()), "session_key": pa.array(name, pa.string()),
        "session_start": pa.array(first, pa.int64()).cast(ms),
        "session_end": pa.array(last + gap_ms, pa.int64()).cast(ms),
        "last_event_time": pa.array(last, pa.int64()).cast(ms), "duration_ms": pa.array(last - first, pa.uint64()),
        **{name: pa.array(counts[:, i], pa.uint64()) for i, name in enumerate(COUNT_COLUMNS)},
        "is_open": pa.array(is_open, pa.uint8()), "provisional": pa.array(np.ones(n, np.uint8), pa.uint8()),
        "version": pa.array(np.full(n, version), pa.uint64()),
        "written_at": pa.array(np.full(n, int(written_at.timestamp() * 1000)), pa.int64()).cast(ms),
    })


class Remembered:
    """The open sessions the rounds wrote last, per key: a round's base for those keys in place of a store lookup.

    A key's entry stays exact while every accept batch published since was taken by a round that wrote: such a round
    rewrites every key its batches touched, and any other batch might hold runs of the key that nothing here read.
    So all of it is forgotten as soon as one batch escaped the rounds (skipped, failed, or taken by the reader
    first). Its sessions need no refresh when ``keyed_windows`` takes the batches it covers: the query joins the same
    runs the same way, and what the query alone can do (close a session, drop a run) happens only at or behind the
    watermark bound, where the key is left to the query. An entry is dropped once one of its sessions is due by
    that bound: the key would be left to the query on its next run anyway."""

    def __init__(self, gap_ms: int) -> None:
        self.gap_ms = gap_ms
        self._standing = Standing.empty()
        self._through: int | None = None   # the newest accept batch of the last round written

    def __len__(self) -> int:
        return len(self._standing)

    def base(self, start: Pending, bound_ms: int) -> Standing:
        """The entries a round starting at ``start`` can take as its base, under watermark bound ``bound_ms``."""
        since = self._through
        if since is None or start.taken > since or any(
                m.batch_id > since and m.batch_id not in start.batches for m in start.published):
            self.forget()
        held = self._standing
        due = held.last + self.gap_ms <= bound_ms
        if due.any():
            self._standing = held.of_keys(held.key[due], among=False)
        return self._standing

    def remember(self, result: Round) -> None:
        """The round ``result`` was written."""
        self._standing = self._standing.of_keys(result.keys, among=False) | result.open
        self._through = result.covered

    def forget(self) -> None:
        """A batch escaped the rounds, or the key codes start over: no entry can be trusted."""
        self._standing = Standing.empty()
        self._through = None


class ProvisionalSessions(AcceptRounds[BatchRuns]):
    """``accept``'s side: the provisional open sessions of the keys each published batch touched (module
    docstring), on a thread of their own (``analytics.rounds``). Keeps the runs of the accept batches the
    ``keyed_windows`` query has not taken yet, read once each, and the open sessions it wrote last per key
    (:class:`Remembered`)."""

    name = "provisional_sessions"

    def __init__(self, config: Config) -> None:
        super().__init__(config, config.checkpoint_dir / KEYED_WINDOWS_QUERY)
        self.gap_ms = config.stream.session_gap_s * 1000
        self._codes = KeyCodes()
        self._written = Remembered(self.gap_ms)
        self._left: dict[SessionKey, int] = {}   # key → the accept batch it was left to the query at

    def round(self, start: Pending, pending: dict[int, BatchRuns]) -> Round | None:
        """Write the provisional open sessions of the round's accept batches; None when none were written on
        purpose (runs of another gap) or could not be (the store unreachable)."""
        committed, batches, batch_id = start.committed, start.batches, max(start.batches)
        if any(p.runs is None for p in pending.values()):
            return None
        runs = {b: p.runs for b, p in pending.items() if p.runs is not None}
        bound_ms = self.bound_ms(start, (p.newest_event_ms for p in pending.values()))
        for key in [k for k, at in self._left.items() if at <= committed]:
            del self._left[key]
        written = self._written.base(start, bound_ms)
        touched = np.unique(np.concatenate([runs[b].keys for b in batches]))
        eligible = touched[~np.isin(touched, self._codes.known(self._left))]
        try:
            with timed(ACCEPT_QUERY, "provisional_sessions.lookup"):
                base = written.of_keys(eligible)
                base |= self._stored(eligible[~np.isin(eligible, base.keys)], committed)
            with timed(ACCEPT_QUERY, "provisional_sessions.merge"):
                result = provisional_round(eligible, base, runs, batch_id, bound_ms, self.gap_ms)
                rows = round_rows(result, self._codes, self.gap_ms, provisional_version(batch_id), datetime.now(UTC))
            if rows.num_rows:
                with timed(ACCEPT_QUERY, "provisional_sessions.insert"), connect(self.config) as client:
                    client.insert_arrow("open_sessions", rows)
                    # After the rows: a page that sees the round reads them (dashboard.live).
                    record_round(client, PROVISIONAL_SESSIONS, datetime.now(UTC))
        except (StoreUnavailable, ClickHouseError) as exc:
            log.warning("accept batches %s: no provisional open sessions (%s)", batches,
                        str(exc).splitlines()[0][:200])
            return None
        for key in self._codes.keys(result.left):
            self._left[key] = batch_id
        self._written.remember(result)
        written_ms = int(time.time() * 1000)
        left = np.union1d(np.setdiff1d(touched, eligible), result.left)
        for batch in batches:
            outcomes.note(batch, (len(np.intersect1d(runs[batch].keys, left)), written_ms))
        if len(self._codes) > KEY_CODES_MAX:   # start the numbering over: forget everything numbered
            self._codes = KeyCodes()
            self._written.forget()
            self.forget_reads()
        return result

    def read(self, batch_id: int) -> BatchRuns:
        files = [pq.ParquetFile(f) for f in accepted_log.events_files(self.config, batch_id)]
        tables = [f.read(columns=[c for c in _RUN_COLUMNS if c in f.schema_arrow.names]) for f in files]
        events = pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
        return batch_runs(events, self.gap_ms, self._codes)

    def _stored(self, keys: np.ndarray, committed: int) -> Standing:
        """The open sessions readers see now (``open_sessions_now``) of ``keys`` (codes, sorted), each key's
        covering the newest accept batch its provisional rows were written at, else the newest the query's rows
        cover (at least ``committed``: the query writes its rows before it commits)."""
        if not len(keys):
            return Standing.empty()
        with connect(self.config) as client:
            [[query_version]] = client.query("SELECT maxOrNull(version) FROM keyed_sessions_covered").result_rows
            found = client.query(
                "SELECT app, key_kind, session_key, toUnixTimestamp64Milli(session_start), "
                f"toUnixTimestamp64Milli(last_event_time), {', '.join(COUNT_COLUMNS)}, provisional, version "
                "FROM open_sessions_now WHERE gap_ms = %(gap)s AND (app, key_kind, session_key) IN %(keys)s "
                "ORDER BY app, key_kind, session_key, session_start",
                parameters={"gap": self.gap_ms, "keys": tuple(self._codes.keys(keys))}).result_rows
        base_covered = max(-1 if query_version is None else covered(int(query_version)), committed)
        columns = list(zip(*found, strict=True)) if found else [[] for _ in range(7 + _WIDTH)]
        key = self._codes.codes(zip(*columns[:3], strict=True))
        first, last = np.asarray(columns[3], np.int64), np.asarray(columns[4], np.int64)
        counts = np.asarray(columns[5:5 + _WIDTH], np.int64).T.reshape(-1, _WIDTH)
        # A key's base covers the newest batch its provisional rows stand after, else what the query's rows cover;
        # a key without open sessions has an empty base covering what the query covers.
        provisional, version = np.asarray(columns[-2], np.int64), np.asarray(columns[-1], np.int64)
        at, mine = _positions(keys, key), np.where(provisional == 1, covered(version), -1)
        newest_mine = np.full(len(keys), -1, np.int64)
        np.maximum.at(newest_mine, at[at >= 0], mine[at >= 0])
        return Standing(keys, np.where(newest_mine >= 0, newest_mine, base_covered), key, first, last, counts)


def _empty() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.empty(0, np.int64), np.empty(0, np.int64), np.empty((0, _WIDTH), np.int64)


def _joined(parts: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if not parts:
        return np.empty(0, np.int64), *_empty()
    key, first, last, counts = zip(*parts, strict=True)
    return (np.concatenate(key), np.concatenate(first), np.concatenate(last),
            np.concatenate(counts).reshape(-1, _WIDTH))
