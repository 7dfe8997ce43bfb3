"""Helpers for SDK and gateway tests: a fresh topic on the session broker, and reading a topic back."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from eventide.config import Config
from stack import broker


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


def consume_all(config: Config, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """Every committed record of the events topic, decoded, in partition-then-offset order."""
    return [json.loads(msg.value()) for msg in broker.read_committed(config, timeout_s=timeout_s)]
