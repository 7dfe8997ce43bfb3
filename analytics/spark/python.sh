#!/bin/sh
# The Python of the processes Spark starts for the job (PYSPARK_PYTHON, set by analytics.spark.settings): the job's
# own interpreter ($EVENTIDE_SPARK_PYTHON), without the installed pyspark's own archives on PYTHONPATH.
#
# Spark puts its zipped pyspark, py4j's zip and its jars first on the PYTHONPATH of every Python process it starts.
# Imported from a zip, pyspark is compiled from source in each new process (zipimport writes no bytecode cache), several
# times the installed copy's import time, paid by the driver-side process that transformWithStateInPandas starts at
# every start of the keyed_windows query (docs/performance.md#python-worker-daemon-and-launcher). The archives dropped
# are those inside the installed pyspark ($EVENTIDE_PYSPARK_DIR), so the copy imported instead is the very same version;
# a Spark distribution elsewhere keeps its path as Spark set it.
[ -n "$EVENTIDE_PYSPARK_DIR" ] || exec "$EVENTIDE_SPARK_PYTHON" "$@"
kept=""
IFS=:
for entry in $PYTHONPATH; do
  case "$entry" in
    "$EVENTIDE_PYSPARK_DIR"/*.zip | "$EVENTIDE_PYSPARK_DIR"/*.jar) ;;
    *) kept="${kept:+$kept:}$entry" ;;
  esac
done
unset IFS
if [ -n "$kept" ]; then export PYTHONPATH="$kept"; else unset PYTHONPATH; fi
exec "$EVENTIDE_SPARK_PYTHON" "$@"
