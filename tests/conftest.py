"""Fixtures for integration tests: a real Kafka broker, a real Spark session with the official connector, and a real
store server (``eventide store serve`` over a chDB directory), reached over HTTP like a ClickHouse server.

The test session starts its own broker and store on free ports with data in temporary directories, so it runs beside
a ``./run demo`` stack without touching it. Jars come from the checkout's cache (downloaded on first use). Each test
gets its own topics, ClickHouse database and checkpoints, so tests cannot see each other's data.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from eventide import broker
from eventide.config import Config, load_config, to_environ
from eventide.services import free_port, tail

REPO = Path(__file__).resolve().parent.parent
STORE_START_S = 60.0


@contextmanager
def served_store(data_dir: Path, password: str = "") -> Iterator[tuple[Config, subprocess.Popen[bytes]]]:
    """``python -m store.server`` (what ``eventide store serve`` runs) over ``data_dir`` on a free port, as a child
    process; yields a config whose ``store_url`` is that server, and the process. Stopped with SIGTERM."""
    from store.client import wait_until_up

    config = load_config(environ={}, root=str(REPO), paths={"data_dir": str(data_dir)},
                         store={"port": free_port(), "password": password})
    log = data_dir / "store.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("EVENTIDE_")}, **to_environ(config)}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "store.server"], env=env, cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        if not wait_until_up(config, STORE_START_S):
            pytest.fail(f"store server did not answer within {STORE_START_S} s:\n{tail(log)}")
        yield config, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="session")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The test session's store server; every test reaches the store through it (``store={"url": store_url}``)."""
    with served_store(tmp_path_factory.mktemp("store")) as (config, _):
        yield config.store_url


def own_database(prefix: str) -> str:
    """A database name no other test uses (they all share the session's store server)."""
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def base_config(tmp_path_factory: pytest.TempPathFactory, store_url: str) -> Config:
    data = tmp_path_factory.mktemp("eventide-data")
    return load_config(
        environ={},
        root=str(REPO),
        paths={"data_dir": str(data), "cache_dir": str(REPO / ".cache")},
        kafka={"port": free_port(), "controller_port": free_port()},
        store={"url": store_url},
        stream={"master": "local[2]", "trigger_interval_s": 1, "shuffle_partitions": 2},
        sdk={"health_interval_s": 0},   # tests count exact rows; the SDK health metrics have tests of their own
    )


@pytest.fixture(scope="session")
def kafka(base_config: Config) -> Iterator[Config]:
    """A running local broker (real Apache Kafka, KRaft) for the whole test session."""
    broker.start(base_config)
    yield base_config
    broker.stop(base_config)


@pytest.fixture(scope="session")
def spark(kafka: Config):
    from analytics.job import spark_session

    session = spark_session(kafka, app_name="eventide-tests")
    yield session
    session.stop()


@pytest.fixture
def stack(kafka: Config, request: pytest.FixtureRequest) -> Config:
    """Per-test config: own topics, own ClickHouse database (migrated), own checkpoints."""
    return fresh_stack(kafka, request.node.name)


def fresh_stack(kafka: Config, name: str, partitions: int | None = None, **stream: object) -> Config:
    """A config with its own topics (``partitions`` for the events topic), migrated ClickHouse database and
    checkpoints; ``stream`` overrides stream settings."""
    from store.migrations import apply_migrations

    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")[:40]
    config = kafka.model_copy(update={
        "kafka": kafka.kafka.model_copy(update={"events_topic": f"events.{slug}",
                                                "dead_letter_topic": f"dead-letter.{slug}",
                                                "events_partitions": partitions or kafka.kafka.events_partitions}),
        "store": kafka.store.model_copy(update={"database": f"t_{slug}"}),
        "stream": kafka.stream.model_validate({**kafka.stream.model_dump(), **stream,
                                               "checkpoint_dir": kafka.data_dir / "checkpoints" / slug}),
    })
    broker.ensure_topics(config)
    apply_migrations(config)
    return config
