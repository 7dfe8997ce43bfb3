"""How often ``accept`` reads Kafka on a live job: every ``stream.accept_interval_s`` while the stream is light, every
``stream.accept_busy_interval_s`` once it carries ``stream.accept_busy_rate`` events a second or more.

Each ``accept`` batch costs the machine about the same whatever it holds (Spark's planning, a task per partition, a
round of provisional rows, a dozen small store inserts). On a light stream the machine has room for that cost once a
second, and log lines and window rows move every second; on a busy one the same cost competes with the events'
own work, so ``accept`` takes a batch less often and each holds more events (docs/performance.md, "Accept paced by
the rate"). Spark cannot change a running query's trigger, so a batch of a busy stream returns from its writer
only when the next one is due: everything the batch publishes (files, log lines, provisional rows) is published
before that wait; Spark's bookkeeping of the batch (its commit and progress report) comes after it. A batch that
returns past its trigger's next tick is followed at once by the next (Spark logs it as "falling behind", which
``analytics/spark/log4j2.properties`` keeps out of the log), so a busy stream's batches begin about
``accept_busy_interval_s`` apart, plus Spark's planning of each."""

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
        writer returns: 0 on a light stream or once it has run ``busy_interval_s``, else the rest of that."""
        rate = self.rate(started, records)
        if rate is None or rate < self.busy_rate or self.busy_interval_s <= self.interval_s:
            return 0.0
        return max(0.0, started + self.busy_interval_s - now)
