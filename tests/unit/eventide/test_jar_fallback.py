"""Which Spark-Kafka connector jars are taken when the repository lacks the release matching pyspark (the
resolution itself is Ivy's; here the repository's contents are given)."""

from __future__ import annotations

import logging
from pathlib import Path

import pyspark
import pytest

from eventide import jars
from eventide.config import load_config

HELPER = "spark-token-provider-kafka-0-10_2.13"


def repository_with(monkeypatch: pytest.MonkeyPatch, connectors: set[str], helpers: set[str]) -> list[list[str]]:
    """A repository holding these connector and helper versions; returns the artifact sets asked for."""
    asked: list[list[str]] = []

    def resolve(config, name, artifacts):
        asked.append([f"{a.name}:{a.version}" for a in artifacts])
        connector = artifacts[0]
        helper = artifacts[1].version if len(artifacts) > 1 else connector.version
        if connector.version not in connectors:
            raise jars.JarResolutionError(f"unresolved dependency: {connector.name};{connector.version}")
        if helper not in helpers:
            raise jars.JarResolutionError(f"unresolved dependency: {HELPER};{helper}")
        return [Path(f"/jars/{connector.name}-{connector.version}.jar"), Path(f"/jars/helper-{helper}.jar")]

    monkeypatch.setattr(jars, "cached", lambda config, name, artifacts: None)
    monkeypatch.setattr(jars, "resolve", resolve)
    monkeypatch.setattr(jars, "spark_home", lambda: Path("/nonexistent"))
    return asked


def test_the_connector_matching_pyspark_is_taken_when_the_repository_has_it(monkeypatch, tmp_path):
    repository_with(monkeypatch, connectors={pyspark.__version__}, helpers={pyspark.__version__})

    found = jars.spark_kafka_connector_jars(load_config(environ={}, root=str(tmp_path)))

    assert Path(f"/jars/spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar") in found


def test_a_missing_connector_release_falls_back_to_the_configured_one_and_its_helper(monkeypatch, tmp_path, caplog):
    config = load_config(environ={}, root=str(tmp_path), maven={"connector_fallback": "4.1.3"})
    fallback_helper = config.maven.token_provider_fallback
    asked = repository_with(monkeypatch, connectors={"4.1.3"}, helpers={fallback_helper})

    with caplog.at_level(logging.WARNING):
        found = jars.spark_kafka_connector_jars(config)

    assert found == [Path("/jars/spark-sql-kafka-0-10_2.13-4.1.3.jar"), Path(f"/jars/helper-{fallback_helper}.jar")]
    assert asked[-1] == ["spark-sql-kafka-0-10_2.13:4.1.3", f"{HELPER}:{fallback_helper}"]
    assert "using the connector 4.1.3" in caplog.text


def test_a_repository_without_any_candidate_says_what_was_tried(monkeypatch, tmp_path):
    repository_with(monkeypatch, connectors=set(), helpers=set())

    with pytest.raises(jars.JarResolutionError, match="tried"):
        jars.spark_kafka_connector_jars(load_config(environ={}, root=str(tmp_path)))
