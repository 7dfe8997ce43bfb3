"""Alert notifications: a webhook (retries with exponential backoff) and a Kafka topic.

Delivery is tracked per (transition, channel) in ``alert_notifications``: a transition is sent until a channel
confirms it, then never again, also after restarts. (A crash between a confirmed send and its record means one
repeat: at-least-once, with the transition key in every payload for receivers that deduplicate.)
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any, Protocol

from confluent_kafka import Producer

from alerting.evaluator import undelivered
from eventide.config import Config
from store.client import connect

log = logging.getLogger("eventide.alerting")


class Channel(Protocol):
    name: str

    def send(self, payload: dict[str, Any]) -> int:
        """Deliver one notification; returns the attempts it took. Raises when it could not be delivered."""
        ...


def payload(row: dict[str, Any]) -> dict[str, Any]:
    """The JSON body of one notification."""
    return {
        "key": row["transition_key"], "rule": row["rule"], "series": row["series"],
        "status": row["to_state"], "severity": row["severity"],
        "window_end": row["window_end"].replace(tzinfo=UTC).isoformat(), "value": row["value"],
        "threshold": row["threshold"],
    }


class WebhookChannel:
    name = "webhook"

    def __init__(self, url: str, attempts: int, backoff_s: float, timeout_s: float = 5.0) -> None:
        self.url, self.attempts, self.backoff_s, self.timeout_s = url, attempts, backoff_s, timeout_s

    def send(self, payload: dict[str, Any]) -> int:
        body = json.dumps(payload).encode()
        delay = self.backoff_s
        for attempt in range(1, self.attempts + 1):
            request = urllib.request.Request(self.url, data=body, method="POST",
                                             headers={"Content-Type": "application/json",
                                                      "Idempotency-Key": payload["key"]})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    if 200 <= response.status < 300:
                        return attempt
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if isinstance(exc, urllib.error.HTTPError) and 400 <= exc.code < 500 and exc.code != 429:
                    raise RuntimeError(f"webhook {self.url} refused the notification: {exc}") from exc
                log.warning("webhook %s attempt %d/%d failed: %s", self.url, attempt, self.attempts, exc)
            if attempt < self.attempts:
                time.sleep(delay)
                delay *= 2
        raise RuntimeError(f"webhook {self.url} failed {self.attempts} times")


class KafkaChannel:
    name = "kafka"

    def __init__(self, config: Config) -> None:
        self.topic = config.alerting.alerts_topic
        self._producer = Producer({"bootstrap.servers": config.kafka.bootstrap, "acks": "all",
                                   "enable.idempotence": True})

    def send(self, payload: dict[str, Any]) -> int:
        failures: list[str] = []
        self._producer.produce(self.topic, json.dumps(payload).encode(), payload["rule"].encode(),
                               on_delivery=lambda err, _msg: failures.append(str(err)) if err else None)
        if self._producer.flush(10) or failures:
            raise RuntimeError(f"Kafka topic {self.topic} did not take the notification: {failures}")
        return 1


def channels(config: Config) -> list[Channel]:
    found: list[Channel] = [KafkaChannel(config)]
    if config.alerting.webhook_url:
        found.append(WebhookChannel(config.alerting.webhook_url, config.alerting.webhook_attempts,
                                    config.alerting.webhook_backoff_s))
    return found


def deliver(config: Config, targets: list[Channel]) -> dict[str, int]:
    """Send every undelivered firing/resolved transition on every channel; returns deliveries per channel.
    A channel that fails keeps its remaining notifications for the next call (order is kept)."""
    delivered: dict[str, int] = {}
    for channel in targets:
        with connect(config) as client:
            pending = undelivered(client, channel.name)
        delivered[channel.name] = 0
        for row in pending:
            try:
                attempts = channel.send(payload(row))
            except Exception as exc:
                log.error("alert notification %s via %s failed: %s", row["transition_key"], channel.name, exc)
                break
            with connect(config) as client:
                client.insert("alert_notifications", [[row["transition_key"], channel.name, attempts,
                                                       datetime.now(UTC)]],
                              column_names=["transition_key", "channel", "attempts", "delivered_at"])
            delivered[channel.name] += 1
    return delivered
