"""Provisional open sessions (analytics.keyed.provisional): given a key's open sessions as last written and the
session runs of the accept batches after them, the sessions in progress as the session rule would form them; keys
the watermark could judge otherwise are left to the keyed_windows query."""

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from analytics.accepted_log import BatchMeta
from analytics.keyed import runs as session_runs
from analytics.keyed.provisional import (
    KeyCodes,
    Remembered,
    Round,
    Runs,
    Standing,
    batch_runs,
    provisional_round,
    provisional_version,
    round_rows,
)
from analytics.keyed.sessions import COUNT_COLUMNS
from analytics.rounds import Pending, reader_version

G = 300_000
T0 = 1_800_000_000_000
ANN = ("shop", "user", "ann")
BOB = ("shop", "user", "bob")
WIDTH = len(COUNT_COLUMNS)
FAR_BEHIND = T0 - 3_600_000   # a watermark bound no run or session here reaches
KEYS = KeyCodes()
SessionKey = tuple[str, str, str]


@dataclass(frozen=True)
class KeySessions:
    """A key's open sessions (sorted by start) as they stand after accept batch ``covered``: one key's part of a
    :class:`Standing`."""

    covered: int
    first: np.ndarray
    last: np.ndarray
    counts: np.ndarray


def standing(by_code: dict[int, KeySessions]) -> Standing:
    """The :class:`Standing` of each key's sessions, by code."""
    held = list(by_code.items())
    codes = np.array([k for k, _ in held], np.int64)
    return Standing(codes, np.array([s.covered for _, s in held], np.int64),
                    np.repeat(codes, [len(s.first) for _, s in held]),
                    np.concatenate([np.empty(0, np.int64), *(s.first for _, s in held)]),
                    np.concatenate([np.empty(0, np.int64), *(s.last for _, s in held)]),
                    np.concatenate([np.empty((0, WIDTH), np.int64), *(s.counts for _, s in held)]))


def metric_counts(events: int) -> list[int]:
    return [events, events, 0] + [0] * (WIDTH - 3)


def runs(*entries: tuple[tuple[str, str, str], int, int, int]) -> Runs:
    """Runs of (key, first, last, metric events)."""
    return Runs(KEYS.codes(e[0] for e in entries), np.array([e[1] for e in entries], np.int64),
                np.array([e[2] for e in entries], np.int64),
                np.array([metric_counts(e[3]) for e in entries], np.int64).reshape(-1, WIDTH))


def open_sessions(covered: int, *sessions: tuple[int, int, int]) -> KeySessions:
    """A key's open sessions (first, last, metric events), as they stand after accept batch ``covered``."""
    return KeySessions(covered, np.array([s[0] for s in sessions], np.int64),
                       np.array([s[1] for s in sessions], np.int64),
                       np.array([metric_counts(s[2]) for s in sessions], np.int64).reshape(-1, WIDTH))


def provisional(touched: list[SessionKey], base: dict[SessionKey, KeySessions], pending: dict[int, Runs],
                batch_id: int, bound_ms: int) -> Round:
    """The round of accept batch ``batch_id`` over keys ``touched``, each with its ``base`` sessions."""
    by_code = dict(zip(KEYS.codes(base).tolist(), base.values(), strict=True))
    return provisional_round(np.sort(KEYS.codes(touched)), standing(by_code), pending, batch_id, bound_ms, G)


def by_key(held: Standing) -> dict[SessionKey, KeySessions]:
    """Each key's part of ``held``, by key."""
    edges = np.flatnonzero(np.r_[True, held.key[1:] != held.key[:-1], True]).tolist() if len(held.key) else []
    spans = {int(held.key[a]): slice(a, b) for a, b in itertools.pairwise(edges)}
    none = slice(0, 0)
    return {KEYS.keys(np.array([k]))[0]: KeySessions(c, held.first[spans.get(k, none)], held.last[spans.get(k, none)],
                                                     held.counts[spans.get(k, none)])
            for k, c in zip(held.keys.tolist(), held.covered.tolist(), strict=True)}


def sessions(result: Round) -> dict[SessionKey, KeySessions]:
    """Each key's open sessions after the round."""
    return by_key(result.open)


def retired(result: Round) -> dict[SessionKey, list[int]]:
    """Each key's starts no longer open."""
    starts: dict[SessionKey, list[int]] = {}
    for key, first in zip(KEYS.keys(result.retired_key), result.retired_first.tolist(), strict=True):
        starts.setdefault(key, []).append(first)
    return starts


def left(result: Round) -> set[SessionKey]:
    return set(KEYS.keys(result.left))


def as_lists(s: KeySessions) -> list[tuple[int, int, int]]:
    return list(zip(s.first.tolist(), s.last.tolist(), s.counts[:, 0].tolist(), strict=True))


def test_a_run_less_than_g_after_an_open_session_extends_it():
    base = {ANN: open_sessions(4, (T0, T0 + 10_000, 3))}
    result = provisional([ANN], base, {5: runs((ANN, T0 + 60_000, T0 + 61_000, 2))}, 5, FAR_BEHIND)
    assert as_lists(sessions(result)[ANN]) == [(T0, T0 + 61_000, 5)]
    assert sessions(result)[ANN].covered == 5
    assert not retired(result) and not left(result)


def test_a_run_g_or_more_after_starts_a_second_session():
    base = {ANN: open_sessions(4, (T0, T0 + 10_000, 3))}
    later = T0 + 10_000 + G   # exactly G after the last event: a new session (BRIEF: gaps under G join)
    result = provisional([ANN], base, {5: runs((ANN, later, later, 1))}, 5, FAR_BEHIND)
    assert as_lists(sessions(result)[ANN]) == [(T0, T0 + 10_000, 3), (later, later, 1)]


def test_a_run_bridging_two_sessions_joins_them_and_retires_the_later_start():
    base = {ANN: open_sessions(4, (T0, T0 + 1_000, 1), (T0 + 400_000, T0 + 401_000, 1))}
    bridge = runs((ANN, T0 + 200_000, T0 + 200_000, 1))
    result = provisional([ANN], base, {5: bridge}, 5, FAR_BEHIND)
    assert as_lists(sessions(result)[ANN]) == [(T0, T0 + 401_000, 3)]
    assert retired(result)[ANN] == [T0 + 400_000]


def test_runs_of_every_pending_batch_after_the_base_count_once():
    """The base covers accept batch 5: batch 5's runs are in it already, batches 6 and 7 are added."""
    base = {ANN: open_sessions(5, (T0, T0 + 1_000, 2))}
    pending = {5: runs((ANN, T0 + 1_000, T0 + 1_000, 1)), 6: runs((ANN, T0 + 2_000, T0 + 2_000, 1)),
               7: runs((ANN, T0 + 3_000, T0 + 3_000, 1), (BOB, T0 + 3_000, T0 + 3_500, 4))}
    result = provisional([ANN, BOB], base, pending, 7, FAR_BEHIND)
    assert as_lists(sessions(result)[ANN]) == [(T0, T0 + 3_000, 4)]
    assert as_lists(sessions(result)[BOB]) == [(T0 + 3_000, T0 + 3_500, 4)]   # no base: a new session


def test_a_batch_after_the_round_is_not_taken():
    pending = {7: runs((ANN, T0, T0, 1)), 8: runs((ANN, T0 + 1_000, T0 + 1_000, 1))}
    assert as_lists(sessions(provisional([ANN], {}, pending, 7, FAR_BEHIND))[ANN]) == [(T0, T0, 1)]


def test_a_key_with_a_run_at_or_behind_the_watermark_bound_is_left_to_the_query():
    """A late run may touch a closed session or be closed itself: the query decides, so the key gets no row; the
    other keys of the batch do."""
    bound = T0 + 50_000
    pending = {5: runs((ANN, bound, bound + 1_000, 1), (BOB, bound + 1, bound + 1, 1))}
    result = provisional([ANN, BOB], {}, pending, 5, bound)
    assert left(result) == {ANN}
    assert list(sessions(result)) == [BOB]


def test_a_key_whose_open_session_the_watermark_closes_is_left_to_the_query():
    bound = T0 + 1_000 + G   # the session [T0, T0 + 1 s + G) is closed once the watermark reaches its end
    base = {ANN: open_sessions(4, (T0, T0 + 1_000, 1))}
    result = provisional([ANN], base, {5: runs((ANN, bound + 5_000, bound + 5_000, 1))}, 5, bound)
    assert left(result) == {ANN} and not sessions(result)


def test_round_rows_are_provisional_open_sessions_and_retired_starts_at_the_accept_batch_version():
    base = {ANN: open_sessions(4, (T0, T0 + 1_000, 1), (T0 + 400_000, T0 + 401_000, 1))}
    result = provisional([ANN], base, {9: runs((ANN, T0 + 200_000, T0 + 200_000, 1))}, 9, FAR_BEHIND)
    rows = round_rows(result, KEYS, G, provisional_version(9), datetime(2027, 1, 15, tzinfo=UTC)).to_pylist()
    assert [(r["session_key"], r["is_open"], r["event_count"], r["duration_ms"]) for r in rows] == [
        ("ann", 1, 3, 401_000), ("ann", 0, 0, 0)]
    assert {(r["provisional"], r["version"], r["gap_ms"]) for r in rows} == {(1, 18, G)}
    assert rows[0]["session_end"] == datetime.fromtimestamp((T0 + 401_000 + G) / 1000, UTC)


def test_the_query_s_rows_outrank_the_provisional_rows_of_every_batch_they_took():
    assert reader_version(9) > provisional_version(9) > reader_version(8)


def test_batch_runs_take_the_heads_of_an_accept_batch_s_runs():
    t = pa.array([T0, T0 + 1_000, T0 + 2_000], pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
    events = session_runs.with_runs(pa.table({
        "app": ["shop", "shop", "shop"], "user": ["ann", "ann", None], "device": ["d1", "d1", "d2"],
        "corrected_event_time": t, "level": [None, "error", None]}), G)
    found = batch_runs(events, G, KEYS)
    assert found.newest_event_ms == T0 + 2_000
    assert found.runs is not None
    runs_by_key = {k: (f, la, c[0], c[2]) for k, f, la, c in zip(
        KEYS.keys(found.runs.keys), found.runs.first.tolist(), found.runs.last.tolist(), found.runs.counts.tolist(),
        strict=True)}
    assert runs_by_key == {("shop", "user", "ann"): (T0, T0 + 1_000, 2, 1), ("shop", "device", "d2"): (T0 + 2_000,
                                                                                                 T0 + 2_000, 1, 0)}
    assert batch_runs(events, G + 1, KEYS).runs is None   # runs formed with another gap: left to the query


def round_start(batches: list[int], published: list[int], taken: int) -> Pending:
    """A round of accept ``batches``, ``published`` being every published batch after the reader's ``taken``."""
    metas = [BatchMeta(b, {}, {}, T0, T0) for b in published]
    return Pending(committed=taken, watermark_ms=FAR_BEHIND, taken=taken, published=metas, batches=batches)


def remembered_after_round_3() -> Remembered:
    """Ann's session (T0 .. T0 + 1 s) and bob's (T0 + 60 s .. T0 + 61 s), as a round wrote them at accept batch 3."""
    written = Remembered(G)
    pending = {3: runs((ANN, T0, T0 + 1_000, 2), (BOB, T0 + 60_000, T0 + 61_000, 1))}
    written.remember(provisional([ANN, BOB], {}, pending, 3, FAR_BEHIND))
    return written


def test_what_a_round_wrote_is_the_next_round_s_base_even_after_the_query_took_it():
    """The query has taken batch 3 (taken = 3): it joined the same runs, so what was written stays the base."""
    base = by_key(remembered_after_round_3().base(round_start([4], [4], taken=3), FAR_BEHIND))
    assert as_lists(base[ANN]) == [(T0, T0 + 1_000, 2)] and base[ANN].covered == 3
    assert set(base) == {ANN, BOB}


def test_everything_is_forgotten_once_a_published_batch_escaped_the_rounds():
    """Batch 4's round was not written (skipped or failed): it may hold runs of ann or bob nothing read."""
    assert by_key(remembered_after_round_3().base(round_start([5], [4, 5], taken=3), FAR_BEHIND)) == {}


def test_everything_is_forgotten_once_the_reader_took_a_batch_no_round_wrote():
    assert by_key(remembered_after_round_3().base(round_start([5], [5], taken=4), FAR_BEHIND)) == {}


def test_a_key_is_forgotten_once_its_first_session_is_due_by_the_watermark_bound():
    """Its next run would leave it to the query, which may have closed the session by then."""
    written = remembered_after_round_3()
    assert set(by_key(written.base(round_start([4], [4], taken=3), T0 + 1_000 + G - 1))) == {ANN, BOB}
    assert set(by_key(written.base(round_start([4], [4], taken=3), T0 + 1_000 + G))) == {BOB}


def test_a_key_left_to_the_query_is_forgotten():
    written = remembered_after_round_3()
    bound = T0 + 100_000
    late = {4: runs((ANN, bound - 1, bound - 1, 1))}   # at or behind the bound: the query decides
    result = provisional_round(KEYS.codes([ANN]), written.base(round_start([4], [4], taken=3), bound), late, 4,
                               bound, G)
    assert left(result) == {ANN}
    written.remember(result)
    assert set(by_key(written.base(round_start([5], [5], taken=3), bound))) == {BOB}


def test_key_codes_number_each_key_once_in_the_order_first_seen():
    codes = KeyCodes()
    assert codes.codes([BOB, ANN, BOB]).tolist() == [0, 1, 0]
    assert codes.known([ANN, ("shop", "device", "d9")]).tolist() == [1]   # a key not seen has no code
    assert codes.keys(np.array([1, 0])) == [ANN, BOB] and len(codes) == 2
