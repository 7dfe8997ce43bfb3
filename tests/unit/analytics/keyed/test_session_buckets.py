"""A session bucket's state row, read lazily (``analytics.keyed.sessions.StoredBucket``): whatever a batch does to
some of its keys, the row it stores, its next due time and whether it is empty are exactly those of the bucket
unpacked key by key."""

from __future__ import annotations

import random

import numpy as np
import pytest

from analytics.keyed import sessions
from analytics.keyed.sessions import COUNT_COLUMNS, SessionState, StoredBucket

GAP, MEMORY = 60_000, 3_600_000
FIELDS = ("open_first", "open_last", "open_counts", "closed_first", "closed_last")


def random_state(rng: random.Random, empty_ok: bool = False) -> SessionState:
    n_open, n_closed = rng.randint(0, 3), rng.randint(0, 3)
    if not empty_ok and n_open + n_closed == 0:
        n_closed = 1
    t = lambda n: np.array(sorted(rng.randint(0, 10**9) for _ in range(n)), np.int64)  # noqa: E731
    return SessionState(t(n_open), t(n_open) + 1000,
                        np.array([[rng.randint(0, 9) for _ in COUNT_COLUMNS] for _ in range(n_open)],
                                 np.int64).reshape(-1, len(COUNT_COLUMNS)),
                        t(n_closed), t(n_closed) + 500)


def eager(packed: sessions.Packed) -> dict[str, SessionState]:
    """The bucket unpacked key by key, as a plain dict (the reference)."""
    stored = StoredBucket(packed)
    return {name: stored[name] for name in stored}


@pytest.mark.parametrize("seed", range(40))
def test_a_stored_bucket_packs_and_times_exactly_as_the_bucket_unpacked_key_by_key(seed):
    rng = random.Random(seed)
    names = [f"user-{i}" for i in range(rng.randint(0, 30))]
    packed = sessions.pack({name: random_state(rng) for name in names})
    lazy, reference = StoredBucket(packed), eager(packed)
    assert sessions.bucket_next_due(lazy, GAP, MEMORY) == sessions.bucket_next_due(reference, GAP, MEMORY)

    # A batch: some stored keys changed (some emptied), some removed, some only read, new keys added.
    for name in rng.sample(names, k=min(len(names), rng.randint(0, 6))):
        action = rng.choice(["change", "empty", "read", "remove"])
        if action == "remove":
            del lazy[name], reference[name]
        elif action == "read":
            assert all(np.array_equal(getattr(lazy[name], f), getattr(reference[name], f)) for f in FIELDS)
        else:
            state = SessionState() if action == "empty" else random_state(rng)
            lazy[name], reference[name] = state, state
    for i in range(rng.randint(0, 3)):
        state = random_state(rng, empty_ok=True)
        lazy.setdefault(f"new-{i}", state)
        reference.setdefault(f"new-{i}", state)

    assert list(lazy) == list(reference)
    assert len(lazy) == len(reference)
    assert sessions.pack(lazy) == sessions.pack(reference)
    assert sessions.bucket_next_due(lazy, GAP, MEMORY) == sessions.bucket_next_due(reference, GAP, MEMORY)
    assert sessions.bucket_empty(lazy) == sessions.bucket_empty(reference)


def test_a_bucket_whose_every_key_was_emptied_is_empty_and_packs_to_nothing():
    packed = sessions.pack({"ann": SessionState(closed_first=np.array([1], np.int64),
                                                closed_last=np.array([2], np.int64))})
    bucket = StoredBucket(packed)
    assert not sessions.bucket_empty(bucket)
    bucket["ann"] = SessionState()
    assert sessions.bucket_empty(bucket)
    assert sessions.bucket_next_due(bucket, GAP, MEMORY) is None
    assert sessions.pack(bucket)[-1] == ""
