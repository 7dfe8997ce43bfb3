"""OTLP log records as v1 log envelopes (docs/ingest.md has the table): severity as level, body as message,
attributes, trace and span ids as tags."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from eventide.config import OtlpConfig
from ingest.gateway.otlp.mapping import (
    Mapped,
    Timing,
    envelope,
    in_scope,
    out_of_scope,
    plain,
    record_id,
    refuse_all,
    scope_digest,
    source_of,
    tags_of,
)

DEFAULT_LOGGER: Final = "otlp"
"""Logger ``name`` of records whose instrumentation scope has no name."""

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
