"""Provisional open sessions: the sessions in progress of the session keys each ``accept`` batch touched, as they
stand after that batch, before the ``keyed_windows`` query has taken it.

``keyed_windows`` takes a reader batch every ``stream.trigger_interval_s`` (``analytics.reader_batches``), so the
sessions in progress it writes (``open_sessions``) move at that pace plus its batch's run time. ``accept`` runs more
often and already joins each batch's events of a session key into runs (``analytics.keyed.runs``). After publishing
a batch, its driver takes the runs of every key the batch touched into that key's open sessions as last written (by
this driver, or by the query: read from ``open_sessions_now``) and writes the key's open sessions again, marked
``provisional``, with ``version`` ``2k`` for accept batch ``k``; the query writes ``2c + 1``, ``c`` being the newest
accept batch of its micro-batch (``analytics.keyed.writer.open_session_version``).

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

import itertools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from clickhouse_connect.driver.exceptions import ClickHouseError

from analytics import accepted_log
from analytics.keyed import runs as session_runs
from analytics.keyed.sessions import COUNT_COLUMNS, _latest_end_per_key, run_counts
from analytics.progress import record_round
from analytics.rounds import AcceptRounds, Pending, provisional_version
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


@dataclass(frozen=True)
class Runs:
    """Session runs, one per entry: its key, first and last corrected event time (ms) and its COUNT_COLUMNS."""

    keys: list[SessionKey]
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
class KeySessions:
    """A session key's open sessions (sorted by start) as they stand after accept batch ``covered``."""

    covered: int
    first: np.ndarray
    last: np.ndarray
    counts: np.ndarray


@dataclass(frozen=True)
class Round:
    """What a round writes, flat: the open sessions of each key (``keys[code]``), sorted by key and start; the starts
    no longer open; and the keys left to the query."""

    keys: list[SessionKey]
    covered: int
    code: np.ndarray
    first: np.ndarray
    last: np.ndarray
    counts: np.ndarray
    retired_code: np.ndarray
    retired_first: np.ndarray
    left: set[SessionKey]

    @property
    def sessions(self) -> dict[SessionKey, KeySessions]:
        """Each key's open sessions."""
        edges = np.searchsorted(self.code, np.arange(len(self.keys) + 1))
        return {self.keys[c]: KeySessions(self.covered, self.first[a:b], self.last[a:b], self.counts[a:b])
                for c, (a, b) in enumerate(itertools.pairwise(edges)) if b > a}

    @property
    def earliest_last(self) -> dict[SessionKey, int]:
        """Each key's earliest last event time among its open sessions (ms): the first of them the watermark
        closes ends ``G`` after it."""
        if not len(self.code):
            return {}
        at = np.flatnonzero(np.r_[True, self.code[1:] != self.code[:-1]])
        return dict(zip([self.keys[c] for c in self.code[at].tolist()],
                        np.minimum.reduceat(self.last, at).tolist(), strict=True))

    @property
    def retired(self) -> dict[SessionKey, np.ndarray]:
        """Each key's starts no longer open."""
        return {self.keys[c]: self.retired_first[self.retired_code == c] for c in np.unique(self.retired_code)}


def batch_runs(events: pa.Table, gap_ms: int) -> BatchRuns:
    """The session runs of an accept batch's events (its files' :data:`_RUN_COLUMNS`): one per run head."""
    newest = int(epoch_ms(events["corrected_event_time"]).max()) if events.num_rows else None
    if not events.num_rows:
        return BatchRuns(Runs([], *_empty()), newest)
    gaps = pc.unique(events[session_runs.GAP]).to_pylist() if session_runs.GAP in events.column_names else [None]
    if gaps != [gap_ms]:
        return BatchRuns(None, newest)
    heads = events.filter(pc.greater(events[session_runs.EVENTS], 0))
    kind, name = session_runs.session_keys(heads)
    keys = list(zip(heads["app"].to_pylist(), kind.to_pylist(), name.to_pylist(), strict=True))
    levels = np.column_stack([np.asarray(heads[c], np.int64) for c in session_runs.LEVEL_COUNTS])
    return BatchRuns(Runs(keys, epoch_ms(heads["corrected_event_time"]),
                          np.asarray(heads[session_runs.LAST], np.int64),
                          run_counts(np.asarray(heads[session_runs.EVENTS], np.int64), levels)), newest)


def provisional_round(touched: Sequence[SessionKey], base: Mapping[SessionKey, KeySessions],
                      pending: Mapping[int, Runs], batch_id: int, bound_ms: int, gap_ms: int) -> Round:
    """The open sessions of the ``touched`` keys after accept batch ``batch_id``: each key's ``base`` sessions (none
    for a key absent there), joined with its runs of the ``pending`` accept batches after the one its base covers, up
    to ``batch_id``, as the session rule joins them (runs less than G apart form one session). A key with such a run
    starting at or behind ``bound_ms``, or a base session ending there (``last + G <= bound_ms``), is ``left`` to the
    query (module docstring). In array operations over every key at once: a round touches thousands."""
    order = list(dict.fromkeys(touched))
    code_of = {key: code for code, key in enumerate(order)}
    covered = np.array([base[k].covered if k in base else -1 for k in order], np.int64)

    run_parts = []
    for source, runs in sorted(pending.items()):
        if source > batch_id or not len(runs):
            continue
        codes = np.array([code_of.get(k, -1) for k in runs.keys], np.int64)
        take = codes >= 0
        take[take] = covered[codes[take]] < source
        run_parts.append((codes[take], runs.first[take], runs.last[take], runs.counts[take]))
    held = [(code, base[k]) for code, k in enumerate(order) if k in base and len(base[k].first)]
    base_parts = [(np.repeat(np.array([c for c, _ in held], np.int64), [len(s.first) for _, s in held]),
                   *(np.concatenate(part) for part in zip(*((s.first, s.last, s.counts) for _, s in held),
                                                          strict=True)))] if held else []
    r_key, r_first, r_last, r_counts = _joined(run_parts)
    b_key, b_first, b_last, b_counts = _joined(base_parts)

    behind = np.zeros(len(order), bool)
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
        starts = np.ones(len(key), bool)
        starts[1:] = (key[1:] != key[:-1]) | (first[1:] - _latest_end_per_key(key, last)[:-1] >= gap_ms)
        at = np.flatnonzero(starts)
        key, last, counts = key[at], np.maximum.reduceat(last, at), np.add.reduceat(counts, at, axis=0)
        first = first[at]
    # A base start no longer among its key's starts was joined into an earlier one: retired.
    held_first, held_key = b_first[keep_base], b_key[keep_base]
    gone = ~np.isin(_pairs(held_key, held_first), _pairs(key, first))
    return Round(order, batch_id, key, first, last, counts.reshape(-1, _WIDTH), held_key[gone], held_first[gone],
                 {order[c] for c in np.flatnonzero(behind).tolist()})


def _pairs(code: np.ndarray, first: np.ndarray) -> np.ndarray:
    """(key code, start) as one int64 each, for set operations: starts are epoch ms, under 2^42 until 2109."""
    return (code.astype(np.int64) << 42) | first.astype(np.int64)


def round_rows(result: Round, gap_ms: int, version: int, written_at: datetime) -> pa.Table:
    """``open_sessions`` rows of a round: each open session (``is_open``), each retired start (not), provisional."""
    code = np.concatenate([result.code, result.retired_code])
    first = np.concatenate([result.first, result.retired_first])
    last = np.concatenate([result.last, result.retired_first])
    counts = np.concatenate([result.counts, np.zeros((len(result.retired_code), _WIDTH), np.int64)])
    is_open = np.concatenate([np.ones(len(result.code), np.uint8), np.zeros(len(result.retired_code), np.uint8)])
    n = len(code)
    keys = [np.array([k[i] for k in result.keys], dtype=object)[code] if n else [] for i in range(3)]
    ms = pa.timestamp("ms", tz="UTC")
    return pa.table({
        "gap_ms": pa.array(np.full(n, gap_ms), pa.uint64()), "app": pa.array(keys[0], pa.string()),
        "key_kind": pa.array(keys[1], pa.string()), "session_key": pa.array(keys[2], pa.string()),
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
        self._sessions: dict[SessionKey, KeySessions] = {}
        self._due_ms: dict[SessionKey, int] = {}   # when the key's first open session closes: earliest last + G
        self._through: int | None = None   # the newest accept batch of the last round written

    def __len__(self) -> int:
        return len(self._sessions)

    def base(self, start: Pending, bound_ms: int) -> dict[SessionKey, KeySessions]:
        """The entries a round starting at ``start`` can take as its base, under watermark bound ``bound_ms``."""
        since = self._through
        if since is None or start.taken > since or any(
                m.batch_id > since and m.batch_id not in start.batches for m in start.published):
            self.forget()
        for key in [k for k, due in self._due_ms.items() if due <= bound_ms]:
            del self._sessions[key], self._due_ms[key]
        return self._sessions

    def remember(self, result: Round) -> None:
        """The round ``result`` was written."""
        for key in result.left:
            self._sessions.pop(key, None)
            self._due_ms.pop(key, None)
        self._sessions.update(result.sessions)
        self._due_ms.update({k: last + self.gap_ms for k, last in result.earliest_last.items()})
        self._through = result.covered

    def forget(self) -> None:
        """A batch escaped the rounds: no entry can be trusted."""
        self._sessions.clear()
        self._due_ms.clear()
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
        touched = list(dict.fromkeys(k for b in batches for k in runs[b].keys))
        eligible = [k for k in touched if k not in self._left]
        try:
            with timed(ACCEPT_QUERY, "provisional_sessions.lookup"):
                base = {k: written[k] for k in eligible if k in written}
                base |= self._stored([k for k in eligible if k not in base], committed)
            with timed(ACCEPT_QUERY, "provisional_sessions.merge"):
                result = provisional_round(eligible, base, runs, batch_id, bound_ms, self.gap_ms)
                rows = round_rows(result, self.gap_ms, provisional_version(batch_id), datetime.now(UTC))
            if rows.num_rows:
                with timed(ACCEPT_QUERY, "provisional_sessions.insert"), connect(self.config) as client:
                    client.insert_arrow("open_sessions", rows)
                    # After the rows: a page that sees the round reads them (dashboard.live).
                    record_round(client, PROVISIONAL_SESSIONS, datetime.now(UTC))
        except (StoreUnavailable, ClickHouseError) as exc:
            log.warning("accept batches %s: no provisional open sessions (%s)", batches,
                        str(exc).splitlines()[0][:200])
            return None
        for key in result.left:
            self._left[key] = batch_id
        self._written.remember(result)
        written_ms = int(time.time() * 1000)
        left = set(touched) - set(eligible) | result.left
        for batch in batches:
            outcomes.note(batch, (len(left & set(runs[batch].keys)), written_ms))
        return result

    def read(self, batch_id: int) -> BatchRuns:
        files = [pq.ParquetFile(f) for f in accepted_log.events_files(self.config, batch_id)]
        tables = [f.read(columns=[c for c in _RUN_COLUMNS if c in f.schema_arrow.names]) for f in files]
        events = pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
        return batch_runs(events, self.gap_ms)

    def _stored(self, keys: list[SessionKey], committed: int) -> dict[SessionKey, KeySessions]:
        """The open sessions readers see now (``open_sessions_now``) of ``keys``, each key's covering the newest
        accept batch its provisional rows were written at, else the newest the query's rows cover (at least
        ``committed``: the query writes its rows before it commits)."""
        if not keys:
            return {}
        with connect(self.config) as client:
            [[query_version]] = client.query("SELECT maxOrNull(version) FROM keyed_sessions_covered").result_rows
            found = client.query(
                "SELECT app, key_kind, session_key, toUnixTimestamp64Milli(session_start), "
                f"toUnixTimestamp64Milli(last_event_time), {', '.join(COUNT_COLUMNS)}, provisional, version "
                "FROM open_sessions_now WHERE gap_ms = %(gap)s AND (app, key_kind, session_key) IN %(keys)s",
                parameters={"gap": self.gap_ms, "keys": tuple(keys)}).result_rows
        base_covered = max(-1 if query_version is None else int(query_version) // 2, committed)
        out: dict[SessionKey, KeySessions] = {}
        if found:
            columns = list(zip(*found, strict=True))
            codes, uniques = pd.factorize(pd.MultiIndex.from_arrays(columns[:3]))
            first, last = np.asarray(columns[3], np.int64), np.asarray(columns[4], np.int64)
            counts = np.column_stack([np.asarray(c, np.int64) for c in columns[5:5 + _WIDTH]])
            mine = np.where(np.asarray(columns[-2], np.int64) == 1, np.asarray(columns[-1], np.int64) // 2, -1)
            by = np.lexsort((first, codes))
            codes, first, last, counts, mine = codes[by], first[by], last[by], counts[by], mine[by]
            at = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
            newest_mine = np.maximum.reduceat(mine, at)
            for i, (a, b) in enumerate(itertools.pairwise([*at.tolist(), len(codes)])):
                out[uniques[codes[a]]] = KeySessions(int(newest_mine[i]) if newest_mine[i] >= 0 else base_covered,
                                                     first[a:b], last[a:b], counts[a:b])
        # A key without open sessions has an empty base covering what the query covers.
        for key in keys:
            out.setdefault(key, KeySessions(base_covered, *_empty()))
        return out


def _empty() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.empty(0, np.int64), np.empty(0, np.int64), np.empty((0, _WIDTH), np.int64)


def _joined(parts: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if not parts:
        return np.empty(0, np.int64), *_empty()
    key, first, last, counts = zip(*parts, strict=True)
    return (np.concatenate(key), np.concatenate(first), np.concatenate(last),
            np.concatenate(counts).reshape(-1, _WIDTH))
