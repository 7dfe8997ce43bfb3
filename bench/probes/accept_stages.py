"""Where ``accept``'s Spark time goes, stage by stage, on records held in memory (no broker, no store).

The bench's record mix (``bench.harness.records``) is put in a DataFrame of the Kafka source's schema, cached,
and each stage below runs over it as a batch job writing to Spark's ``noop`` sink, adding one step at a time:

- ``scan``: the cached records, nothing computed
- ``string``: the value cast to a string, and its size and UTF-8 check
- ``parse``: + ``try_parse_json``
- ``shape``: + ``schema_of_variant`` of the record (the fast path's shape string)
- ``fields``: + the typed fields cast from the variant (``fields_from_json``: read by a second parse instead;
  ``fields_per_field``: one ``try_variant_get`` per field)
- ``validate``: ``envelope.parse`` as the job runs it (fast path, rules for the rest, clock correction)
- ``collect``: ``accept``'s projection of that brought to the driver as Arrow (what its batch did before its tasks
  did the per-event work)
- ``tasks``: the same projection handed to Python tasks as Arrow (``mapInArrow``, each task only counting its rows:
  what the batch's Spark job costs before the tasks' own work), as the job runs it, with no byte limit per Arrow
  chunk; ``tasks_byte_capped``: with Spark 4.1's default limit of 64 MiB
  (``spark.sql.execution.arrow.maxBytesPerBatch``), checked after every row
  (docs/performance.md#the-arrow-hand-over-to-the-tasks)

Prints JSON: per stage the minimum over ``--repeat`` runs, in seconds and µs per record, and the least CPU of
Spark's JVM (all its threads) per record.

    .venv/bin/python -m bench.probes.accept_stages --events 300000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import REPO, Load, emit, records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--stages", default="scan,string,parse,shape,fields,validate,collect,tasks,tasks_byte_capped")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    # Removed however the run ends (an interrupted run used to leave it behind).
    with tempfile.TemporaryDirectory(prefix="eventide-accept-stages-", ignore_cleanup_errors=True) as data:
        out = _measure(args, Path(data))
    emit(out, args.out)


def _measure(args: argparse.Namespace, data: Path) -> dict[str, Any]:
    """Each stage's best time over ``args.repeat`` runs, in a Spark session whose data directory is ``data``."""
    from pyspark.sql import functions as F

    from analytics.accept import validation as envelope
    from analytics.job import spark_session
    from eventide.config import load_config
    from eventide.envelope import now_ms

    config = load_config(environ={}, root=str(REPO), paths={"data_dir": str(data), "cache_dir": str(REPO / ".cache")})
    spark = spark_session(config, app_name="eventide-accept-stages")
    start = now_ms() - 3_600_000
    rows = [(key, value, "eventide.events", i % 4, i // 4, start + i // 100, 1)
            for i, (key, value, _) in enumerate(records(Load(events=args.events), start))]
    records_df = (spark.createDataFrame(rows, envelope.KAFKA_SOURCE_SCHEMA.replace("timestamp timestamp",
                                                                                  "ts long"))
                  .withColumn("timestamp", F.timestamp_millis("ts")).drop("ts")
                  .repartition(4).cache())
    n = records_df.count()
    limit = config.envelope.max_record_bytes
    text = F.col("value").cast("string")
    string = records_df.select("*", F.octet_length("value").alias("_size"), F.is_valid_utf8(text).alias("_utf8"))
    parsed = string.select("*", F.expr("try_parse_json(CAST(value AS STRING))").alias("_json"))
    shape = parsed.select("*", F.expr("schema_of_variant(_json)").alias("_root"))
    fields = shape.select("*", F.expr(f"try_variant_get(_json, '$', 'struct<{envelope._FAST_SCHEMA}>')").alias("_fj"))
    # Alternatives to the fields' variant cast, over the same shape stage: a second parse with from_json, and one
    # variant_get per field.
    fields_from_json = shape.select("*", F.from_json(text, envelope._FAST_SCHEMA).alias("_fj"))
    fields_per_field = shape.select("*", F.struct(*[
        F.expr(f"try_variant_get(_json, '$.{field}', '{spark_type}')").alias(field)
        for field, spark_type in envelope._FIELDS.items()]).alias("_fj"))
    # Scalar fields as text from a second streaming pass over the JSON (json_tuple), cast from text: no variant
    # cast per field. The text is exact for a record of the fast shape, whose JSON types the shape string gives.
    scalars = [f for f, t in envelope._FIELDS.items() if not t.startswith("map")]
    tupled = shape.select("*", F.json_tuple(text, *scalars).alias(*[f"_s_{f}" for f in scalars]))
    fields_json_tuple = tupled.select(*shape.columns, F.struct(
        *[F.col(f"_s_{f}").cast(envelope._FIELDS[f]).alias(f) for f in scalars],
        F.when(F.col("_root").contains("tags: "), F.expr("try_variant_get(_json, '$.tags', 'map<string,string>')"))
        .alias("tags")).alias("_fj"))
    validated = envelope.parse(records_df, config)
    frames: dict[str, Any] = {"scan": records_df, "string": string, "parse": parsed, "shape": shape,
                              "fields": fields, "fields_from_json": fields_from_json,
                              "fields_per_field": fields_per_field, "fields_json_tuple": fields_json_tuple,
                              "validate": validated}

    from analytics.accept.writer import accept_projection
    projected = accept_projection(validated, envelope.accepted_schema(spark, config).fieldNames(), limit)

    def collect() -> None:
        projected.toArrow()

    def tasks(cap: str) -> None:
        spark.conf.set("spark.sql.execution.arrow.maxBytesPerBatch", cap)
        projected.mapInArrow(_count_rows, "rows long").collect()

    jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()

    def jvm_cpu_s() -> float:
        fields = Path(f"/proc/{jvm_pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    out: dict[str, Any] = {"events": n, "repeat": args.repeat}
    for stage in args.stages.split(","):
        times, cpu = [], []
        for _ in range(args.repeat):
            c = jvm_cpu_s()
            t = time.perf_counter()
            if stage == "collect":
                collect()
            elif stage in ("tasks", "tasks_byte_capped"):
                tasks(str(64 * 1024 * 1024 if stage == "tasks_byte_capped" else 2**31 - 1))
            else:
                frames[stage].write.format("noop").mode("overwrite").save()
            times.append(time.perf_counter() - t)
            cpu.append(jvm_cpu_s() - c)
        best = min(times)
        out[stage] = {"s": round(best, 3), "us_per_record": round(best * 1e6 / n, 2),
                      "jvm_cpu_us_per_record": round(min(cpu) * 1e6 / n, 2), "all_s": [round(x, 3) for x in times]}
        print(f"[{stage}] {json.dumps(out[stage])}", file=sys.stderr, flush=True)
    spark.stop()
    return out


def _count_rows(chunks: Any) -> Any:
    import pyarrow as pa

    yield pa.RecordBatch.from_pydict({"rows": [sum(chunk.num_rows for chunk in chunks)]})


if __name__ == "__main__":
    main()
