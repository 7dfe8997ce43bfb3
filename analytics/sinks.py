"""Writing to ClickHouse from the stream job's writers, in the driver's ``foreachBatch`` functions and in Spark's
tasks (``insert_in_tasks``): one insert path with retries while the store is away, the per-stage timings the
benchmark reads, and small Arrow helpers the writers share.

Writes are idempotent, which with Spark's checkpoints gives an exactly-once effect: every table is keyed (window
rows by window and series, versioned by batch id; stragglers and dead letters by their event's Kafka position;
sessions by key and start), or, for ``logs``, deduplicated by the insert itself. A micro-batch replayed after a crash
rewrites identical rows and changes nothing. The writers live with their stage: ``analytics.accept.writer``,
``analytics.windows.writer``, ``analytics.keyed.writer``.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pyarrow as pa
from clickhouse_connect.driver.exceptions import OperationalError
from pyspark.sql import DataFrame

from eventide.config import Config
from store.client import StoreUnavailable, connect, redact

log = logging.getLogger(__name__)

BatchWriter = Callable[[DataFrame, int], None]
STORE_RETRY_FIRST_S, STORE_RETRY_MAX_S = 1.0, 10.0   # pauses between write attempts while the store is away

TIMINGS_KEPT = 20_000
"""How many of the newest micro-batches' timings each stage keeps: a job runs for months, a benchmark's phase for a
few thousand batches at most."""

# Seconds spent per micro-batch in each sink stage, by (query, stage), in this driver process: read by the
# benchmark (bench/pipeline.py) for its per-stage breakdown and logged at DEBUG.
sink_seconds: dict[tuple[str, str], deque[float]] = defaultdict(lambda: deque(maxlen=TIMINGS_KEPT))

K = TypeVar("K")
V = TypeVar("V")


class Newest(dict[K, V]):
    """A dict of at most ``kept`` entries, the newest (by first insertion): a driver's record of recent batches for
    the benchmark, bounded in a job that runs for months."""

    def __init__(self, kept: int) -> None:
        super().__init__()
        self.kept = kept

    def note(self, key: K, value: V) -> None:
        """Set ``key``, then forget the oldest entries beyond ``kept``."""
        self[key] = value
        while len(self) > self.kept:
            del self[next(iter(self))]


@contextmanager
def timed(query: str, stage: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        sink_seconds[(query, stage)].append(elapsed)
        log.debug("%s %s took %.3f s", query, stage, elapsed)


def insert_tables(config: Config, rows: list[tuple[str, pa.Table]], query: str) -> None:
    """Insert each (table, rows) pair with one client (nothing if every one is empty).

    An unreachable store (stopped, restarting, network) does not fail the query: the micro-batch waits and
    retries for up to ``store.write_retry_s``, saying so in the log. Nothing is lost meanwhile: Spark commits the
    batch only once this returns, and every table is keyed, so rows a failed attempt already wrote are replaced by
    the same rows. Errors the store answers (bad SQL, schema) fail at once."""
    rows = [(table, data) for table, data in rows if data.num_rows]
    if not rows:
        return
    deadline = time.monotonic() + config.store.write_retry_s
    pause = STORE_RETRY_FIRST_S
    while True:
        try:
            with timed(query, "store_write"), connect(config) as client:
                for table, data in rows:
                    client.insert_arrow(table, data)
            return
        except (StoreUnavailable, OperationalError) as exc:
            if time.monotonic() + pause > deadline:
                raise StoreUnavailable(f"{query}: the store at {redact(config.store_url)} stayed unreachable for "
                                       f"{config.store.write_retry_s:g} s (store.write_retry_s): {exc}") from exc
            log.warning("%s: store unreachable at %s (%s); the micro-batch waits and retries in %g s",
                        query, redact(config.store_url), str(exc).splitlines()[0][:200], pause)
            time.sleep(pause)
            pause = min(pause * 2, STORE_RETRY_MAX_S)


def with_constants(table: pa.Table, **extra: Any) -> pa.Table:
    """``table`` with a constant column per ``extra`` item."""
    for name, value in extra.items():
        table = table.append_column(name, pa.array([value] * table.num_rows))
    return table


def renamed(table: pa.Table, names: dict[str, str]) -> pa.Table:
    """``table`` with the columns named in ``names`` renamed."""
    return table.rename_columns([names.get(c, c) for c in table.column_names])


# Writing from Spark's tasks --------------------------------------------------------------------------------------
# A reader's rows (window rows, sliding windows, sessions, stragglers) scale with its events; brought to the driver
# they make the one driver the limit of the job however many executors it has (issue 40). So its tasks insert
# them, each its own partition's, and send the driver only a few numbers. Retried tasks and replayed batches are
# harmless: every table is keyed and versioned by batch id (module docstring), so the same rows written twice are
# one write.

TASK_REPORT = pa.schema([("table", pa.string()), ("rows", pa.int64()), ("result", pa.binary()),
                         ("message", pa.string())])
"""What a writing task sends back: a row per table it wrote (``rows`` written); when it has one, a row whose
``result`` is a small Arrow table (IPC stream) for the driver to merge; a row per warning :func:`insert_tables`
logged in the task (``message``: the store was away and the task waited), for the driver's log."""
TASK_REPORT_DDL = "`table` string, rows long, result binary, message string"
""":data:`TASK_REPORT` as Spark's schema string."""


class TaskWriter:
    """A ``mapInArrow`` function (its output schema :data:`TASK_REPORT`) inserting its partition's rows from the
    task: :meth:`tables` maps the partition's rows to (table, rows) pairs, and optionally a small table for the
    driver; they are inserted with :func:`insert_tables` and reported. Picklable (the ``Config`` and plain values):
    every constant a row carries (``version``, ``written_at``) is chosen once in the driver and set on the writer,
    so every task, and every retry of one, writes the same rows."""

    def __init__(self, config: Config, query: str) -> None:
        self.config = config
        self.query = query

    def tables(self, rows: pa.Table) -> tuple[list[tuple[str, pa.Table]], pa.Table | None]:
        raise NotImplementedError

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        received = list(batches)
        if not received or not sum(b.num_rows for b in received):
            return   # an empty partition (a reader's state partition without output this batch) reports nothing
        tables, result = self.tables(pa.Table.from_batches(received))
        with warnings_kept() as warnings:
            insert_tables(self.config, tables, self.query)
        yield task_report(tables, result, warnings)


class _Kept(logging.Handler):
    """Keeps the messages of the records it handles, and lets them through to the process's own output."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        if not logging.getLogger().handlers:   # a bare Python worker: still on its stderr (the executor's log)
            logging.lastResort.handle(record)   # type: ignore[union-attr]


@contextmanager
def warnings_kept() -> Iterator[list[str]]:
    """The warnings this module logs meanwhile (a task waiting for the store), to be reported to the driver: a task's
    log is the executor's, and the driver's log is where an operator, and the fault tests, look."""
    kept = _Kept()
    log.addHandler(kept)
    try:
        yield kept.messages
    finally:
        log.removeHandler(kept)


def task_report(tables: list[tuple[str, pa.Table]], result: pa.Table | None = None,
                warnings: list[str] | None = None) -> pa.RecordBatch:
    """A task's :data:`TASK_REPORT` rows for the ``tables`` it inserted, its ``result`` for the driver and the
    ``warnings`` it logged."""
    rows: list[tuple[str | None, int, bytes | None, str | None]] = [
        (table, data.num_rows, None, None) for table, data in tables if data.num_rows]
    if result is not None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, result.schema) as stream:
            stream.write_table(result)
        rows.append((None, 0, sink.getvalue().to_pybytes(), None))
    rows += [(None, 0, None, message) for message in warnings or []]
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(TASK_REPORT)
    return pa.RecordBatch.from_arrays([pa.array(column, field.type) for column, field in zip(
        columns, TASK_REPORT, strict=True)], schema=TASK_REPORT)


def insert_in_tasks(frames: list[DataFrame], writers: list[TaskWriter]) -> tuple[dict[str, int], list[pa.Table]]:
    """Run each frame through its writer (``mapInArrow``) and all of them as one Spark job (a union, collected:
    every Spark job costs a fixed overhead per micro-batch, docs/performance.md#one-spark-job-per-accept-batch).
    Returns the rows written per table and the tasks' results, for the driver to merge; the tasks' warnings are
    logged here, once the job is done."""
    written = [frame.mapInArrow(writer, TASK_REPORT_DDL) for frame, writer in zip(frames, writers, strict=True)]
    job = written[0]
    for other in written[1:]:
        job = job.union(other)
    reports = job.toArrow()
    rows: dict[str, int] = defaultdict(int)
    results = []
    for table, count, result, message in zip(*(reports[c].to_pylist() for c in TASK_REPORT.names), strict=True):
        if table is not None:
            rows[table] += count
        if result is not None:
            results.append(pa.ipc.open_stream(result).read_all())
        if message is not None:
            log.warning("%s (in a writing task)", message)
    return dict(rows), results
