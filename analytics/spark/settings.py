"""Spark settings the job needs whichever way it starts (``analytics.job``'s session builder, ``spark-submit``):
``JOB_SETTINGS``, ``JVM_OPTIONS``, and the Arrow allocator of its Python processes (``use_jemalloc_for_arrow``);
for the session builder also the Python those processes run (``use_job_python_for_spark``).

Checkpoint files (offsets and commit logs, the file-source log, RocksDB changelogs and snapshots) are small files
written atomically, several per query per micro-batch. On a local or NFS path, Hadoop's local filesystem without
its native library (which Maven Central does not ship) runs a shell command for every file it creates (``chmod``
of the file and of its ``.crc`` checksum) and, through the FileContext API Spark uses by default, more for every
rename (``readlink`` of source, target and their checksum files). Each is a process spawned by the JVM, and a
spawn costs more the more descriptors the JVM holds. Renaming through the FileSystem API instead leaves only the
two ``chmod``, so a write spawns fewer processes and slows down less as the JVM's descriptors grow
(docs/performance.md#checkpoint-writes). The rename is still one ``rename(2)``, atomic on a POSIX filesystem.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

LOCAL_CHECKPOINT_FILES: dict[str, str] = {
    "spark.sql.streaming.checkpointFileManagerClass":
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
}
"""How checkpoint files are written (the job's checkpoints are on a local disk or a shared POSIX mount)."""

PYTHON_WORKERS: dict[str, str] = {
    # Workers import the installed pyspark, not Spark's zip (analytics/spark/python_daemon.py says why).
    "spark.python.daemon.module": "analytics.spark.python_daemon",
}

ARROW_HAND_OVER: dict[str, str] = {
    "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
}
"""How Spark hands rows to the job's Python tasks (``mapInArrow``, ``transformWithStateInPandas``): in Arrow chunks of
``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (10,000), with no byte limit.

Spark 4.1's default byte limit (64 MiB) is checked after every row, and each check walks every column vector of the
chunk: with the ``accept`` hand-over's columns that check was the largest single cost of the executors' task threads
(docs/performance.md#the-arrow-hand-over-to-the-tasks has the figures). ``2**31 - 1`` is the value Spark skips the
check for. A chunk is bounded by its rows instead: 10,000 records of at most ``envelope.max_record_bytes`` each (a
rejected record carries at most that many of its bytes and its reason; one over the limit is copied whole to the
dead-letter topic by Spark, ``analytics.accept.writer.forward_oversized``); docs/operations.md ("Memory per task")
sizes it."""

PLANNING: dict[str, str] = {
    "spark.sql.constraintPropagation.enabled": "false",
}
"""How Spark plans each micro-batch: without constraint propagation.

Every ``foreachBatch`` micro-batch wraps the batch's plan in a ``LogicalRDD`` and carries the optimized plan's
constraints over to it, and Spark derives those constraints from every expression of the plan, combining each alias
with each predicate. The ``accept`` plan's validation projection has dozens of rules, so that derivation was most of
its stream-execution thread's CPU per batch (docs/performance.md#the-drivers-work-per-batch). The optimizer uses
constraints only to add or drop filters implied by others (``InferFiltersFromConstraints``, ``PruneFilters``); the
job's plans have no joins for the added filters to help, and the results are the same without them."""

FILE_LISTING: dict[str, str] = {
    "spark.sql.sources.parallelPartitionDiscovery.threshold": str(2**31 - 1),
}
"""How the readers list the accepted-events log: in the driver, never as a Spark job.

A reader's file source lists the whole log (recursively) at every poll once it has read everything listed, and past
32 directories (Spark's default threshold) Spark lists them with a Spark job, a task per directory. The log holds a
directory per ``accept`` batch for ``stream.accepted_retention_s``, so each idle poll became a job of hundreds of
tasks, and the readers fell further behind as the log grew (docs/performance.md#the-readers-listing-of-the-accepted-log
has the figures). A local or NFS directory is listed faster in the driver; the log must be on a POSIX path anyway,
and the job reads no other directory."""

STATE: dict[str, str] = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # One watermark per micro-batch for both late-event filtering and state eviction (BRIEF §3); Spark's default
    # filters late events with the previous batch's watermark, so a window whose end the current watermark has
    # passed would still take events for one more batch.
    "spark.sql.streaming.statefulOperator.allowMultiple": "false",
}
"""Where the stateful queries keep their state (RocksDB, with changelog checkpoints), and which watermark applies."""

AGGREGATION: dict[str, str] = {
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "1000000",
}
"""The window aggregation's sketch buffers are objects: past this many groups per task Spark's default (128) switches
to a sort-based aggregation, much slower for object buffers (docs/performance.md#spark-and-jvm-settings)."""

SESSION: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
}
"""No web UI or console progress bar (the job reports its progress to the store); timestamps in UTC."""

SCHEDULING = {"spark.scheduler.mode": "FAIR"}
"""``accept``'s jobs run in a pool of their own (``analytics.accept.writer``), the readers' in the default one: with
the first-in-first-out default, an ``accept`` batch waited for every pending task of a reader's stage before its own
tasks got a slot, and its log lines with it (docs/performance.md#accept-often-windows-per-reader-batch)."""

JOB_SETTINGS: dict[str, str] = {**SCHEDULING, **LOCAL_CHECKPOINT_FILES, **PYTHON_WORKERS, **ARROW_HAND_OVER, **PLANNING,
                                **FILE_LISTING, **STATE, **AGGREGATION, **SESSION}
"""Every setting above, for the session builder and ``spark-submit`` alike."""

LOG4J_PROPERTIES = Path(__file__).resolve().parent / "log4j2.properties"
"""The job's log settings for Spark's JVMs (warnings and errors)."""

MIN_COMPILER_THREADS = 4
"""HotSpot's JIT compiler threads on a machine with fewer than 8 cores, where its own default is fewer."""

JVM_OPTIONS = " ".join([
    f"-Dlog4j2.configurationFile=file:{LOG4J_PROPERTIES}", "-XX:-DontCompileHugeMethods",
    *([f"-XX:CICompilerCount={MIN_COMPILER_THREADS}"] if (os.cpu_count() or 1) < 8 else []),
    "-XX:+UseParallelGC",
])
"""Options for the driver's and the executors' JVMs (``spark.driver.extraJavaOptions`` and
``spark.executor.extraJavaOptions``): the job's log settings, HotSpot compiling Spark's huge generated methods,
enough compiler threads on a small machine, and the parallel (throughput) collector.

HotSpot leaves any method over 8,000 bytes of bytecode to its interpreter. The code Spark generates for the
validation (dozens of rules in one projection) and for the window aggregation's input has such methods, so every
record ran through them interpreted, the validation's and the aggregation's hottest code
(docs/performance.md#spark-and-jvm-settings).

On 2 cores HotSpot starts 2 compiler threads, one C1 and one C2, and the job's hot methods (Spark's, Kafka's,
generated ones, some taking C2 seconds each) wait in one C2 queue for minutes, running in slower, profiling code
meanwhile. With 4 (a maximum: HotSpot adds them as its queues grow) the JVM reaches its compiled code sooner, and
spends less CPU per event from then on; a first drain is no faster (docs/performance.md#spark-and-jvm-settings).
From 8 cores on HotSpot's default is 4 or more and is left alone. (The count is taken where the job starts: on a
cluster the executors' machines may differ.)

The job allocates short-lived objects at a high rate (Spark's variant cast builds expressions per field and record)
and its heaps are small (``stream.driver_memory`` 2g, ``cluster.executor_memory`` 1g). The parallel collector's
young collections and write barriers cost less CPU than G1's (the JVM's default), so a warm job does more per core
(docs/performance.md#spark-and-jvm-settings). Its pauses are longer (whole-heap collections stop the JVM), which a
micro-batch job of a few GB of heap absorbs; with much larger executor heaps G1's shorter pauses may matter more."""


def use_jemalloc_for_arrow() -> None:
    """Arrow buffers of this process (and of processes it forks) from Arrow's jemalloc allocator.

    pyarrow's default allocator (mimalloc) made the driver's work on each batch several times slower than the same calls
    on a warm process: each batch allocates fresh buffers
    (docs/performance.md#arrows-allocator-and-the-dead-letter-producer). Called by the driver before its first batch and
    by the Python worker daemon before it forks a worker. A pyarrow built without jemalloc keeps its default."""
    import pyarrow as pa

    with contextlib.suppress(NotImplementedError):
        pa.set_memory_pool(pa.jemalloc_memory_pool())


SPARK_PYTHON_LAUNCHER = Path(__file__).resolve().parent / "python.sh"
"""Runs this interpreter without the installed pyspark's archives on ``PYTHONPATH`` (the script says why)."""


def use_job_python_for_spark() -> None:
    """Spark's Python processes (its worker daemon, and the driver-side process ``transformWithStateInPandas``
    starts at every query start) run this interpreter and import the installed pyspark, not Spark's zipped copy.
    Called before the session's JVM starts; a ``PYSPARK_PYTHON`` already set is left alone.

    Through ``SPARK_PYTHON_LAUNCHER`` only when Spark is the installed pyspark itself (its ``SPARK_HOME``): the
    archives it drops are then the installed copy's own. With a Spark distribution elsewhere, or without the
    launcher (an install that lost its mode bits), this interpreter is used with Spark's path as it is
    (``analytics.spark.python_daemon`` still checks the workers' copy)."""
    if "PYSPARK_PYTHON" in os.environ:
        return
    import pyspark

    from eventide import jars

    home = jars.spark_home()
    if home.resolve() != Path(pyspark.__file__).resolve().parent or not os.access(SPARK_PYTHON_LAUNCHER, os.X_OK):
        os.environ["PYSPARK_PYTHON"] = sys.executable
        return
    os.environ.update({"EVENTIDE_SPARK_PYTHON": sys.executable, "EVENTIDE_PYSPARK_DIR": str(home),
                       "PYSPARK_PYTHON": str(SPARK_PYTHON_LAUNCHER)})
