# One image for every eventide process in docker-compose.yml: the Spark master and workers (pyspark's own classes,
# as `eventide cluster up` runs them), the stream job's driver (spark-submit), the gateway, the alert evaluator and
# the dashboard. Executors and driver therefore share one Python (pandas, pyarrow, datasketches) and one code tree.
FROM python:3.11-slim

RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY . /app
# Editable install: `eventide cluster submit` / `eventide job --submit` zip the packages from this tree for
# spark-submit's --py-files.
RUN pip install --no-cache-dir -e . \
 && python -c "from eventide import jars; from eventide.config import load_config; \
jars.spark_kafka_connector_jars(load_config())"
ENV SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark \
    EVENTIDE_PATHS__CACHE_DIR=/app/.cache
