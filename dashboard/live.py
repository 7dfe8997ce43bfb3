"""When a refreshing page part reads the store again: only when there is something new to show.

Every refresh asks the store one small question, when each stream query stored its newest batch, which the
freshness line needs anyway. The part's own queries run, and its charts are built again, only when a query the
part follows stored a batch since its last read (or, for tumbling and hopping rows, ``accept`` wrote a round of
provisional ones: ``store.pipeline.WINDOW_ROWS``), when its filters changed, or when the pipeline is not keeping up
(no batch yet, or the newest older than the stale threshold): then every refresh reads, so lag and alerts keep
moving while the job is stopped. Between batches the part draws the data of its last read, over the same range:
the same charts, which the browser does not draw again. Redrawing every chart at every refresh, only for the
time axis to move a second, cost an open tab more CPU than the job's own queries (docs/dashboard.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

import streamlit as st

from dashboard import common
from dashboard.data.reader import Reader, last_batches
from eventide.config import Config

T = TypeVar("T")

LIVE_STATE = "live_reads"
"""Session state: each refreshing part's last read, by part name."""


@dataclass(frozen=True)
class LastRead(Generic[T]):
    """What a refreshing part read, and what it was reading for."""

    key: object
    """Everything the read depends on besides time (the part's filters and range length)."""
    version: object
    """What the store's side looked like as the read began: the followed query's newest batch, or the part's own
    version of its data (None: nothing stored yet)."""
    data: T


def still_current(last: LastRead[object] | None, key: object, version: object, trusted: bool) -> bool:
    """Whether ``last`` still shows what a read now would: same ``key``, same ``version``, and that version
    ``trusted`` to move when the data does (a batch time is not, once the pipeline is stale)."""
    return last is not None and trusted and version is not None and last.key == key and last.version == version


def batch_is_fresh(newest: datetime | None, now: datetime, stale_after_s: float) -> bool:
    """Whether a query's ``newest`` batch is recent enough that the next one will come: at most ``stale_after_s``
    old at ``now``."""
    return newest is not None and (now - newest).total_seconds() <= stale_after_s


def _kept_or_read(part: str, key: object, version: object, trusted: bool, read: Callable[[], T]) -> T:
    reads: dict[str, LastRead[object]] = st.session_state.setdefault(LIVE_STATE, {})
    last = reads.get(part)
    if last is not None and still_current(last, key, version, trusted):
        return last.data   # type: ignore[return-value]
    data = read()
    reads[part] = LastRead(key, version, data)
    return data


def followed_version(batches: Mapping[str, datetime], follows: Sequence[str]) -> tuple[datetime | None, ...] | None:
    """What a part following the writers ``follows`` last saw of them: each one's newest batch or round (None
    before the first query's first batch, so every refresh reads until then)."""
    if batches.get(follows[0]) is None:
        return None
    return tuple(batches.get(writer) for writer in follows)


def read_when_new(config: Config, part: str, follows: Sequence[str], key: object,
                  read: Callable[[], T]) -> tuple[Mapping[str, datetime], T]:
    """(when each stream query stored its newest batch, ``read()`` or the part's last result of it).

    ``part``: a name unique on its page; ``follows``: the stream queries, or other writers (``store.pipeline``),
    whose new batches are worth a new read, the first one's age telling whether the pipeline keeps up (e.g.
    ``pipeline.WINDOW_ROWS``); ``key``: everything ``read`` depends on besides time, compared with ``==``;
    ``read``: the part's queries, returning everything it draws, the time range it chose included (a range ending
    now would move the axis at every refresh)."""
    batches = common.page_data(config, last_batches)
    fresh = batch_is_fresh(batches.get(follows[0]), datetime.now(UTC), common.stale_after_s(config))
    return batches, _kept_or_read(part, key, followed_version(batches, follows), fresh, read)


def last_minutes_when_new(config: Config, part: str, follows: Sequence[str], minutes: int, key: object,
                          data: Callable[..., T], *args: object,
                          **kwargs: object) -> tuple[Mapping[str, datetime], tuple[tuple[datetime, datetime], T]]:
    """:func:`read_when_new` for a part that shows the last ``minutes``: (batches, ((since, until), ``data(reader,
    *args, since, until, **kwargs)``)), read again as :func:`read_when_new` says; ``key``: what else it depends on."""
    def read() -> tuple[tuple[datetime, datetime], T]:
        span = common.last(minutes)
        return span, common.page_data(config, data, *args, *span, **kwargs)

    return read_when_new(config, part, follows, (minutes, key), read)


def read_when_changed(config: Config, part: str, version: Callable[[Reader], object], key: object,
                      read: Callable[[], T]) -> T:
    """``read()``, or the part's last result of it while ``version`` (a data function asking the store something
    cheap that changes whenever the part's data may have, e.g. a table's row count) gives what it gave then.
    For a part that must show new rows as soon as they are stored: a stream query's batch is recorded after all
    its writes, seconds after its first ones."""
    return _kept_or_read(part, key, common.page_data(config, version), True, read)
