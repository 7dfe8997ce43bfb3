"""How often ``accept`` reads Kafka on a live job: every ``stream.accept_interval_s`` while the stream is light, every
``stream.accept_busy_interval_s`` once it carries ``stream.accept_busy_rate`` events a second or more.

Each ``accept`` batch costs the machine about the same whatever it holds (Spark's planning, a task per partition, a
round of provisional rows, a dozen small store inserts). On a light stream the machine has room for that cost once a
second, and log lines and window rows move every second; on a busy one the same cost competes with the events'
own work, so ``accept`` takes a batch less often and each holds more events (docs/performance.md, "Accept paced by
the rate"). Spark cannot change a running query's trigger, so a batch of a busy stream returns from its writer
only when the next one is due: everything the batch publishes (files, log lines, provisional rows) is published
before that wait; Spark's bookkeeping of the batch (its commit and progress report) comes after it.

Spark starts a processing-time batch at the first multiple of the trigger interval after the previous returned, so
a busy interval that is not a multiple of ``accept_interval_s`` is rounded up to one."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AcceptPacing:
    """The wait at the end of each live ``accept`` batch. ``hold_s`` is called once per batch, with the monotonic
    time its writer started and the Kafka records it read."""

    interval_s: float
    """``accept``'s trigger interval: the batches of a light stream start this far apart."""
    busy_interval_s: float
    """The batches of a busy stream start about this far apart (at least ``interval_s``)."""
    busy_rate: float
    """Events a second from which the stream is busy: the records of a batch ÷ the time since the previous began."""
    _previous_start: float | None = field(default=None, repr=False)

    def rate(self, started: float, records: int) -> float | None:
        """The stream's rate as this batch saw it, or None for a job's first batch."""
        previous, self._previous_start = self._previous_start, started
        if previous is None or started <= previous:
            return None
        return records / (started - previous)

    def hold_s(self, started: float, records: int, now: float) -> float:
        """Seconds the batch that started at ``started`` and read ``records`` should still wait at ``now`` before its
        writer returns: 0 on a light stream or once it has run long enough, else until ``busy_interval_s`` −
        ``interval_s`` after it started, past the tick before the one ``busy_interval_s`` after its own, so Spark
        starts the next batch at that one."""
        rate = self.rate(started, records)
        if rate is None or rate < self.busy_rate or self.busy_interval_s <= self.interval_s:
            return 0.0
        return max(0.0, started + self.busy_interval_s - self.interval_s - now)
