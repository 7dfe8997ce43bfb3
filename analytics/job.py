"""The stream job: Kafka (official spark-sql-kafka-0-10 connector) -> validate, deduplicate -> windows -> ClickHouse.

One Spark session runs three streaming queries (see ``start_queries``), each with its own checkpoint under
``<checkpoint_dir>/<query name>``: ``accept`` reads Kafka and hands its accepted events to the two stateful
queries through the accepted-events log (``analytics.accepted_log``). Locally it runs ``local[*]``; on a
cluster the same module runs under ``spark-submit`` (``python -m analytics.job``) with ``stream.master`` pointing
at the cluster.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType

from analytics import accepted_log, progress, reader_batches
from analytics.accept import validation
from analytics.accept.writer import accept_writer
from analytics.data_loss import count_data_loss
from analytics.disk_full import failure_message, reports_disk_full, stop_on_disk_full
from analytics.keyed import rows as keyed_rows
from analytics.keyed import runs as session_runs
from analytics.keyed.layout import session_layout
from analytics.keyed.provisional import ProvisionalSessions
from analytics.keyed.query import keyed_windows
from analytics.keyed.writer import keyed_windows_writer
from analytics.rounds import AcceptRounds
from analytics.sinks import BatchWriter
from analytics.spark import checkpoint as spark_checkpoint
from analytics.spark import settings as spark_settings
from analytics.spark.checkpoint import Offsets
from analytics.spark.listener import start_callback_server, wait_for_listeners
from analytics.vocabulary import ACCEPT_QUERY, KEYED_WINDOWS_QUERY, WINDOWS_QUERY
from analytics.windows import partials as window_partials
from analytics.windows.provisional import ProvisionalWindows
from analytics.windows.query import aggregate
from analytics.windows.writer import window_writer
from eventide import jars
from eventide.config import Config, ConfigError, load_config

log = logging.getLogger(__name__)

LISTENER_DRAIN_S = 60.0
"""Longest wait for the progress listener to store the last progress reports of a drained run."""


def spark_session(config: Config, app_name: str = "eventide-stream") -> SparkSession:
    """A Spark session with the Kafka connector on the classpath and settings sized for streaming."""
    # Python workers (pandas-based operators) must use this interpreter, which has pandas and pyarrow.
    spark_settings.use_job_python_for_spark()
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark_settings.use_jemalloc_for_arrow()
    connector = ",".join(str(j) for j in jars.spark_kafka_connector_jars(config))
    local_dir = config.data_dir / "spark-tmp"
    local_dir.mkdir(parents=True, exist_ok=True)
    builder = SparkSession.builder
    for key, value in spark_settings.JOB_SETTINGS.items():
        builder = builder.config(key, value)
    spark = (
        builder.appName(app_name)
        .master(config.stream.master)
        .config("spark.jars", connector)
        .config("spark.driver.memory", config.stream.driver_memory)
        .config("spark.driver.extraJavaOptions", spark_settings.JVM_OPTIONS)
        .config("spark.local.dir", str(local_dir))
        .config("spark.sql.shuffle.partitions", str(config.stream.partitions))
        .config("spark.sql.warehouse.dir", str(config.data_dir / "spark-warehouse"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    # Nothing in the job holds 1024 descriptors any more (chDB is no longer opened in-process), but py4j's
    # callback server started first keeps a low one whatever the process opens later.
    start_callback_server(spark)
    return spark


def kafka_records(spark: SparkSession, config: Config) -> DataFrame:
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", config.kafka.bootstrap)
        .option("subscribe", config.kafka.events_topic)
        .option("startingOffsets", config.stream.starting_offsets)
        .option("maxOffsetsPerTrigger", config.stream.max_offsets_per_trigger)
        # The HTTP gateway writes in transactions; records of aborted ones must never be counted.
        .option("kafka.isolation.level", "read_committed")
        # Retention may delete records a stopped or lagging job never read. They are gone whether the job stops or
        # not, so it reads on, and the accept writer records each skipped range in kafka_data_loss
        # (``count_data_loss``) instead of leaving only Spark's log line.
        .option("failOnDataLoss", "false")
        .load()
    )


QUERIES = (ACCEPT_QUERY, WINDOWS_QUERY, KEYED_WINDOWS_QUERY)


def start_queries(spark: SparkSession, config: Config, trigger: dict[str, Any] | None = None,
                  only: Collection[str] = QUERIES) -> list[StreamingQuery]:
    """Start the queries of the job (every one, or those named in ``only``). ``trigger`` defaults to
    processing-time triggers: ``accept`` every ``stream.accept_interval_s``, the two readers polling for their next
    reader batch (``analytics.reader_batches``) every ``stream.accepted_poll_interval_s``; tests pass
    ``{"availableNow": True}`` to process what is in Kafka and stop (every accept batch then a reader batch).

    - ``accept``: reads the events topic; validates (dead letters), deduplicates by id (duplicates), records
      each device's clock offset, and publishes the accepted events to the accepted-events log
    - ``windows``: tumbling and hopping aggregates (update mode: early results, then corrections) + stragglers,
      merged from the window partials ``accept`` publishes with each batch (``analytics.windows.partials``)
    - ``keyed_windows``: sliding windows and sessions + their stragglers (append: each written once, final)

    The last two read what ``accept`` publishes (``windows`` its window partials, ``keyed_windows`` its events), one
    reader batch per micro-batch.
    """
    unknown = set(only) - set(QUERIES)
    if unknown:
        raise ValueError(f"unknown queries {sorted(unknown)}; the job has {list(QUERIES)}")
    recorder = progress.progress_recorder(spark)
    live = trigger is None
    grouped = live and config.stream.accept_interval < config.stream.trigger_interval_s
    # Between reader batches, each accept batch moves the windows and the sessions its events touched
    # (analytics.windows.provisional, analytics.keyed.provisional), each on a thread of its own.
    rounds: list[AcceptRounds] = [
        *([ProvisionalWindows(config)] if grouped and config.stream.provisional_windows else []),
        *([ProvisionalSessions(config)] if grouped and config.stream.provisional_sessions else []),
    ]
    # How often Spark reports a query idle (default 10 s): every trigger interval, so the recorder re-stores an idle
    # query's newest row (analytics.progress) well within the dashboard's stale threshold.
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval",
                   str(round(config.stream.trigger_interval_s * 1000)))
    plans: list[tuple[str, Callable[[], DataFrame], str, BatchWriter]] = [
        (ACCEPT_QUERY, lambda: validation.parse(kafka_records(spark, config), config), "append",
         accept_writer(config, live, _submit_to(rounds) if rounds else None)),
        (WINDOWS_QUERY, lambda: aggregate(accepted_log.read_partials_stream(
            spark, config, from_arrow_schema(window_partials.SCHEMA)), config), "update", window_writer(config)),
        (KEYED_WINDOWS_QUERY, lambda: keyed_windows(accepted_events(spark, config), config, session_layout(
            config.checkpoint_dir / KEYED_WINDOWS_QUERY, config.stream.session_buckets)), "append",
         keyed_windows_writer(config)),
    ]
    queries = []
    for name, frame, mode, writer in plans:
        if name not in only:
            continue
        checkpoint = config.checkpoint_dir / name
        writer = stop_on_disk_full(config, name, count_data_loss(config, checkpoint, writer)
                                   if name == ACCEPT_QUERY else writer)
        reads_log = name != ACCEPT_QUERY
        # The readers poll for accept's next file more often than accept reads Kafka: with one common trigger
        # every accepted batch would wait a whole interval before its windows (docs/architecture.md, "Freshness").
        interval = (min(config.stream.accepted_poll_interval_s, config.stream.trigger_interval_s) if reads_log
                    else config.stream.accept_interval)
        if reads_log:
            forgotten = spark_checkpoint.forget_unplanned_files(checkpoint)
            if forgotten:
                log.info("%s: file-source log batches %s were chosen but never planned (a crash in between); "
                         "forgotten, so each micro-batch reads one accept batch", name, forgotten)
        query = (
            frame().writeStream
            .queryName(name)
            .outputMode(mode)
            .foreachBatch(writer)
            .option("checkpointLocation", str(checkpoint))
            .trigger(**(trigger or {"processingTime": f"{interval} seconds"}))
            .start()
        )
        recorder.track(query, config, _kafka_offsets(config, checkpoint) if reads_log else None)
        queries.append(query)
        if name == ACCEPT_QUERY and grouped:
            _hand_over_when_idle(config, query)
        if name == ACCEPT_QUERY:
            for provisional in rounds:
                provisional.run_while(lambda query=query: query.isActive)
    return queries


def _submit_to(rounds: list[AcceptRounds]) -> Callable[[int], None]:
    """What ``accept``'s writer calls once it has published a batch: each round's thread takes it."""
    def submit(batch_id: int) -> None:
        for provisional in rounds:
            provisional.submit(batch_id)
    return submit


def _hand_over_when_idle(config: Config, accept: StreamingQuery) -> None:
    """While ``accept`` runs, hand its pending batches to the readers once they have waited a whole
    ``stream.trigger_interval_s`` even when no new accept batch comes (Spark runs none without new records), so the
    last events before a pause reach the windows."""
    due = reader_batches.due_when_idle(config)

    def hand_over() -> None:
        while accept.isActive:
            time.sleep(config.stream.accept_interval)
            try:
                reader_batches.hand_over(config, int(time.time() * 1000), due)
            except Exception:   # the next accept batch hands over all the same; say why this one could not
                log.exception("handing accept's batches to the readers failed")

    threading.Thread(target=hand_over, name="hand-over-when-idle", daemon=True).start()


def accepted_events(spark: SparkSession, config: Config) -> DataFrame:
    """The accepted-events log as a stream: the accepted events' columns, the session-run columns ``accept`` marks
    (``analytics.keyed.runs``) and the keyed-rows marks (``analytics.keyed.rows``)."""
    return accepted_log.read_stream(spark, config, with_arrow_fields(
        validation.accepted_schema(spark, config), session_runs.RUN_FIELDS, keyed_rows.FIELDS))


def with_arrow_fields(schema: StructType, *fields: dict[str, pa.DataType]) -> StructType:
    """``schema`` followed by the Arrow ``fields`` (name -> type) as Spark fields."""
    return StructType([*schema.fields, *[f for extra in fields for f in from_arrow_schema(pa.schema(extra)).fields]])


def _kafka_offsets(config: Config, checkpoint: Path) -> progress.SourceOffsets:
    def offsets(end_offset: str) -> Offsets:
        log_offset = int(json.loads(end_offset).get("logOffset", -1))
        return accepted_log.kafka_offsets_reached(config, checkpoint, log_offset)
    return offsets


def run_until_idle(spark: SparkSession, config: Config, only: Collection[str] = QUERIES) -> list[StreamingQuery]:
    """Process everything currently in Kafka (in as many micro-batches as the rate limit needs), then stop: the
    ``accept`` query first, then the queries reading what it accepted."""
    first = [q for q in only if q == ACCEPT_QUERY]
    then = [q for q in only if q != ACCEPT_QUERY]
    queries = []
    for stage in (first, then):
        if not stage:
            continue
        started = start_queries(spark, config, {"availableNow": True}, stage)
        for query in started:
            try:
                query.awaitTermination()
            except StreamingQueryException as exc:
                if reports_disk_full(str(exc)):   # one clear line, not Spark's trace
                    raise RuntimeError(failure_message(config, query.name, str(exc))) from exc
                raise
            if query.exception() is not None:
                raise RuntimeError(failure_message(config, query.name, str(query.exception())))
        queries += started
    # Spark hands progress to listeners asynchronously: wait until the recorder has stored every query's last
    # watermark (the finality clock), since callers read the store next.
    wait_for_listeners(spark, LISTENER_DRAIN_S)
    return queries


def run(config: Config) -> None:
    """Run the job until one of its queries fails or the process is stopped."""
    spark = spark_session(config)
    queries = start_queries(spark, config)
    log.info("started queries %s", [q.name for q in queries])
    try:
        # Polled, so that Ctrl-C (KeyboardInterrupt) is not held up by a blocking JVM call.
        while not spark.streams.awaitAnyTermination(config.stream.accept_interval):
            pass
    except StreamingQueryException as exc:
        if not reports_disk_full(str(exc)):
            raise
        # A full disk: said in one line below (failure_message), not as Spark's trace.
    finally:
        for query in queries:
            if query.isActive:
                query.stop()
    failed = [q for q in queries if q.exception() is not None]
    if failed:
        raise SystemExit(failure_message(config, failed[0].name, str(failed[0].exception())))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", help="config file (default: $EVENTIDE_CONFIG or ./eventide.toml)")
    parser.add_argument("--until-idle", action="store_true", help="process what is in Kafka, then exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # logs every callback from the JVM at INFO
    try:
        config = load_config(args.config)
        if args.until_idle:
            run_until_idle(spark_session(config), config)
        else:
            run(config)
    except ConfigError as exc:   # e.g. a setting the checkpoints cannot take: one line naming it, no trace
        raise SystemExit(f"configuration error: {exc}") from None


if __name__ == "__main__":
    main()
