"""Fetch JVM jars (the Kafka broker, Spark's Kafka connector) from Maven Central into a project-local cache.

Resolution uses Apache Ivy, which ships inside pyspark (Spark itself uses it for ``--packages``), so a laptop needs
Java and this project's Python dependencies, nothing else. Each jar set is resolved once into
``<cache_dir>/jars/<name>-<version>/`` with a ``resolved.json`` manifest; later calls only read the manifest, so
everything works offline once cached.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

from eventide.config import Config

MANIFEST = "resolved.json"
log = logging.getLogger(__name__)


class JarResolutionError(RuntimeError):
    """Ivy could not resolve a jar set (network down with an empty cache, unknown version, ...)."""


@dataclass(frozen=True)
class Artifact:
    group: str
    name: str
    version: str
    excludes: tuple[str, ...] = ()
    """``group:name`` of transitive dependencies not to pull in (provided explicitly instead)."""

    @classmethod
    def parse(cls, coordinate: str) -> Artifact:
        group, name, version = coordinate.split(":")
        return cls(group, name, version)

    def __str__(self) -> str:
        return f"{self.group}:{self.name}:{self.version}"


def kafka_broker_artifacts(config: Config) -> list[Artifact]:
    """The broker (``kafka.Kafka``, ``kafka.tools.StorageTool``) plus a log4j2 binding so it logs to a file."""
    k = config.kafka
    return [
        Artifact("org.apache.kafka", f"kafka_{k.scala_version}", k.version),
        Artifact("org.apache.logging.log4j", "log4j-slf4j2-impl", "2.24.3"),
        Artifact("org.apache.logging.log4j", "log4j-core", "2.24.3"),
    ]


TOKEN_PROVIDER = "org.apache.spark:spark-token-provider-kafka-0-10_2.13"


def spark_kafka_connector_artifacts(token_provider_version: str | None = None,
                                    connector_version: str | None = None) -> list[Artifact]:
    """The official connector matching the installed pyspark (Spark 4 is built for Scala 2.13), or at
    ``connector_version``.

    ``token_provider_version`` pins the connector's helper module (Kafka delegation tokens) to another version;
    used only when the matching one is missing from the repository (see :func:`spark_kafka_connector_jars`).
    """
    import pyspark

    connector = Artifact("org.apache.spark", "spark-sql-kafka-0-10_2.13", connector_version or pyspark.__version__)
    if token_provider_version is None:
        return [connector]
    group, name = TOKEN_PROVIDER.split(":")
    return [Artifact(connector.group, connector.name, connector.version, excludes=(TOKEN_PROVIDER,)),
            Artifact(group, name, token_provider_version)]


def spark_home() -> Path:
    """The installed pyspark's distribution directory (``bin/``, ``jars/``).

    Under ``spark-submit`` the driver imports pyspark from ``$SPARK_HOME/python/lib/pyspark.zip``, so the package's
    own location is not the distribution there: ``SPARK_HOME`` (which spark-submit sets) comes first."""
    import pyspark

    home = os.environ.get("SPARK_HOME")
    if home and (Path(home) / "jars").is_dir():
        return Path(home)
    return Path(pyspark.__file__).resolve().parent


def _ivy_jar() -> Path:
    jars = sorted((spark_home() / "jars").glob("ivy-*.jar"))
    if not jars:
        raise JarResolutionError("no ivy-*.jar inside the installed pyspark; reinstall pyspark")
    return jars[-1]


def _java() -> str:
    java = shutil.which("java")
    if not java:
        raise JarResolutionError("java not found on PATH: install a JDK/JRE 17 or 21 (e.g. openjdk-17-jre-headless)")
    return java


def _ivy_module(name: str, artifacts: list[Artifact]) -> str:
    def dependency(a: Artifact) -> str:
        excludes = "".join(
            f"<exclude org={quoteattr(e.split(':')[0])} module={quoteattr(e.split(':')[1])}/>" for e in a.excludes
        )
        return (f"    <dependency org={quoteattr(a.group)} name={quoteattr(a.name)} rev={quoteattr(a.version)}"
                f' conf="default->default">{excludes}</dependency>')

    deps = "\n".join(dependency(a) for a in artifacts)
    return (
        '<ivy-module version="2.0">\n'
        f'  <info organisation="eventide" module={quoteattr(name)}/>\n'
        f"  <dependencies>\n{deps}\n  </dependencies>\n</ivy-module>\n"
    )


def _ivy_settings(repository: str) -> str:
    return (
        "<ivysettings>\n"
        '  <settings defaultResolver="central"/>\n'
        "  <resolvers>\n"
        f'    <ibiblio name="central" m2compatible="true" root={quoteattr(repository)}/>\n'
        "  </resolvers>\n"
        "</ivysettings>\n"
    )


def _target(config: Config, name: str, artifacts: list[Artifact]) -> Path:
    key = hashlib.sha256("|".join(f"{a}!{a.excludes}" for a in artifacts).encode()).hexdigest()[:10]
    return config.cache_dir / "jars" / f"{name}-{key}"


def cached(config: Config, name: str, artifacts: list[Artifact]) -> list[Path] | None:
    """The jars of an earlier successful :func:`resolve` of the same artifacts, or None."""
    manifest = _target(config, name, artifacts) / MANIFEST
    if not manifest.exists():
        return None
    jars = [manifest.parent / j for j in json.loads(manifest.read_text())["jars"]]
    return jars if all(j.exists() for j in jars) else None


@contextlib.contextmanager
def _cache_locked(config: Config) -> Iterator[None]:
    """Held while a process resolves into ``config.cache_dir``. Processes started side by side on an empty cache (the
    test suite's workers, a demo started beside the tests) share Ivy's cache and the jar sets' directories, so they
    resolve one at a time: the later ones then find the first one's jars."""
    config.cache_dir.mkdir(parents=True, exist_ok=True)
    with (config.cache_dir / ".resolve.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def resolve(config: Config, name: str, artifacts: list[Artifact]) -> list[Path]:
    """Return the jar files for ``artifacts`` and their runtime dependencies, downloading them if not cached."""
    found = cached(config, name, artifacts)
    if found:
        return found
    with _cache_locked(config):
        return cached(config, name, artifacts) or _download(config, name, artifacts)


def _download(config: Config, name: str, artifacts: list[Artifact]) -> list[Path]:
    target = _target(config, name, artifacts)
    manifest = target / MANIFEST
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=config.cache_dir))
    try:
        (staging / "ivy.xml").write_text(_ivy_module(name, artifacts))
        (staging / "ivysettings.xml").write_text(_ivy_settings(config.maven.repository))
        cmd = [
            _java(), "-cp", str(_ivy_jar()), "org.apache.ivy.Main",
            "-settings", str(staging / "ivysettings.xml"),
            "-ivy", str(staging / "ivy.xml"),
            "-cache", str(config.cache_dir / "ivy"),
            "-confs", "default",
            "-types", "jar", "bundle",
            "-retrieve", str(staging / "lib" / "[artifact]-[revision](-[classifier]).[ext]"),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-25:])
            raise JarResolutionError(f"resolving {name} ({', '.join(map(str, artifacts))}) failed:\n{tail}")
        jars = sorted(p.name for p in (staging / "lib").glob("*.jar"))
        if not jars:
            raise JarResolutionError(f"resolving {name} produced no jars")
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        (staging / "lib").rename(target)
        manifest.write_text(json.dumps({"artifacts": [str(a) for a in artifacts], "jars": jars}, indent=1))
        return [target / j for j in jars]
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def kafka_broker_jars(config: Config) -> list[Path]:
    return resolve(config, f"kafka-broker-{config.kafka.version}", kafka_broker_artifacts(config))


def spark_kafka_connector_jars(config: Config) -> list[Path]:
    """The connector jars for the installed pyspark.

    Some Maven Central mirrors lack a release's connector (``spark-sql-kafka-0-10`` 4.2.1 while pyspark 4.2.1 is
    on PyPI) or its helper module ``spark-token-provider-kafka-0-10`` 4.1.x. Then the connector is taken at
    ``maven.connector_fallback`` (an earlier patch release of the same Spark line) and/or the helper at
    ``maven.token_provider_fallback`` (only used for Kafka delegation tokens, which this project does not
    configure), each with a warning. With a complete Maven Central the matching versions are used.
    """
    import pyspark

    connectors = [pyspark.__version__]
    if config.maven.connector_fallback not in (None, pyspark.__version__):
        connectors.append(config.maven.connector_fallback)
    candidates = [(connector, token_provider) for connector in connectors
                  for token_provider in (None, config.maven.token_provider_fallback)]
    name = f"spark-sql-kafka-{pyspark.__version__}"
    arts = [spark_kafka_connector_artifacts(tp, c) for c, tp in candidates]
    resolved = next((found for found in (cached(config, name, a) for a in arts) if found), None)
    failures = []
    for (connector, token_provider), artifacts in zip(candidates, arts, strict=True):
        if resolved:
            break
        try:
            resolved = resolve(config, name, artifacts)
        except JarResolutionError as exc:
            if "spark-sql-kafka" not in str(exc) and "spark-token-provider-kafka" not in str(exc):
                raise
            failures.append(f"{connector} (helper {token_provider or connector})")
            continue
        if connector != pyspark.__version__ or token_provider:
            log.warning("spark-sql-kafka-0-10 %s or its helper is not in %s; using the connector %s with helper "
                        "%s (pyspark is %s)", pyspark.__version__, config.maven.repository, connector,
                        token_provider or connector, pyspark.__version__)
    if not resolved:
        raise JarResolutionError(f"no Spark-Kafka connector in {config.maven.repository}: tried {failures}")
    # Spark already ships scala-library, hadoop-client, slf4j, lz4, snappy ...: a second copy of a different
    # version on the classpath is a source of subtle conflicts, so only what Spark lacks is added.
    bundled = {_artifact_name(j.name) for j in (spark_home() / "jars").glob("*.jar")}
    return [j for j in resolved if _artifact_name(j.name) not in bundled]


def _artifact_name(jar_file: str) -> str:
    """``kafka-clients-3.9.1.jar`` -> ``kafka-clients``."""
    match = re.match(r"^(.*?)-\d+\.[\w.\-]*\.jar$", jar_file)
    return match.group(1) if match else jar_file
