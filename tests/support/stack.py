"""Fixtures for integration tests (a pytest plugin of tests/conftest.py): a real Kafka broker, a real Spark session
with the official connector, and a real store server (``eventide store serve`` over a chDB directory), reached over
HTTP like a ClickHouse server.

The test session starts its own broker and store on free ports with data in temporary directories, so it runs beside
a ``./run demo`` stack without touching it. Jars come from the checkout's cache (downloaded on first use). Each test
gets its own topics, ClickHouse database and checkpoints, so tests cannot see each other's data.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest

from eventide.config import MAX_RETENTION_DAYS, Config, RetentionConfig, load_config
from stack import broker
from stack.services import free_port

REPO = Path(__file__).resolve().parents[2]
PAST_EVENTS_RETENTION = dict.fromkeys(RetentionConfig.model_fields, MAX_RETENTION_DAYS)
"""``retention`` for tests that replay events at fixed past times (2023, 2024): the default TTLs, counted from each
row's event time, would expire their rows in the first merge. tests/integration/test_retention.py tests the TTLs
themselves."""


@contextmanager
def served_store(data_dir: Path, password: str = "", **store: object) \
        -> Iterator[tuple[Config, subprocess.Popen[bytes]]]:
    """``python -m store.server`` (what ``eventide store serve`` runs) over ``data_dir`` on a free port, as a child
    process; yields a config whose ``store_url`` is that server, and the process. Stopped with SIGTERM. ``store``:
    more store settings (e.g. lower limits)."""
    from store import server

    config = load_config(environ={}, root=str(REPO), paths={"data_dir": str(data_dir)},
                         store={"port": free_port(), "password": password, **store})
    with server.child(config, log=data_dir / "store.log") as proc:
        yield config, proc


def writer_url(config: Config) -> str:
    """``config``'s embedded store as a server URL carrying the writer's credentials (generated on its first start),
    as a ClickHouse server's URL would: ``http://default:<password>@host:port``."""
    from store import credentials

    password = credentials.load(config).writer_password
    return f"http://{credentials.WRITER_USER}:{quote(password, safe='')}@{config.store.host}:{config.store.port}"


@pytest.fixture(scope="session")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The test session's store server; every test reaches the store through it (``store={"url": store_url}``).
    The URL carries the writer's password: the store refuses requests without one."""
    with served_store(tmp_path_factory.mktemp("store")) as (config, _):
        yield writer_url(config)


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
        retention=PAST_EVENTS_RETENTION,
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
