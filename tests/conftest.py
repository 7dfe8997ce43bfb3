"""Fixtures for integration tests: a real Kafka broker, a real Spark session with the official connector, chDB.

The test session starts its own broker on free ports with data in a temporary directory, so it runs beside a
``./run demo`` stack without touching it. Jars come from the checkout's cache (downloaded on first use). Each test
gets its own topics, ClickHouse database and checkpoints, so tests cannot see each other's data.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventide import broker
from eventide.config import Config, load_config
from eventide.services import free_port

REPO = Path(__file__).resolve().parent.parent



@pytest.fixture(scope="session")
def base_config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    data = tmp_path_factory.mktemp("eventide-data")
    return load_config(
        environ={},
        root=str(REPO),
        paths={"data_dir": str(data), "cache_dir": str(REPO / ".cache")},
        kafka={"port": free_port(), "controller_port": free_port()},
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


NEEDS_SPARK = pytest.StashKey[bool]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    config.stash[NEEDS_SPARK] = any("spark" in getattr(item, "fixturenames", ()) for item in items)


@pytest.fixture(scope="session", autouse=True)
def spark_first(request: pytest.FixtureRequest) -> None:
    """Start Spark before any test runs when some selected test needs it.

    chDB leaks descriptors with every open (docs/architecture.md), and py4j's callback server must get a
    descriptor below 1024 (see ``analytics.job.spark_session``); after a few hundred store opens by earlier tests
    it would not, and the first streaming query would hang instead of failing."""
    if request.config.stash.get(NEEDS_SPARK, False):
        request.getfixturevalue("spark")


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
