"""The progress the job records per query (``analytics.progress``): what the dashboard's freshness line reads.

Given events and then none, the job is up to date, not stale: while a query waits for new data, its newest batch's
row is stored again with the time Spark found it idle, so "data as of" moves on with the clock.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from analytics.job import QUERIES, start_queries
from store.client import connect
from store.pipeline import last_batches
from tests.support.pipeline import Metric, minute_in_past, produce, wait_until
from tests.support.stack import fresh_stack

pytestmark = pytest.mark.integration

TRIGGER_S = 1.0


IDLE_S = 5.0   # well past a batch's end, which is when a row is recorded without the idle reports


def idle_for(config) -> dict[str, float]:
    """Per query: seconds from the end of its newest stored batch to when its newest row was recorded."""
    with connect(config) as client:
        rows = client.query(
            "SELECT query_name, dateDiff('millisecond', max(batch_timestamp + toIntervalMillisecond(duration_ms)), "
            "max(recorded_at)) FROM pipeline_progress GROUP BY query_name").result_rows
    return {name: ms / 1000 for name, ms in rows}


def test_an_idle_query_stores_its_newest_batch_again_so_its_data_reads_as_of_now(kafka, spark):
    config = fresh_stack(kafka, "idle_progress", trigger_interval_s=TRIGGER_S, accepted_poll_interval_s=0.5)
    start = minute_in_past(5)
    produce(config, [Metric(at=start + i * 100, value=float(i)) for i in range(20)])
    queries = start_queries(spark, config)
    try:
        # Every query takes the events, then nothing more is sent: each goes idle, and its newest batch's row is
        # recorded again, later than that batch's end.
        wait_until(lambda: set(idle_for(config)) == set(QUERIES), timeout_s=120)
        wait_until(lambda: all(s >= IDLE_S for s in idle_for(config).values()), timeout_s=60)
        with connect(config) as client:
            seen = last_batches(client)
            newest = dict(client.query("SELECT query_name, max(batch_id) FROM pipeline_progress "
                                       "GROUP BY query_name").result_rows)
            again = dict(client.query(
                "SELECT query_name, argMax(batch_id, recorded_at) FROM pipeline_progress GROUP BY query_name"
            ).result_rows)
        assert again == newest, "the row recorded while idle is the newest batch's, not a new batch"
        assert all((datetime.now(UTC) - at).total_seconds() < IDLE_S for at in seen.values()), \
            f"an idle query reads as of now, not as of its last batch: {seen}"
    finally:
        for query in queries:
            query.stop()
