"""What deduplication adds to one ``accept`` micro-batch, in isolation (issue 12: dedup cost).

On a local Spark session, a cached batch of ``--batch`` events shaped like accepted ones (1 % of them copies):

- ``collect``: the batch brought to the driver as Arrow (the accept query does this with or without dedup);
- ``first_copies``: the driver's choice of first copies against a horizon of ``--horizon-ids`` remembered ids;
- ``publish``: writing the batch's Parquet file as is (dedup off) and without the copies (an Arrow filter).

Dedup's own cost per event = (first_copies + publish without copies - publish as is) / batch. Prints JSON:

    .venv/bin/python -m bench.probes.dedup_cost --batch 150000 --horizon-ids 400000
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analytics.accept import dedup


def batch_of(spark: SparkSession, events: int) -> DataFrame:
    """``events`` rows with the accepted-events shape that matters here (ids, positions, a dozen strings)."""
    return (spark.range(events).repartition(2).select(
        F.lit("events").alias("topic"), (F.col("id") % 2).cast("int").alias("partition"), F.col("id").alias("offset"),
        F.timestamp_millis(F.lit(1_700_000_000_000) + F.col("id")).alias("kafka_timestamp"),
        # 1 % of rows repeat an earlier row's id: the batch's copies
        F.sha2(F.when(F.col("id") % 100 == 99, F.col("id") - 1).otherwise(F.col("id")).cast("string"), 256)
        .substr(1, 36).alias("id"),
        *[F.concat(F.lit(f"c{i}-"), (F.col("id") % 97).cast("string")).alias(f"c{i}") for i in range(10)],
        (F.col("id") % 7).alias("clock_offset_ms"), F.col("id").alias("received_time"), F.lit("app").alias("app"),
        F.concat(F.lit("d"), (F.col("id") % 200).cast("string")).alias("device"),
    )).persist()


def seconds(action: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def one_round(spark: SparkSession, batch: DataFrame, remembered: pa.ChunkedArray) -> dict[str, float]:
    out = tempfile.mkdtemp(prefix="eventide-dedup-cost-")
    try:
        t_collect, rows = seconds(lambda: batch.toArrow())
        t_first, first = seconds(lambda: dedup.first_copies(rows.select(list(dedup.COPY_COLUMNS)), remembered))
        copies = rows.num_rows - pa.compute.sum(first).as_py()
        t_plain, _ = seconds(lambda: pq.write_table(rows, f"{out}/plain.parquet"))
        t_dedup, _ = seconds(lambda: pq.write_table(rows.filter(first), f"{out}/deduplicated.parquet"))
        written = pq.ParquetFile(f"{out}/deduplicated.parquet").metadata.num_rows
        assert written == rows.num_rows - copies, (written, copies)
        return {"collect_s": t_collect, "first_copies_s": t_first, "publish_s": t_plain,
                "publish_without_copies_s": t_dedup, "copies": copies}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=150_000)
    parser.add_argument("--horizon-ids", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spark = (SparkSession.builder.master("local[2]").config("spark.sql.shuffle.partitions", "4")
             .config("spark.driver.memory", "2g").config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    batch = batch_of(spark, args.batch)
    batch.count()
    remembered = pa.chunked_array([pa.array([str(uuid.uuid4()) for _ in range(args.horizon_ids)])])
    rounds = [one_round(spark, batch, remembered) for _ in range(args.rounds)]
    best = {k: min(r[k] for r in rounds) for k in rounds[0]}
    dedup_s = best["first_copies_s"] + max(0.0, best["publish_without_copies_s"] - best["publish_s"])
    print(json.dumps({
        "date": time.strftime("%Y-%m-%d"), "batch": args.batch, "horizon_ids": args.horizon_ids,
        "rounds": rounds, "best_of_rounds": best,
        "dedup_us_per_event": round(dedup_s / args.batch * 1e6, 2),
        "horizon_memory_bytes_per_1m_ids": round(remembered.nbytes / args.horizon_ids * 1e6),
    }, indent=2))
    spark.stop()


if __name__ == "__main__":
    main()
