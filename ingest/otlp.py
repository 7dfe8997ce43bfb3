"""OpenTelemetry OTLP/HTTP logs and metrics as v1 envelopes (BRIEF §1): decoding, mapping, answers.

The wire (opentelemetry-proto's ``docs/specification.md``, "OTLP/HTTP"): a body of binary protobuf
(``application/x-protobuf``) or JSON (``application/json``: trace and span ids in hex, enums as integers, 64-bit
integers as strings or numbers, unknown fields ignored), optionally ``Content-Encoding: gzip``, decoded with the
``opentelemetry-proto`` package's generated classes. The answer is an ``Export*ServiceResponse`` in the request's
encoding, with ``partial_success`` counting the records not written and why; a request refused as a whole is
answered with a ``google.rpc.Status``, retryable only as 429/502/503/504.

The mapping (docs/ingest.md, "OpenTelemetry (OTLP/HTTP)") is pure functions of the request, its receive time and
the clock corrections; :class:`OtlpIngest` adds what is remembered between requests (:mod:`ingest.otlp_state`)
and turns the envelopes into Kafka records with the gateway's validation (:func:`ingest.gateway_batches.prepare_batch`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from eventide.config import OtlpConfig
from eventide.envelope import ENVELOPE_VERSION

Media = Literal["protobuf", "json"]
Signal = Literal["logs", "metrics"]

PROTOBUF: Final = "application/x-protobuf"
JSON: Final = "application/json"
UNKNOWN_SERVICE: Final = "unknown_service"
"""``app`` of a resource without ``service.name``: what OpenTelemetry SDKs themselves report then."""
DEFAULT_LOGGER: Final = "otlp"
"""Logger ``name`` of records whose instrumentation scope has no name."""

# google.rpc.Code values for the Status body of a refused request.
_GRPC_CODES: Final = {400: 3, 401: 16, 408: 4, 413: 3, 415: 3, 429: 8, 502: 14, 503: 14, 504: 4}


class OtlpRefused(Exception):
    """A request refused as a whole (nothing written): answered with ``status`` and a ``google.rpc.Status``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


# ----------------------------------------------------------------------------------------------------------
# Wire: media types, gzip, parsing, answers


def media_of(content_type: str) -> Media:
    """The encoding named by a Content-Type. Raises :class:`OtlpRefused` (415) for any other."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == PROTOBUF:
        return "protobuf"
    if media == JSON:
        return "json"
    raise OtlpRefused(415, f"unsupported Content-Type {content_type!r}: OTLP/HTTP takes {PROTOBUF} or {JSON}")


_WINDOW_BITS: Final = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""zlib's ``wbits`` per Content-Encoding: 16 + window for the gzip wrapper, the window alone for zlib's."""


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` decoded per its Content-Encoding (``gzip``, ``deflate`` (zlib, as HTTP defines it; the Python
    exporter offers it) or none), refused (413) once the decoded bytes exceed ``limit``: a small compressed body may
    expand a thousandfold, so it is never inflated beyond the limit."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    window = _WINDOW_BITS.get(encoding)
    if window is None:
        raise OtlpRefused(415, f"unsupported Content-Encoding {encoding!r}: gzip, deflate or none")
    out = bytearray()
    data = body
    try:
        while data:
            inflater = zlib.decompressobj(window)
            out += inflater.decompress(data, limit + 1 - len(out))
            if len(out) > limit:
                raise OtlpRefused(413, f"body larger than gateway.max_body_bytes ({limit}) once decompressed",
                                  {"Connection": "close"})
            if not inflater.eof:
                raise OtlpRefused(400, f"{encoding} body is truncated")
            data = inflater.unused_data   # a further gzip member (concatenated members are one stream)
    except zlib.error as exc:
        raise OtlpRefused(400, f"body is not valid {encoding}: {exc}") from None
    return bytes(out)


_ID_KEYS: Final = ("traceId", "spanId", "trace_id", "span_id")


def _hex_ids(records: Iterable[Any]) -> None:
    """OTLP/JSON writes trace and span ids in hex, protobuf's JSON mapping expects base64: convert in place."""
    for record in records:
        if not isinstance(record, dict):
            continue
        for key in _ID_KEYS:
            value = record.get(key)
            if isinstance(value, str) and value:
                try:
                    record[key] = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError:
                    raise OtlpRefused(400, f"{key} {value[:64]!r} is not hex (OTLP/JSON)") from None


def _items(parent: Any, *keys: str) -> list[Any]:
    if not isinstance(parent, dict):
        return []
    for key in keys:
        value = parent.get(key)
        if isinstance(value, list):
            return value
    return []


def _fix_json_ids(document: Any, signal: Signal) -> None:
    for resource in _items(document, "resourceLogs", "resource_logs", "resourceMetrics", "resource_metrics"):
        for scope in _items(resource, "scopeLogs", "scope_logs", "scopeMetrics", "scope_metrics"):
            if signal == "logs":
                _hex_ids(_items(scope, "logRecords", "log_records"))
                continue
            for metric in _items(scope, "metrics"):
                if not isinstance(metric, dict):
                    continue
                for kind in ("gauge", "sum", "histogram", "exponentialHistogram", "exponential_histogram"):
                    for point in _items(metric.get(kind), "dataPoints", "data_points"):
                        _hex_ids(_items(point, "exemplars"))


def parse_request(body: bytes, media: Media, signal: Signal) -> Message:
    """The ``Export{Logs,Metrics}ServiceRequest`` in ``body``. Raises :class:`OtlpRefused` (400)."""
    message: Message = ExportLogsServiceRequest() if signal == "logs" else ExportMetricsServiceRequest()
    if media == "protobuf":
        try:
            message.ParseFromString(body)
        except DecodeError as exc:
            raise OtlpRefused(400, f"body is not a valid protobuf {type(message).__name__}: {exc}") from None
        return message
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:   # UnicodeDecodeError is a ValueError
        raise OtlpRefused(400, f"body is not JSON: {exc}") from None
    _fix_json_ids(document, signal)
    try:
        json_format.ParseDict(document, message, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise OtlpRefused(400, f"body is not an OTLP/JSON {type(message).__name__}: {exc}") from None
    return message


def encode(message: Message, media: Media) -> tuple[bytes, str]:
    """``message`` in the request's encoding, and its Content-Type."""
    if media == "json":
        return json_format.MessageToJson(message, indent=None).encode(), JSON
    return message.SerializeToString(), PROTOBUF


def status_body(status: int, text: str, media: Media) -> tuple[bytes, str]:
    """A ``google.rpc.Status`` (the body of every OTLP/HTTP error answer) in the request's encoding."""
    return encode(status_pb2.Status(code=_GRPC_CODES.get(status, 2), message=text), media)


def export_response(signal: Signal, rejected: int, message: str) -> Message:
    """The success answer: empty when everything was written, else with ``partial_success``."""
    if signal == "logs":
        if not rejected:
            return ExportLogsServiceResponse()
        return ExportLogsServiceResponse(partial_success=ExportLogsPartialSuccess(
            rejected_log_records=rejected, error_message=message))
    if not rejected:
        return ExportMetricsServiceResponse()
    return ExportMetricsServiceResponse(partial_success=ExportMetricsPartialSuccess(
        rejected_data_points=rejected, error_message=message))


# ----------------------------------------------------------------------------------------------------------
# Mapping helpers shared by logs and metrics


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

    ``correction_ms`` is the device's clock correction (server - device, :class:`ingest.otlp_state.ClockOffsets`),
    so the request was sent at ``received_ms - correction_ms`` on the device clock: that is ``sent_time``, and the
    pipeline's ``corrected = event_time + received - sent`` becomes ``event_time + correction_ms``. A record a little
    ahead of that send time (the estimate is a minimum over a period, or below the threshold) gets ``sent_time =
    event_time`` (the v1 rule ``event_time <= sent_time``): it is corrected to the receive time.
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


# ----------------------------------------------------------------------------------------------------------
# Logs

_LEVEL_BY_NUMBER: Final = ("debug",) * 8 + ("info",) * 4 + ("warning",) * 4 + ("error",) * 4 + ("critical",) * 4
_LEVEL_BY_TEXT: Final = {
    "trace": "debug", "debug": "debug", "info": "info", "information": "info", "notice": "info",
    "warn": "warning", "warning": "warning", "error": "error", "err": "error", "fatal": "critical",
    "critical": "critical", "crit": "critical", "alert": "critical", "emerg": "critical", "emergency": "critical",
    "panic": "critical",
}


def level_of(severity_number: int, severity_text: str) -> str:
    """OTLP severity as a v1 level: numbers 1-8 (TRACE, DEBUG) debug, 9-12 info, 13-16 warning, 17-20 error,
    21-24 (FATAL) critical; an unset number falls back on the text (``WARN``, ``Error``, …), else info."""
    if 1 <= severity_number <= 24:
        return _LEVEL_BY_NUMBER[severity_number - 1]
    return _LEVEL_BY_TEXT.get(severity_text.strip().lower(), "info")


def message_of(body: AnyValue) -> str:
    """A log body as the message: a string as it is, any other value as compact JSON, none as ``""``."""
    if body.WhichOneof("value") == "string_value":
        return body.string_value
    value = plain(body)
    return "" if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def latest_log_times(request: ExportLogsServiceRequest, settings: OtlpConfig,
                     apps: frozenset[str] | None = None) -> dict[bytes, int]:
    """Per resource (:attr:`Source.digest`), the latest time (ms, device clock) among the request's records, which
    the clock offset estimate compares with the receive time: the latest observed time (an SDK stamps it from its
    clock when the record is emitted), else, when no record has one, the latest time the records happened (a time
    an application chose, e.g. one read from a log file, could be anything). Resources of apps outside ``apps``
    are left out: they give no estimate."""
    latest: dict[bytes, int] = {}
    for resource_logs in request.resource_logs:
        source = source_of(resource_logs.resource, settings)
        if not in_scope(source, apps):
            continue
        key = source.digest
        records = [r for s in resource_logs.scope_logs for r in s.log_records]
        newest = max((r.observed_time_unix_nano for r in records), default=0) or \
            max((r.time_unix_nano for r in records), default=0)
        newest //= 1_000_000
        if newest > 0:
            latest[key] = max(latest.get(key, 0), newest)
    return latest


def count_log_records(request: ExportLogsServiceRequest) -> int:
    """The log records of a request, counted without looking at any of them."""
    return sum(len(s.log_records) for r in request.resource_logs for s in r.scope_logs)


def map_logs(request: ExportLogsServiceRequest, timings: Mapping[bytes, Timing], default: Timing,
             settings: OtlpConfig, apps: frozenset[str] | None = None) -> Mapped:
    """Each ``LogRecord`` as one log envelope (docs/ingest.md has the table). ``timings``: per resource digest
    (else ``default``). Records of apps outside ``apps`` (None: any) are refused unread."""
    mapped = Mapped()
    user_key = settings.user_attribute
    for r, resource_logs in enumerate(request.resource_logs):
        source = source_of(resource_logs.resource, settings)
        if not in_scope(source, apps):
            refuse_all(mapped, sum(len(s.log_records) for s in resource_logs.scope_logs), out_of_scope(source.app))
            continue
        timing = timings.get(source.digest, default)
        resource_user = source.attributes.get(user_key)
        for s, scope_logs in enumerate(resource_logs.scope_logs):
            scope = scope_digest(scope_logs.scope)
            name = scope_logs.scope.name or DEFAULT_LOGGER
            for i, record in enumerate(scope_logs.log_records):
                owner = mapped.records
                mapped.records += 1
                stamped = timing.stamp((record.time_unix_nano or record.observed_time_unix_nano) // 1_000_000)
                if isinstance(stamped, str):
                    mapped.refused[owner] = stamped
                    continue
                tags = tags_of(record.attributes)
                user = tags.pop(user_key, resource_user)
                if record.trace_id:
                    tags["trace_id"] = record.trace_id.hex()
                if record.span_id:
                    tags["span_id"] = record.span_id.hex()
                if record.event_name:
                    tags["event.name"] = record.event_name
                event_id = record_id(source, scope, (r, s, i), record.SerializeToString(deterministic=True))
                mapped.add(owner, envelope("log", event_id, source, name, *stamped, user, tags,
                                           level=level_of(record.severity_number, record.severity_text),
                                           message=message_of(record.body)))
    return mapped
