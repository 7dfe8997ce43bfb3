"""OTLP/HTTP's wire: media types, compression, parsing requests, encoding answers.

The wire (opentelemetry-proto's ``docs/specification.md``, "OTLP/HTTP"): a body of binary protobuf
(``application/x-protobuf``) or JSON (``application/json``: trace and span ids in hex, enums as integers, 64-bit
integers as strings or numbers, unknown fields ignored), optionally ``Content-Encoding: gzip``, decoded with the
``opentelemetry-proto`` package's generated classes. The answer is an ``Export*ServiceResponse`` in the request's
encoding, with ``partial_success`` counting the records not written and why; a request refused as a whole is
answered with a ``google.rpc.Status``, retryable only as 429/502/503/504.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterable
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

Media = Literal["protobuf", "json"]
Signal = Literal["logs", "metrics"]

PROTOBUF: Final = "application/x-protobuf"
JSON: Final = "application/json"

# google.rpc.Code values for the Status body of a refused request.
_GRPC_CODES: Final = {400: 3, 401: 16, 408: 4, 413: 3, 415: 3, 429: 8, 502: 14, 503: 14, 504: 4}


class OtlpRefused(Exception):
    """A request refused as a whole (nothing written): answered with ``status`` and a ``google.rpc.Status``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


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
