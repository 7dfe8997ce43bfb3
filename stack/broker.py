"""The local Apache Kafka broker: one KRaft node acting as broker and controller, bound to loopback (and, for
``eventide cluster``, several such nodes forming one quorum: :func:`start_nodes`).

Mirrors what Kafka's own scripts do: ``kafka.tools.StorageTool format`` once, then ``kafka.Kafka
server.properties``, with the jars from Maven Central (see :mod:`eventide.jars`) and data under
``<data_dir>/kafka``. Topics are created with explicit configs by :func:`ensure_topics`.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from eventide import jars
from eventide.config import Config
from stack import services

SERVICE = "kafka"


class BrokerError(RuntimeError):
    """The broker could not be formatted, started or reached; the message includes its log tail."""


@dataclass(frozen=True)
class Node:
    """One KRaft process, broker and controller at once: the local stack runs one, ``eventide cluster`` several."""

    node_id: int
    host: str
    port: int
    controller_port: int
    directory: Path
    """``server.properties`` and ``data/`` (the log dirs and ``meta.properties``)."""
    service: str
    """Its name for :mod:`stack.services` (pid and log files)."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Replication:
    """How many copies of each partition a set of nodes keeps, and how many must have a write (``acks=all``)."""

    factor: int = 1
    min_insync: int = 1


def local_node(config: Config) -> Node:
    """The local stack's single broker."""
    k = config.kafka
    return Node(1, k.host, k.port, k.controller_port, config.data_dir / "kafka", SERVICE)


def server_properties(config: Config, node: Node | None = None, voters: list[Node] | None = None,
                      replication: Replication = Replication()) -> str:
    """``server.properties`` of ``node`` (default: the local broker) in a quorum of ``voters`` (default: itself)."""
    node = node or local_node(config)
    voters = voters or [node]
    quorum = ",".join(f"{v.node_id}@{v.host}:{v.controller_port}" for v in voters)
    return "\n".join([
        "process.roles=broker,controller",
        f"node.id={node.node_id}",
        f"controller.quorum.voters={quorum}",
        f"listeners=PLAINTEXT://{node.host}:{node.port},CONTROLLER://{node.host}:{node.controller_port}",
        f"advertised.listeners=PLAINTEXT://{node.address}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={node.directory / 'data'}",
        "num.partitions=1",
        "auto.create.topics.enable=false",
        # Kafka's own topics (consumer offsets, transactions) and any without explicit settings: replicated like ours.
        f"default.replication.factor={replication.factor}",
        f"min.insync.replicas={replication.min_insync}",
        f"offsets.topic.replication.factor={replication.factor}",
        f"transaction.state.log.replication.factor={replication.factor}",
        f"transaction.state.log.min.isr={replication.min_insync}",
        f"share.coordinator.state.topic.replication.factor={replication.factor}",
        f"share.coordinator.state.topic.min.isr={replication.min_insync}",
        "group.initial.rebalance.delay.ms=0",
        f"message.max.bytes={config.kafka.max_message_bytes}",
        "",
    ])


def _java() -> str:
    java = shutil.which("java")
    if not java:
        raise BrokerError("java not found on PATH: Kafka 4 needs a Java 17+ runtime")
    return java


def _classpath(config: Config) -> str:
    return ":".join(str(j) for j in jars.kafka_broker_jars(config))


def _jvm_args(config: Config) -> list[str]:
    log4j = resources.files("stack") / "kafka-log4j2.xml"
    return [
        _java(), f"-Xmx{config.kafka.heap}", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}", "-cp", _classpath(config),
    ]


def _random_cluster_id() -> str:
    # Kafka's Uuid text form: URL-safe base64 of 16 bytes without padding, never starting with '-'.
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _cluster_id(nodes: list[Node]) -> str:
    """The id a node already formatted carries (a node joining later must share it), else a new one."""
    for node in nodes:
        meta = node.directory / "data" / "meta.properties"
        if meta.exists():
            for line in meta.read_text().splitlines():
                if line.startswith("cluster.id="):
                    return line.split("=", 1)[1].strip()
    return _random_cluster_id()


def _format_storage(config: Config, node: Node, properties: Path, cluster_id: str) -> None:
    if (node.directory / "data" / "meta.properties").exists():
        return
    cmd = [*_jvm_args(config), "kafka.tools.StorageTool", "format",
           "-t", cluster_id, "-c", str(properties), "--ignore-formatted"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise BrokerError(f"kafka storage format failed ({node.service}):\n{done.stdout}\n{done.stderr}")


def admin(config: Config, timeout_s: float = 5.0, quiet: bool = False, bootstrap: str | None = None) -> AdminClient:
    settings: dict[str, object] = {"bootstrap.servers": bootstrap or config.kafka.bootstrap,
                                   "socket.timeout.ms": int(timeout_s * 1000)}
    if quiet:  # readiness probes expect "connection refused" while the broker boots
        settings["log_level"] = 0
    return AdminClient(settings)


def live_brokers(config: Config, timeout_s: float = 2.0, bootstrap: str | None = None) -> int:
    """How many brokers the cluster at ``bootstrap`` (default: the configured one) reports; 0 if unreachable."""
    try:
        meta = admin(config, timeout_s, quiet=True, bootstrap=bootstrap).list_topics(timeout=timeout_s)
    except KafkaException:
        return 0
    return len(meta.brokers)


def is_reachable(config: Config, timeout_s: float = 2.0) -> bool:
    """True once the broker answers a metadata request with at least one broker."""
    return live_brokers(config, timeout_s) > 0


def start(config: Config) -> None:
    """Format (first time) and start the local broker, returning once it accepts clients. Idempotent."""
    if not config.kafka.managed:
        raise BrokerError(f"kafka.bootstrap_servers={config.kafka.bootstrap_servers!r}: broker is external")
    start_nodes(config, [local_node(config)], Replication())


def start_nodes(config: Config, nodes: list[Node], replication: Replication) -> None:
    """Format (first time) and start ``nodes`` as one KRaft quorum, returning once every one of them is a live
    broker. Nodes already running are left alone."""
    bootstrap = ",".join(n.address for n in nodes)
    if all(services.state(config, n.service).running for n in nodes) and \
            live_brokers(config, bootstrap=bootstrap) == len(nodes):
        return
    cluster_id = _cluster_id(nodes)
    procs = {}
    for node in nodes:
        node.directory.mkdir(parents=True, exist_ok=True)
        properties = node.directory / "server.properties"
        properties.write_text(server_properties(config, node, nodes, replication))
        _format_storage(config, node, properties, cluster_id)
        if not services.state(config, node.service).running:
            # Started together: a quorum of several controllers elects a leader only once a majority is up.
            procs[node.service] = services.start(config, node.service,
                                                 [*_jvm_args(config), "kafka.Kafka", str(properties)])
    deadline = time.monotonic() + config.kafka.start_timeout_s
    problem = f"kafka did not have {len(nodes)} live broker(s) at {bootstrap} within {config.kafka.start_timeout_s}s"
    while time.monotonic() < deadline:
        exited = [name for name, proc in procs.items() if proc.poll() is not None]
        if exited:
            problem = f"{', '.join(exited)} exited while starting"
            break
        if live_brokers(config, timeout_s=1.0, bootstrap=bootstrap) == len(nodes):
            return
        time.sleep(0.5)
    logs = "\n".join(f"--- {n.service}\n{services.tail(services.log_file(config, n.service))}" for n in nodes)
    for node in nodes:   # a quorum missing a member is of no use: stop the rest too
        services.stop(config, node.service)
    raise BrokerError(f"{problem}:\n{logs}")


def stop(config: Config) -> bool:
    return services.stop(config, SERVICE, timeout_s=30.0)


def topic_specs(config: Config) -> list[NewTopic]:
    k = config.kafka
    return [
        NewTopic(k.events_topic, num_partitions=k.events_partitions, replication_factor=k.replication_factor,
                 config={
                     # received_time of records produced straight to Kafka = broker clock (BRIEF §1).
                     "message.timestamp.type": "LogAppendTime",
                     "retention.ms": str(k.events_retention_ms),
                     "max.message.bytes": str(k.max_message_bytes),
                     "cleanup.policy": "delete",
                     "min.insync.replicas": str(k.min_insync_replicas),
                 }),
        NewTopic(k.dead_letter_topic, num_partitions=1, replication_factor=k.replication_factor,
                 config={
                     "message.timestamp.type": "CreateTime",
                     "retention.ms": str(k.dead_letter_retention_ms),
                     "max.message.bytes": str(k.dead_letter_max_message_bytes),
                     "cleanup.policy": "delete",
                     "min.insync.replicas": str(k.min_insync_replicas),
                 }),
        # Alert transitions (firing, resolved) for other systems to consume; key = rule name.
        NewTopic(config.alerting.alerts_topic, num_partitions=1, replication_factor=k.replication_factor,
                 config={"retention.ms": str(k.dead_letter_retention_ms), "cleanup.policy": "delete",
                         "min.insync.replicas": str(k.min_insync_replicas)}),
    ]


def ensure_topics(config: Config, timeout_s: float = 30.0) -> list[str]:
    """Create the events and dead-letter topics if missing. Returns the names it created."""
    client = admin(config)
    existing = set(client.list_topics(timeout=timeout_s).topics)
    wanted = [t for t in topic_specs(config) if t.topic not in existing]
    if not wanted:
        return []
    created = []
    for name, future in client.create_topics(wanted, request_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise
    return created


def read_committed(config: Config, topic: str | None = None, timeout_s: float = 30.0) -> list[Message]:
    """Every record of ``topic`` (default: the events topic) that a ``read_committed`` reader sees, up to each
    partition's end, in partition then offset order. For tests, benchmarks and checks, not for processing."""
    topic = topic or config.kafka.events_topic
    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap, "group.id": f"check-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: dict[int, list[Message]] = {p: [] for p in partitions}
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(at_end) < len(partitions):
            if time.monotonic() > deadline:
                raise BrokerError(f"{topic}: partitions {set(partitions) - at_end} did not reach their end "
                                  f"within {timeout_s}s")
            for msg in consumer.consume(10_000, 0.5):
                if msg.error() is None:
                    records[msg.partition()].append(msg)
                elif msg.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                else:
                    raise BrokerError(f"{topic}: {msg.error()}")
        return [msg for p in partitions for msg in records[p]]
    finally:
        consumer.close()
