"""What some of the driver's per-batch steps cost on their own, in one Spark session (no broker, no store).

Every micro-batch makes the driver plan its queries' plans again and generate their code, and each writer builds its
Spark job in Python through py4j (docs/performance.md#the-drivers-work-per-batch). This probe times those steps over
a small batch DataFrame of the Kafka source's schema, a new Dataset each time as a micro-batch has:

- ``accept_planning``: ``accept``'s validation and hand-over projection planned (``executedPlan``), ms per batch
- ``accept_codegen``: its whole-stage code generated (``toRdd``; the compiled class comes from Spark's cache after
  the first time, as in a running job), ms per batch
- ``writer_job``: a writer's ``select`` of the window rows and its ``mapInArrow`` (the Spark job a reader's batch
  builds in the driver), wall ms and the driver Python's CPU ms per call

Prints JSON: per step the median over ``--repeat`` calls after ``--warmup`` calls.

    .venv/bin/python -m bench.probes.driver_batch_work
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.harness import bench_config, emit
from eventide.config import Config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=40)
    # The JIT compiles Spark's planner and code generator over the first dozens of calls, as in a job's first batches.
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    config = bench_config()   # a new data directory: Spark's temporary files, removed at the end
    try:
        out = _measure(args, config)
    finally:
        shutil.rmtree(config.data_dir, ignore_errors=True)
    emit(out, args.out)


def _measure(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from analytics.accept import validation
    from analytics.accept.writer import accept_projection
    from analytics.job import spark_session
    from analytics.sinks import TASK_REPORT_DDL
    from analytics.windows.writer import WINDOW_COLUMNS, WindowRows, window_rows

    spark = spark_session(config, "driver-batch-work")
    try:
        # Computed per row, so the optimizer cannot fold the projection into a constant relation.
        records = spark.range(0, 1000, 1, 4).select(
            F.lit(None).cast("binary").alias("key"),
            F.concat(F.lit('{"v":1,"id":"'), F.col("id").cast("string"), F.lit('"}')).cast("binary").alias("value"),
            F.lit(config.kafka.events_topic).alias("topic"), (F.col("id") % 4).cast("int").alias("partition"),
            F.col("id").alias("offset"), F.current_timestamp().alias("timestamp"), F.lit(0).alias("timestampType"))
        parsed = validation.parse(records, config)
        accepted_columns = validation.accepted_schema(spark, config).fieldNames()
        planning: list[float] = []
        codegen: list[float] = []
        for i in range(args.warmup + args.repeat):
            execution = accept_projection(parsed, accepted_columns, config.envelope.max_record_bytes)._jdf \
                .queryExecution()
            start = time.perf_counter()
            execution.executedPlan()
            planned = time.perf_counter()
            execution.toRdd()
            if i >= args.warmup:
                planning.append(planned - start)
                codegen.append(time.perf_counter() - planned)

        windows = spark.range(10).select(*[F.lit(None).cast("string").alias(c) for c in WINDOW_COLUMNS])
        writer = WindowRows(config, 1, datetime.now(UTC))
        wall, cpu = _timed(lambda: window_rows(windows).mapInArrow(writer, TASK_REPORT_DDL),
                           args.warmup, args.repeat)
        return {"repeat": args.repeat,
                "accept_planning_ms": _ms(planning), "accept_codegen_ms": _ms(codegen),
                "writer_job_ms": _ms(wall), "writer_job_python_cpu_ms": _ms(cpu)}
    finally:
        spark.stop()


def _timed(call: Callable[[], Any], warmup: int, repeat: int) -> tuple[list[float], list[float]]:
    """Wall and this process's CPU seconds of each of ``repeat`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        call()
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        call()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


def _ms(seconds: list[float]) -> float:
    return round(1000 * statistics.median(seconds), 1)


if __name__ == "__main__":
    main()
