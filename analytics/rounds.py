"""Provisional rounds: what ``accept``'s driver writes after each published batch, ahead of the reader that will take
that batch (``analytics.windows.provisional``: tumbling and hopping rows for ``windows``;
``analytics.keyed.provisional``: open sessions for ``keyed_windows``).

Both follow one pattern, kept here: a thread of their own takes the batches ``accept`` published (several at once
if it was busy), only while the reader keeps up and ``accept`` is not catching up on a backlog
(:func:`worth_writing`), and writes only what the reader cannot judge differently: what lies past every watermark
the reader can apply while it takes these batches (:func:`watermark_bound_ms`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from analytics import accepted_log
from analytics.accepted_log import BatchMeta
from analytics.event_time import watermark_delay_ms
from analytics.sinks import timed
from analytics.spark.checkpoint import batch_info, planned_batches
from analytics.vocabulary import ACCEPT_QUERY
from eventide.config import Config

log = logging.getLogger(__name__)

T = TypeVar("T")

PENDING_TRIGGERS_MAX = 3
"""Provisional rows are written only while the reader keeps up within this many triggers (:func:`worth_writing`)."""


def provisional_version(accept_batch: int) -> int:
    """The ``version`` of the provisional rows written at ``accept_batch``: below the reader's rows covering it
    (:func:`reader_version`), above those covering less."""
    return 2 * accept_batch


def reader_version(newest_accept_batch: int) -> int:
    """The ``version`` of the rows a reader (``windows``, ``keyed_windows``) writes in a micro-batch whose newest
    accept batch is ``newest_accept_batch``: above every provisional row of the accept batches it took."""
    return 2 * newest_accept_batch + 1


def covered(version: int) -> int:
    """The newest accept batch a row of this ``version`` covers, a reader's or a provisional one."""
    return version // 2


def watermark_bound_ms(watermark_ms: int, newest_event_ms: int | None, config: Config) -> int:
    """The highest watermark a reader can apply while it takes the accept batches whose latest corrected event
    time is ``newest_event_ms``, its current watermark being ``watermark_ms``: its watermark is the latest corrected
    event time of the reader batches before the one it takes, minus the allowed lateness."""
    if newest_event_ms is None:
        return watermark_ms
    return max(watermark_ms, newest_event_ms - watermark_delay_ms(config))


def worth_writing(pending: Sequence[BatchMeta], config: Config) -> bool:
    """Whether the provisional rows of the newest of ``pending`` (the published accept batches the reader has not
    taken, oldest first) are worth their cost. Not while ``accept`` started that batch more than
    :data:`PENDING_TRIGGERS_MAX` triggers after the oldest: the reader is that far behind, what there is to merge
    grows with its lag, and its own rows are what is late. Nor while ``accept`` catches up on a backlog (the
    batch's oldest record had reached the broker that long before the batch started): everything it touches is
    already old, its batches are large, and the driver's CPU is better spent catching up."""
    span_ms = PENDING_TRIGGERS_MAX * config.stream.trigger_interval_s * 1000
    newest = pending[-1]
    return (newest.accepted_at_ms - pending[0].accepted_at_ms <= span_ms
            and newest.accepted_at_ms - newest.first_timestamp_ms <= span_ms)


def reader_position(checkpoint: Path) -> tuple[int, int]:
    """The watermark of the reader's newest planned micro-batch and the newest accept batch it had taken before
    that micro-batch (-1 before its first)."""
    planned = planned_batches(checkpoint)
    if not planned:
        return 0, -1
    info = batch_info(checkpoint, planned[-1])
    before = accepted_log.newest_batch_read(checkpoint, int(info.start_offsets.get("logOffset", -1)))
    return info.watermark_ms, -1 if before is None else before


@dataclass(frozen=True)
class Pending:
    """Where a round starts: what the reader has taken, and the accept batches it has not."""

    committed: int
    """The newest accept batch of the reader's newest committed micro-batch (-1 before its first)."""
    watermark_ms: int
    """The watermark of the reader's newest planned micro-batch."""
    taken: int
    """The newest accept batch the reader had taken before that micro-batch (at most ``committed``)."""
    published: list[BatchMeta]
    """The published accept batches after ``taken``, up to the round's newest, oldest first."""
    batches: list[int]
    """The round's accept batches the reader has not taken."""


class AcceptRounds(Generic[T]):
    """A thread that writes a round over the accept batches :meth:`submit` names, taking together those published
    while it was busy, so ``accept``'s next batch never waits for it. A round reads what it needs of each pending
    batch once (:meth:`read`), and writes (:meth:`round`) only while it is worth its cost (:meth:`pending`)."""

    name = "provisional"

    def __init__(self, config: Config, checkpoint: Path) -> None:
        self.config = config
        self.checkpoint = checkpoint
        """The reader's checkpoint: what it has taken."""
        self._kept: dict[int, T] = {}
        self._submitted: list[int] = []
        self._ready = threading.Condition()

    def submit(self, batch_id: int) -> None:
        """Accept batch ``batch_id`` is published: its round is due."""
        with self._ready:
            self._submitted.append(batch_id)
            self._ready.notify()

    def run_while(self, active: Callable[[], bool]) -> None:
        """Start the thread, for as long as ``active()`` (the ``accept`` query runs)."""
        def work() -> None:
            while active():
                with self._ready:
                    self._ready.wait_for(lambda: self._submitted, timeout=self.config.stream.accept_interval)
                    batches, self._submitted = self._submitted, []
                if batches:
                    try:
                        self.write(batches)
                    except Exception:   # the reader writes these rows all the same; say why these could not
                        log.exception("%s rows of accept batches %s failed", self.name, batches)

        threading.Thread(target=work, name=self.name.replace("_", "-"), daemon=True).start()

    def write(self, batches: list[int]) -> object | None:
        """Write the round of published accept ``batches``; None when there was nothing to write
        (:meth:`pending`) or :meth:`round` wrote none."""
        with timed(ACCEPT_QUERY, self.name):
            start = self.pending(batches)
            if start is None:
                return None
            with timed(ACCEPT_QUERY, f"{self.name}.read"):
                pending = {m.batch_id: self._kept[m.batch_id] if m.batch_id in self._kept else self.read(m.batch_id)
                           for m in start.published}
            self._kept.update(pending)
            for gone in [b for b in self._kept if b <= start.taken]:
                del self._kept[gone]
            return self.round(start, pending)

    def forget_reads(self) -> None:
        """Read every pending batch again at the next round (what :meth:`read` returns depends on state it dropped)."""
        self._kept.clear()

    def pending(self, batches: list[int]) -> Pending | None:
        """Where the round of ``batches`` starts; None when it has nothing to write: the reader took them all, or
        one is not published, or it is not worth its cost (:func:`worth_writing`)."""
        committed = accepted_log.last_read(self.checkpoint)   # before the store is read: the reader writes, then
        committed = -1 if committed is None else committed    # commits
        watermark_ms, taken = reader_position(self.checkpoint)
        taken = min(taken, committed)
        newest = max(batches)
        published = [m for m in accepted_log.metas(self.config) if taken < m.batch_id <= newest]
        batches = [b for b in batches if b > taken]   # the reader's own rows cover the others
        if not batches or not {m.batch_id for m in published}.issuperset(batches):
            return None
        if not worth_writing(published, self.config):
            return None
        return Pending(committed, watermark_ms, taken, published, batches)

    def bound_ms(self, start: Pending, newest_event_ms: Iterable[int | None]) -> int:
        """:func:`watermark_bound_ms` for a round: the reader's watermark and the latest corrected event time of
        the pending batches (``newest_event_ms``, None for a batch without events)."""
        newest = max((t for t in newest_event_ms if t is not None), default=None)
        return watermark_bound_ms(start.watermark_ms, newest, self.config)

    def read(self, batch_id: int) -> T:
        """What a round needs of published accept batch ``batch_id``."""
        raise NotImplementedError

    def round(self, start: Pending, pending: dict[int, T]) -> object | None:
        """Write the round that ``start`` describes, ``pending`` holding :meth:`read` of each published batch the
        reader has not taken."""
        raise NotImplementedError
