"""Spark's Python worker daemon (``spark.python.daemon.module``), run without Spark's zipped copy of pyspark.

Spark puts its ``pyspark.zip``, py4j's zip and its own ``spark-core`` jar (a zip of 5,362 entries, for builds that ship
pyspark inside it) first on its Python workers' ``PYTHONPATH``, even when the same pyspark is installed in the workers'
interpreter (as it is here: the job's venv). Imported from a zip, pyspark's modules are compiled from source in every
new worker (zipimport writes no bytecode cache), and before every task a worker invalidates the import caches, which
makes each zip importer re-read its archive's directory: together a large share of the Python workers' CPU
(docs/performance.md#python-worker-daemon-and-launcher). So when this interpreter has the very same pyspark version
installed, and py4j, those archives are dropped from ``sys.path`` before anything of pyspark is imported, and the daemon
and its forked workers import the installed copy. Otherwise (e.g. a Spark distribution's Python without pyspark) the
path is left as Spark set it.

It also puts ``analytics.spark.tws_input``'s vectorised loader in place of PySpark's row-by-row one for
``transformWithStateInPandas`` (the query ``keyed_windows``), and ``analytics.spark.tws_output``'s writer, which joins
many keys' frames into one record batch, in place of its frame-by-frame one; Arrow's jemalloc allocator in place of
its default (``analytics.spark.settings.use_jemalloc_for_arrow``); and imports the modules the job's tasks run
(``TASK_MODULES``), before any worker is forked.
"""

from __future__ import annotations

import gc
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import zipfile

_SPARK_ZIPS = ("pyspark", "py4j")
TASK_MODULES = ("analytics.accept.task", "analytics.windows.writer", "analytics.keyed.writer")


def spark_zips(path: list[str]) -> list[str]:
    """The entries of ``path`` that are Spark's archives: zipped pyspark and py4j, and jars."""
    return [p for p in path
            if p.endswith(".jar") or (p.endswith(".zip") and os.path.basename(p).startswith(_SPARK_ZIPS))]


def zipped_pyspark_version(zip_path: str) -> str | None:
    """The ``__version__`` in a pyspark zip's ``pyspark/version.py`` (None if it has none)."""
    try:
        with zipfile.ZipFile(zip_path) as archive:
            source = archive.read("pyspark/version.py").decode()
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
    found = re.search(r"""__version__[^=]*=\s*["']([^"']+)["']""", source)
    return found.group(1) if found else None


def installed_copy_matches(zips: list[str], path: list[str]) -> bool:
    """True when, without ``zips``, ``path`` still finds pyspark (of the zip's version) and py4j."""
    pyspark_zips = [z for z in zips if os.path.basename(z).startswith("pyspark")]
    versions = {zipped_pyspark_version(z) for z in pyspark_zips}
    saved = sys.path[:]
    sys.path[:] = [p for p in path if p not in zips]
    try:
        found = all(importlib.util.find_spec(name) is not None for name in _SPARK_ZIPS)
    finally:
        sys.path[:] = saved
    if not found:
        return False
    try:
        installed = importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        return False
    return versions <= {installed}


def main() -> None:
    zips = spark_zips(sys.path)
    if zips and installed_copy_matches(zips, sys.path):
        sys.path[:] = [p for p in sys.path if p not in zips]
        # Finding this module already cached a zip importer per zip: invalidating the import caches (before every
        # task) walks that cache, not sys.path, so they must go too.
        for cached in [k for k in sys.path_importer_cache if k.startswith(tuple(zips))]:
            del sys.path_importer_cache[cached]
    # After the path is settled: the daemon forks every worker from this process, so they inherit the installed
    # loader, and pandas, pyarrow and pyspark's serializers already imported (once, not in each new worker).
    from pyspark import daemon

    from analytics.spark import settings as spark_settings
    from analytics.spark import tws_input, tws_output

    tws_input.install()
    tws_output.install()
    spark_settings.use_jemalloc_for_arrow()
    # The modules the job's tasks run (accept's per-partition work, the readers' writers, with the store client,
    # the Kafka producer and DataSketches): imported once here, not again in every new worker.
    for module in TASK_MODULES:
        importlib.import_module(module)
    # pyspark's daemon runs a full collection in a reused worker after every task. Everything imported so far lives
    # as long as the worker, yet a full collection walks all of it each time (tens of thousands of objects, much of
    # a worker's CPU at a live job's pace) and writes into every page of it, which a forked worker then copies.
    # Frozen objects are left out of every collection; only what a task creates is collected.
    gc.freeze()

    daemon.manager()


if __name__ == "__main__":
    main()
