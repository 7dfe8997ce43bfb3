"""OTLP records as v1 envelopes, what logs and metrics share: who sent them (:class:`Source`), stable record ids,
the device's timing (:class:`Timing`), the result of mapping a request (:class:`Mapped`) and the envelope itself.

The mapping (docs/ingest.md, "OpenTelemetry (OTLP/HTTP)") is pure functions of the request, its receive time and
the clock corrections; :class:`ingest.gateway.otlp.routes.OtlpIngest` adds what is remembered between requests
(:mod:`ingest.gateway.otlp.state`) and turns the envelopes into Kafka records with the gateway's validation
(:func:`ingest.gateway.batches.prepare_batch`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from google.protobuf.message import Message
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from eventide.config import OtlpConfig
from eventide.envelope import ENVELOPE_VERSION

UNKNOWN_SERVICE: Final = "unknown_service"
"""``app`` of a resource without ``service.name``: what OpenTelemetry SDKs themselves report then."""


def plain(value: AnyValue) -> Any:
    """An ``AnyValue`` as a JSON-able Python value (bytes as base64)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [plain(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: plain(kv.value) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if which == "double_value" and not math.isfinite(value.double_value):
        return str(value.double_value)
    return getattr(value, which)


def text(value: AnyValue) -> str:
    """An ``AnyValue`` as tag text: strings as they are, ``true``/``false``, numbers, other values as JSON."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which == "bool_value":
        return "true" if value.bool_value else "false"
    if which == "int_value":
        return str(value.int_value)
    if which == "double_value":
        return repr(value.double_value)
    if which is None:
        return ""
    return json.dumps(plain(value), separators=(",", ":"), ensure_ascii=False)


def tags_of(attributes: Sequence[KeyValue], leave_out: str = "") -> dict[str, str]:
    return {kv.key: text(kv.value) for kv in attributes if kv.key != leave_out}


@dataclass(frozen=True)
class Source:
    """Who sent a resource's records: ``app`` (``service.name``), ``device`` and its attributes as text."""

    app: str
    device: str
    attributes: dict[str, str]
    digest: bytes
    """Hash of the whole resource: part of every record id and cumulative series key, and the key of its clock
    offset estimate (not the device name: resources without ``host.name`` share the default device, and one
    skewed clock among them must not move the others' estimate)."""


def source_of(resource: Resource, settings: OtlpConfig) -> Source:
    """``app`` from ``service.name``; ``device`` from ``host.name``, else ``service.instance.id``, else the
    configured default. ``host.name`` first: a device's clock is its host's, and the clock offset is per device."""
    attributes = tags_of(resource.attributes)
    app = attributes.get("service.name") or UNKNOWN_SERVICE
    device = attributes.get("host.name") or attributes.get("service.instance.id") or settings.default_device
    digest = hashlib.blake2b(resource.SerializeToString(deterministic=True), digest_size=16).digest()
    return Source(app, device, attributes, digest)


def record_id(source: Source, scope_digest: bytes, position: tuple[int, ...], content: bytes) -> str:
    """An id that is the same whenever the same request is sent again: a hash of the resource, the scope, the
    record's position in the request and its content. Different records of one request never share one (their
    positions differ), and a re-sent copy is recognised by the pipeline's (app, id) dedup."""
    packed = struct.pack(f"<{len(position)}I", *position)
    return hashlib.blake2b(b"".join((source.digest, scope_digest, packed, content)), digest_size=16).hexdigest()


def scope_digest(scope: Message) -> bytes:
    return hashlib.blake2b(scope.SerializeToString(deterministic=True), digest_size=16).digest()


@dataclass(frozen=True)
class Timing:
    """The timestamps of one device's records in one request (OTLP has no send time).

    ``correction_ms`` is the device's clock correction (server - device,
    :class:`ingest.gateway.otlp.state.ClockOffsets`), so the request was sent at ``received_ms - correction_ms`` on
    the device clock: that is ``sent_time``, and the pipeline's ``corrected = event_time + received - sent``
    becomes ``event_time + correction_ms``. A record a little ahead of that send time (the estimate is a minimum
    over a period, or below the threshold) gets ``sent_time = event_time`` (the v1 rule ``event_time <=
    sent_time``): it is corrected to the receive time.
    """

    received_ms: int
    correction_ms: int
    max_future_ms: int
    max_age_ms: int

    def stamp(self, device_ms: int) -> tuple[int, int] | str:
        """(event_time, sent_time) for a record that happened at ``device_ms`` (0: unknown, then the send time),
        or why it is outside the accepted bounds."""
        sent = self.received_ms - self.correction_ms
        if device_ms <= 0:
            return sent, sent
        if device_ms > sent + self.max_future_ms:
            return (f"time {device_ms} is {(device_ms - sent) / 1000:.0f}s after the request was sent by the "
                    f"device's clock (otlp.max_future_s {self.max_future_ms / 1000:g})")
        if device_ms + self.correction_ms < self.received_ms - self.max_age_ms:
            return (f"time {device_ms} is more than otlp.max_age_s ({self.max_age_ms / 1000:g}) before the "
                    f"gateway received it")
        return device_ms, max(sent, device_ms)


@dataclass
class Mapped:
    """Envelopes made from a request (without ``received_time``), each with the number of the OTLP record (log
    record or data point, counted across the request) it came from, and the records refused while mapping."""

    records: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)

    def add(self, owner: int, event: dict[str, Any]) -> None:
        self.events.append(event)
        self.owners.append(owner)

    def cost(self) -> int:
        """What mapping made, in rate-limit units: each record the envelopes it became, at least one (a refused
        record cost its decoding too)."""
        return len(self.events) + self.records - len(set(self.owners))


def out_of_scope(app: str) -> str:
    """The reason for a record of an app the request's token may not write (the same as ``POST /v1/events``)."""
    return f"token not allowed to write app {app}"


def in_scope(source: Source, apps: frozenset[str] | None) -> bool:
    """Whether the token (its ``apps``; None: any) may write ``source``'s records. Checked before a record touches
    anything kept between requests (clock estimates, series budgets, cumulative series), so a token can change
    no other app's state."""
    return apps is None or source.app in apps


def refuse_all(mapped: Mapped, records: int, reason: str) -> None:
    """Count ``records`` more records, each refused for ``reason``."""
    for owner in range(mapped.records, mapped.records + records):
        mapped.refused[owner] = reason
    mapped.records += records


def envelope(kind: str, event_id: str, source: Source, name: str, event_time: int, sent_time: int,
             user: str | None, tags: Mapping[str, str], **body: Any) -> dict[str, Any]:
    """A v1 envelope in :func:`eventide.envelope.metric_event`'s / ``log_event``'s field order."""
    event: dict[str, Any] = {"v": ENVELOPE_VERSION, "id": event_id, "kind": kind, "app": source.app,
                             "device": source.device, "name": name, **body, "event_time": event_time,
                             "sent_time": sent_time}
    if user is not None:
        event["user"] = user
    if tags:
        event["tags"] = dict(tags)
    return event
