"""Writing to ClickHouse from the stream job's ``foreachBatch`` writers: one insert path with retries while the
store is away, the per-stage timings the benchmark reads, and small Arrow helpers the writers share.

Writes are idempotent, which with Spark's checkpoints gives an exactly-once effect: every table is keyed (window
rows by window and series, versioned by batch id; stragglers and dead letters by their event's Kafka position;
sessions by key and start), or, for ``logs``, deduplicated by the insert itself. A micro-batch replayed after a crash
rewrites identical rows and changes nothing. The writers live with their stage: ``analytics.accept.writer``,
``analytics.windows.writer``, ``analytics.keyed.writer``.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from clickhouse_connect.driver.exceptions import OperationalError
from pyspark.sql import DataFrame

from eventide.config import Config
from store.client import StoreUnavailable, connect, redact

log = logging.getLogger(__name__)

BatchWriter = Callable[[DataFrame, int], None]
STORE_RETRY_FIRST_S, STORE_RETRY_MAX_S = 1.0, 10.0   # pauses between write attempts while the store is away

# Seconds spent per micro-batch in each sink stage, by (query, stage), in this driver process: read by the
# benchmark (bench/pipeline.py) for its per-stage breakdown and logged at DEBUG.
sink_seconds: dict[tuple[str, str], list[float]] = defaultdict(list)


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
