"""A reader of the accepted-events log polls it every ``stream.accepted_poll_interval_s``, and an idle poll is one
listing of the log in the driver. The log keeps a directory per ``accept`` batch for an hour: listed as a Spark job
(Spark's default past 32 directories), each poll was a job of a task per directory, and the readers fell further
behind as the log grew (docs/performance.md, "The readers' listing of the accepted log")."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from analytics import accepted_log
from eventide.config import Config

pytestmark = pytest.mark.integration

BATCHES = 60
"""Published batches in the log: more than the 32 directories past which Spark lists with a job by default."""


def published_log(config: Config, batches: int) -> Path:
    """``batches`` reader batches of the accepted-events log, one file per events-topic partition each."""
    root = config.reader_events_dir
    table = pa.table({"x": pa.array([1, 2, 3], pa.int64())})
    for batch in range(batches):
        directory = accepted_log.batch_dir(root, batch)
        directory.mkdir(parents=True)
        for partition in range(config.kafka.events_partitions):
            pq.write_table(table, directory / f"{partition:05d}.parquet")
    return root


def test_an_idle_readers_polls_list_the_log_without_a_spark_job(spark, stack: Config):
    # Given a log of 60 published batches that a reader (polling every 0.2 s) has read to its end,
    published_log(stack, BATCHES)
    stream = accepted_log.read_stream(spark, stack, StructType([StructField("x", LongType())]))
    query = (stream.writeStream.format("noop").option("checkpointLocation", str(stack.checkpoint_dir / "polls"))
             .trigger(processingTime="0.2 seconds").start())
    try:
        deadline = time.monotonic() + 180
        while sum(p["numInputRows"] for p in query.recentProgress) < 3 * BATCHES * stack.kafka.events_partitions:
            assert time.monotonic() < deadline, "the reader did not read the log"
            time.sleep(0.5)
        time.sleep(1)
        # when it polls for new batches for 3 s (about 15 polls, each a listing of the whole log),
        tracker = spark.sparkContext.statusTracker()
        jobs_before = set(tracker.getJobIdsForGroup(str(query.runId)))
        time.sleep(3)
        # then none of its polls ran a Spark job.
        assert query.isActive
        assert set(tracker.getJobIdsForGroup(str(query.runId))) - jobs_before == set()
    finally:
        query.stop()
