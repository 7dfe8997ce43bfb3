"""Minimal ingest SDK: emit metric and log events in the v1 envelope to Kafka.

    from ingest.sdk import Client
    with Client(app="checkout") as events:
        events.metric("latency_ms", 12.5, user="u-42")

``event_time`` is read from the device clock when the call is made; ``sent_time`` is stamped, from the same clock,
when the event is handed to the Kafka producer. The record key is the device, so one device's events stay ordered
in one partition. (Batching in a background thread, overflow policies and the offline spool are the SDK issue's.)
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from confluent_kafka import Producer

from eventide.config import Config, load_config
from ingest.envelope import encode, log_event, metric_event, now_ms


class DeliveryError(RuntimeError):
    """Kafka did not acknowledge some events before ``flush`` timed out or failed them."""


class Client:
    """Emits events for one app running on one device."""

    def __init__(self, app: str, device: str | None = None, *, config: Config | None = None,
                 clock: Callable[[], int] = now_ms, producer_settings: Mapping[str, Any] | None = None) -> None:
        """``clock`` returns the device clock in Unix ms (override it to simulate a skewed device)."""
        self.config = config or load_config()
        self.app = app
        self.device = device or socket.gethostname()
        self.clock = clock
        self._failed: list[str] = []
        self._producer = Producer({
            "bootstrap.servers": self.config.kafka.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "lz4",
            "linger.ms": 20,
            **(producer_settings or {}),
        })

    def metric(self, name: str, value: float, *, user: str | None = None,
               tags: Mapping[str, str] | None = None, event_time: int | None = None) -> str:
        """Record one metric observation; returns the event id."""
        event = metric_event(app=self.app, device=self.device, name=name, value=value,
                             event_time=self.clock() if event_time is None else event_time, sent_time=0,
                             user=user, tags=tags)
        return self._send(event)

    def log(self, level: str, message: str, *, name: str = "app", user: str | None = None,
            tags: Mapping[str, str] | None = None, event_time: int | None = None) -> str:
        """Record one log line at ``level`` (debug, info, warning, error, critical); returns the event id."""
        event = log_event(app=self.app, device=self.device, name=name, level=level, message=message,
                          event_time=self.clock() if event_time is None else event_time, sent_time=0,
                          user=user, tags=tags)
        return self._send(event)

    def send_raw(self, value: bytes, key: str | None = None) -> None:
        """Produce an already-encoded record as is (tests and the demo use it for malformed input)."""
        self._produce(value, key or self.device)

    def _send(self, event: dict[str, Any]) -> str:
        event["sent_time"] = max(self.clock(), event["event_time"])
        self._produce(encode(event), self.device)
        return str(event["id"])

    def _produce(self, value: bytes, key: str) -> None:
        while True:
            try:
                self._producer.produce(self.config.kafka.events_topic, value=value, key=key.encode(),
                                       on_delivery=self._on_delivery)
                break
            except BufferError:  # local queue full: let the producer drain, then retry
                self._producer.poll(0.05)
        self._producer.poll(0)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._failed.append(str(err))

    def flush(self, timeout_s: float = 30.0) -> None:
        """Block until Kafka acknowledged everything sent so far; raises :class:`DeliveryError` otherwise."""
        remaining = self._producer.flush(timeout_s)
        if remaining or self._failed:
            failed, self._failed = self._failed, []
            raise DeliveryError(f"{remaining} events unacknowledged, {len(failed)} failed: {failed[:3]}")

    def close(self, timeout_s: float = 30.0) -> None:
        self.flush(timeout_s)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
