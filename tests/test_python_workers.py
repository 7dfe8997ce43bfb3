"""Spark's Python workers import the pyspark installed in the job's environment, not Spark's zipped copy."""

from __future__ import annotations

import importlib.metadata
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pyspark

from analytics import spark_python_daemon


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


def test_workers_load_transform_with_state_input_with_the_vectorised_loader(spark):
    def loader(frames):
        from pyspark.sql.pandas.serializers import TransformWithStateInPandasSerializer

        for _ in frames:
            yield pd.DataFrame({"module": [TransformWithStateInPandasSerializer.load_stream.__module__]})

    found = spark.range(4).repartition(2).mapInPandas(loader, "module string").toPandas()
    assert set(found["module"]) == {"analytics.tws_input"}
