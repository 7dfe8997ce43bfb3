"""``eventide cluster``: the job on real distributed engines, on this machine.

- a Spark standalone cluster: a master and ``len(cluster.spark_worker_webui_ports)`` workers, started from
  pyspark's own classes (``org.apache.spark.deploy.master.Master`` / ``...worker.Worker``) through pyspark's
  ``bin/spark-class``: nothing is downloaded;
- a KRaft Kafka cluster of ``len(cluster.kafka_ports)`` brokers (each also a controller voter), topics replicated
  ``cluster.replication_factor`` times with ``min.insync.replicas = cluster.min_insync_replicas``; the same jars
  and code as the local broker (:mod:`stack.broker`);
- the stream job submitted to that master with ``spark-submit`` (:func:`submit_argv`, also what
  ``eventide job --submit`` runs against any cluster): the project's code shipped as
  a zip (``--py-files``), the Kafka connector jars from the cache (``--jars``), the executors' Python the project's
  interpreter, checkpoints on a path every worker reads (one machine: a local directory).

Every process is an :mod:`stack.services` service (pid and log under the data dir), so ``cluster down`` stops
what ``cluster up`` started, and a test can SIGKILL one broker or one worker by name.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import tomllib
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from analytics.spark.settings import JOB_SETTINGS, JVM_OPTIONS
from eventide import jars
from eventide.config import Config, to_environ
from stack import broker, services

REPO = Path(__file__).resolve().parent.parent
SPARK_MASTER = "spark-master"


def kafka_service(index: int) -> str:
    return f"kafka-{index + 1}"


def worker_service(index: int) -> str:
    return f"spark-worker-{index + 1}"


def kafka_nodes(config: Config) -> list[broker.Node]:
    c = config.cluster
    return [broker.Node(i + 1, c.host, port, controller, config.cluster_dir / kafka_service(i), kafka_service(i))
            for i, (port, controller) in enumerate(zip(c.kafka_ports, c.kafka_controller_ports, strict=True))]


def replication(config: Config) -> broker.Replication:
    return broker.Replication(config.cluster.replication_factor, config.cluster.min_insync_replicas)


def job_config(config: Config) -> Config:
    """``config`` pointed at the cluster: its brokers and replication for Kafka, its master for Spark, and
    checkpoints under the cluster's directory (a path every worker reads)."""
    c = config.cluster
    kafka = config.kafka.model_copy(update={"bootstrap_servers": c.kafka_bootstrap,
                                            "replication_factor": c.replication_factor,
                                            "min_insync_replicas": c.min_insync_replicas})
    stream = config.stream.model_copy(update={
        "master": c.spark_master_url, "driver_host": c.host,
        "checkpoint_dir": config.stream.checkpoint_dir or config.cluster_dir / "checkpoints"})
    return config.model_copy(update={"kafka": kafka, "stream": stream})


# Spark ----------------------------------------------------------------------------------------------------------
def _spark_env(config: Config, work_dir: Path) -> dict[str, str]:
    return {
        "SPARK_HOME": str(jars.spark_home()),
        "SPARK_LOCAL_IP": config.cluster.host,               # no hostname lookups, loopback only
        "SPARK_DAEMON_MEMORY": config.cluster.spark_daemon_memory,
        "SPARK_WORKER_DIR": str(work_dir),                   # executors' stdout/stderr and shipped files
        "SPARK_LOCAL_DIRS": str(work_dir / "tmp"),           # shuffle and spill files
        "SPARK_LOG_DIR": str(config.data_dir / "logs"),
    }


def _spark_class(*argv: str) -> list[str]:
    return [str(jars.spark_home() / "bin" / "spark-class"), *argv]


def master_state(config: Config, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The master's own JSON status (``/json/`` of its web UI), or None when it does not answer."""
    url = f"http://{config.cluster.host}:{config.cluster.spark_master_webui_port}/json/"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return json.load(resp)
    except (OSError, ValueError):
        return None


def alive_workers(config: Config) -> int:
    state = master_state(config)
    return sum(1 for w in state["workers"] if w["state"] == "ALIVE") if state else 0


def _start_spark(config: Config) -> None:
    c = config.cluster
    if not services.state(config, SPARK_MASTER).running:
        master_dir = config.cluster_dir / SPARK_MASTER
        services.start(config, SPARK_MASTER, _spark_class(
            "org.apache.spark.deploy.master.Master", "--host", c.host, "--port", str(c.spark_master_port),
            "--webui-port", str(c.spark_master_webui_port)), env=_spark_env(config, master_dir))
    for i, webui_port in enumerate(c.spark_worker_webui_ports):
        name = worker_service(i)
        if services.state(config, name).running:
            continue
        work_dir = config.cluster_dir / name
        (work_dir / "tmp").mkdir(parents=True, exist_ok=True)
        services.start(config, name, _spark_class(
            "org.apache.spark.deploy.worker.Worker", c.spark_master_url, "--host", c.host,
            "--cores", str(c.spark_worker_cores), "--memory", c.spark_worker_memory,
            "--work-dir", str(work_dir), "--webui-port", str(webui_port)), env=_spark_env(config, work_dir))
    deadline = time.monotonic() + c.start_timeout_s
    while time.monotonic() < deadline:
        if alive_workers(config) >= len(c.spark_worker_webui_ports):
            return
        for name in (SPARK_MASTER, *map(worker_service, range(len(c.spark_worker_webui_ports)))):
            if not services.state(config, name).running:
                raise RuntimeError(f"{name} exited:\n{services.tail(services.log_file(config, name))}")
        time.sleep(0.5)
    raise RuntimeError(f"{alive_workers(config)} of {len(c.spark_worker_webui_ports)} Spark workers registered with "
                       f"{c.spark_master_url} within {c.start_timeout_s:.0f}s; see {config.data_dir / 'logs'}")


# Lifecycle ------------------------------------------------------------------------------------------------------
def up(config: Config) -> None:
    """Start the Kafka cluster and the Spark cluster (what is already running is left alone), create the topics.
    Returns once every broker and every worker is live."""
    jars.kafka_broker_jars(config)
    broker.start_nodes(config, kafka_nodes(config), replication(config))
    broker.ensure_topics(job_config(config))
    _start_spark(config)


def down(config: Config) -> list[str]:
    """Stop the workers (and their executors), the master and the brokers. Returns the names of what was running."""
    stopped: list[str] = []
    # Each tier's processes stop together (a broker's controlled shutdown takes seconds): workers, master, brokers.
    tiers = [list(map(worker_service, range(len(config.cluster.spark_worker_webui_ports)))), [SPARK_MASTER],
             [n.service for n in kafka_nodes(config)]]
    with ThreadPoolExecutor(max_workers=max(map(len, tiers))) as pool:
        for tier in tiers:
            stopped += [name for name, was in zip(tier, pool.map(lambda n: services.stop(config, n), tier),
                                                  strict=True) if was]
    return stopped


def status(config: Config) -> list[str]:
    """One line per cluster process, plus what the master and the brokers report."""
    c = config.cluster
    lines = [f"spark:  {c.spark_master_url} (web UI http://{c.host}:{c.spark_master_webui_port}) "
             f"{alive_workers(config)}/{len(c.spark_worker_webui_ports)} workers alive",
             f"kafka:  {c.kafka_bootstrap} {broker.live_brokers(config, bootstrap=c.kafka_bootstrap)}/"
             f"{len(c.kafka_ports)} brokers live (replication {c.replication_factor}, "
             f"min.insync.replicas {c.min_insync_replicas})"]
    names = [*(n.service for n in kafka_nodes(config)), SPARK_MASTER,
             *map(worker_service, range(len(c.spark_worker_webui_ports)))]
    for name in names:
        st = services.state(config, name)
        lines.append(f"  {name:<15} {'running' if st.running else 'stopped':<8} pid={st.pid or '-':<8} log={st.log}")
    return lines


# The job --------------------------------------------------------------------------------------------------------
def code_zip(config: Config) -> Path:
    """The project's Python packages (those ``pyproject.toml`` installs) in one zip for ``--py-files``: the
    executors import the job's code (keyed-windows processor, UDFs) from it."""
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    target = config.cluster_dir / "eventide-code.zip"
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_suffix(".zip.tmp")
    with zipfile.ZipFile(staging, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in packages:
            for path in sorted((REPO / package).rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    archive.write(path, path.relative_to(REPO))
    staging.replace(target)
    return target


def submit_argv(config: Config, until_idle: bool = False) -> list[str]:
    """``spark-submit`` of the stream job to ``stream.master`` (client deploy mode: the foreachBatch sinks run in
    this driver, next to the store client). For this machine's cluster pass :func:`job_config` of the config."""
    c = config.cluster
    python = str(config.executor_python)
    argv = [
        str(jars.spark_home() / "bin" / "spark-submit"),
        "--master", config.stream.master,
        "--deploy-mode", "client",
        "--name", "eventide-stream",
        "--jars", ",".join(str(j) for j in jars.spark_kafka_connector_jars(config)),
        "--py-files", str(code_zip(config)),
        "--driver-memory", config.stream.driver_memory,
        "--executor-memory", c.executor_memory,
        "--executor-cores", str(c.executor_cores),
        "--conf", f"spark.pyspark.python={python}",
        "--conf", f"spark.pyspark.driver.python={python}",
        # The job's JVM options (its log settings, and HotSpot compiling Spark's generated code) for the driver and
        # the executors; spark-submit starts the driver's JVM before the job's session builder could set them.
        "--conf", f"spark.driver.extraJavaOptions={JVM_OPTIONS}",
        "--conf", f"spark.executor.extraJavaOptions={JVM_OPTIONS}",
    ]
    for key, value in JOB_SETTINGS.items():
        argv += ["--conf", f"{key}={value}"]
    if config.stream.driver_host:
        argv += ["--conf", f"spark.driver.host={config.stream.driver_host}",
                 "--conf", f"spark.driver.bindAddress={config.stream.driver_host}"]
    argv.append(str(REPO / "analytics" / "job.py"))
    return [*argv, "--until-idle"] if until_idle else argv


def submit_env(config: Config) -> dict[str, str]:
    """The environment of ``spark-submit``: the job reads its configuration from EVENTIDE_* variables."""
    return {**to_environ(config), "SPARK_HOME": str(jars.spark_home())}


def submit(config: Config, until_idle: bool = False) -> int:
    """Run the job on ``stream.master`` in the foreground; returns spark-submit's exit status."""
    return subprocess.run(submit_argv(config, until_idle), env={**os.environ, **submit_env(config)},
                          cwd=REPO).returncode
