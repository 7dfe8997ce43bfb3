"""Spark's Python workers import the pyspark installed in the job's environment, not Spark's zipped copy."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyspark
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle, TimerValues

from analytics.spark import python_daemon as spark_python_daemon
from analytics.spark import settings as spark_settings


def test_workers_import_the_installed_pyspark_not_the_zip(spark):
    def where(frames):
        import sys

        import pyspark as worker_pyspark

        def spark_zip(entry: str) -> bool:   # Spark's pyspark.zip, py4j-*-src.zip, spark-core jar, or inside them
            return any(part.endswith(".jar") or (part.endswith(".zip") and part.startswith(("pyspark", "py4j")))
                       for part in entry.split("/"))
        for _ in frames:
            yield pd.DataFrame({"pyspark": [worker_pyspark.__file__],
                                # the import caches too: every task invalidates each cached importer
                                "zips": [",".join(p for p in [*sys.path, *sys.path_importer_cache] if spark_zip(p))]})

    found = spark.range(4).repartition(2).mapInPandas(where, "pyspark string, zips string").toPandas()
    assert set(found["pyspark"]) == {pyspark.__file__}          # the venv's copy, compiled once, in every worker
    assert set(found["zips"]) == {""}


def test_the_zips_stay_when_the_installed_copy_is_another_version(tmp_path: Path):
    zipped = tmp_path / "pyspark.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("pyspark/version.py", '__version__: str = "0.0.1"\n')
    path = [str(zipped), *sys.path]
    assert spark_python_daemon.spark_zips([*path, "/spark/jars/spark-core_2.13-4.1.4.jar"]) == [
        str(zipped), "/spark/jars/spark-core_2.13-4.1.4.jar"]
    assert spark_python_daemon.zipped_pyspark_version(str(zipped)) == "0.0.1"
    assert not spark_python_daemon.installed_copy_matches([str(zipped)], path)

    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("pyspark/version.py", f'__version__: str = "{importlib.metadata.version("pyspark")}"\n')
    assert spark_python_daemon.installed_copy_matches([str(zipped)], path)


def test_workers_load_and_write_transform_with_state_rows_with_the_projects_serializer(spark):
    def loader(frames):
        from pyspark.sql.pandas.serializers import TransformWithStateInPandasSerializer

        for _ in frames:
            yield pd.DataFrame({"load": [TransformWithStateInPandasSerializer.load_stream.__module__],
                                "dump": [TransformWithStateInPandasSerializer.dump_stream.__module__]})

    found = spark.range(4).repartition(2).mapInPandas(loader, "load string, dump string").toPandas()
    assert set(found["load"]) == {"analytics.spark.tws_input"}
    assert set(found["dump"]) == {"analytics.spark.tws_output"}


def test_workers_leave_what_the_daemon_imported_out_of_every_collection(spark):
    # pyspark's daemon runs gc.collect() in a reused worker after every task: it walks only what tasks made.
    def frozen(frames):
        import gc

        for _ in frames:
            yield pd.DataFrame({"frozen": [gc.get_freeze_count()]})

    found = spark.range(4).repartition(2).mapInPandas(frozen, "frozen long").toPandas()
    assert found["frozen"].min() > 20_000          # pyspark, pyarrow, pandas and the task modules, imported once


def test_every_process_of_transform_with_state_imports_the_installed_pyspark(spark, tmp_path: Path):
    # Spark starts a driver-side process of its own at a stateful query's first batch, with its zipped pyspark
    # first on the path; the job's PYSPARK_PYTHON (analytics/spark/python.sh) takes Spark's archives off it.
    class RecordsWhereItRuns(StatefulProcessor):
        """Notes, in every process that initialises it, where that process imported pyspark from."""

        def __init__(self, notes: str) -> None:
            self.notes = notes

        def init(self, handle: StatefulProcessorHandle) -> None:
            import pyspark as imported  # in the process running init

            with open(self.notes, "a") as out:
                out.write(f"{os.getpid()} {imported.__file__}\n")

        def handleInputRows(self, key: tuple[str], rows: Iterator[pd.DataFrame],
                            timerValues: TimerValues) -> Iterator[pd.DataFrame]:
            yield from rows

        def close(self) -> None:
            pass

    source, notes = tmp_path / "in", tmp_path / "notes"
    spark.createDataFrame([("a", 1), ("b", 2)], "k string, n long").write.parquet(str(source))
    query = (spark.readStream.schema("k string, n long").parquet(str(source)).groupBy("k")
             .transformWithStateInPandas(RecordsWhereItRuns(str(notes)), "k string, n long", "append", "None")
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    processes = dict(line.split() for line in notes.read_text().splitlines())
    assert len(processes) >= 2                              # the driver-side one and the executors' workers
    assert set(processes.values()) == {pyspark.__file__}


def test_the_spark_python_launcher_drops_only_the_installed_pyspark_archives(tmp_path: Path):
    installed = Path(pyspark.__file__).parent
    own = [str(installed / "python" / "lib" / "pyspark.zip"), str(installed / "jars" / "spark-core_2.13-4.1.4.jar")]
    users = [str(tmp_path / "mine"), "/elsewhere/pyspark.zip"]
    shown = subprocess.run(
        [str(spark_settings.SPARK_PYTHON_LAUNCHER), "-c", "import os; print(os.environ.get('PYTHONPATH', ''))"],
        env={**os.environ, "PYTHONPATH": ":".join([own[0], users[0], own[1], users[1]]),
             "EVENTIDE_SPARK_PYTHON": sys.executable, "EVENTIDE_PYSPARK_DIR": str(installed)},
        capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == ":".join(users)


def test_the_keyed_windows_processor_unpickles_without_the_window_logic(tmp_path: Path):
    # The driver-side process of transformWithStateInPandas unpickles the processor only to run its init (at every
    # start of the query): pandas, pyarrow and the job's configuration are left to the workers that handle rows.
    from pyspark import cloudpickle

    from analytics.keyed.processor import KeyedWindowsProcessor

    pickled = tmp_path / "processor.pickle"
    pickled.write_bytes(cloudpickle.dumps(KeyedWindowsProcessor(300_000, 300_000, 86_400_000)))
    heavy = ["pandas", "pyarrow", "pydantic", "eventide.config", "analytics.keyed.logic"]
    loaded = subprocess.run(
        [sys.executable, "-c", "import pickle, sys\n"
         f"processor = pickle.loads(open({str(pickled)!r}, 'rb').read())\n"
         "print(type(processor).__module__, processor.session_gap_ms)\n"
         f"print(sorted(m for m in {heavy!r} if m in sys.modules))"],
        capture_output=True, text=True, check=True)
    assert loaded.stdout.splitlines() == ["analytics.keyed.processor 300000", "[]"]
