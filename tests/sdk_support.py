"""Helpers for SDK and gateway tests: a fresh topic on the session broker, and reading a topic back."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from eventide import broker
from eventide.config import Config


def fresh_topic(kafka: Config, name: str, spool_root: Path, partitions: int = 1, **sections: Any) -> Config:
    """``kafka`` with its own events topic and SDK spool, plus section overrides (``sdk={...}``)."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60]
    update: dict[str, Any] = {
        "kafka": kafka.kafka.model_copy(update={"events_topic": f"sdk.{slug}", "events_partitions": partitions}),
        "sdk": kafka.sdk.model_validate({**kafka.sdk.model_dump(), "spool_dir": spool_root / "spool",
                                         "health_interval_s": 0, **sections.pop("sdk", {})}),
    }
    for section, values in sections.items():
        update[section] = getattr(kafka, section).model_validate({**getattr(kafka, section).model_dump(), **values})
    config = kafka.model_copy(update=update)
    broker.ensure_topics(config)
    return config


def consume_all(config: Config, timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """Every committed record of the events topic, decoded, in partition-then-offset order."""
    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap, "group.id": f"read-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        topic = config.kafka.events_topic
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: dict[int, list[tuple[int, dict[str, Any]]]] = {p: [] for p in partitions}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batch = consumer.consume(10_000, 0.5)
            for msg in batch:
                if not msg.error():
                    records[msg.partition()].append((msg.offset(), json.loads(msg.value())))
            # position() is past transaction markers too, so it reaches the high watermark.
            if not batch and all(tp.offset >= ends[tp.partition] or (tp.offset < 0 and not ends[tp.partition])
                                 for tp in consumer.position([TopicPartition(topic, p) for p in partitions])):
                break
        return [record for p in sorted(records) for _, record in sorted(records[p], key=lambda r: r[0])]
    finally:
        consumer.close()
