"""A request body to events to Kafka records: parse a batch (JSON array or NDJSON) within the gateway's limits,
then stamp, encode and validate each event. Pure and blocking: the routes run it in a worker thread."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ingest.gateway.validation import (
    RecordDecoder,
    Refused,
    depth_reason,
    duplicate_key,
    encoded_size,
    line_depths,
    printable,
    unicode_error,
    validation_error,
    without_deep_elements,
)
from ingest.gateway.wire import Problem, Rejection, RequestProblem

NDJSON_TYPES: Final = frozenset({"application/x-ndjson", "application/ndjson", "application/jsonl",
                                 "application/x-jsonlines"})


def _too_many(count: int, limit: int) -> RequestProblem:
    return RequestProblem(413, Problem(error="too_many_events",
                                       detail=f"{count} events > gateway.max_batch_events ({limit})"))


def _malformed(detail: str, line: int | None = None, column: int | None = None) -> RequestProblem:
    where = f" (line {line}, column {column})" if line is not None and column is not None else (
        f" (line {line})" if line is not None else "")
    return RequestProblem(400, Problem(error="malformed_json", detail=f"{detail}{where}", line=line, column=column))


def parse_batch(body: bytes, content_type: str, max_events: int, max_depth: int = 32) -> list[Any]:
    """The events of a request body: a JSON array, or NDJSON (one JSON value per line, blank lines skipped).

    NDJSON is read when the Content-Type says so (``application/x-ndjson``) or, whatever it says, when the
    body does not start with ``[`` (so ``curl --data-binary @events.ndjson`` works without a header). A body
    that does not parse is refused whole (400): a syntax error means a broken client or a truncated body, and
    refusing all of it keeps a retry simple. Raises :class:`RequestProblem`.

    A record that parses but cannot be taken is a :class:`~ingest.gateway.validation.Refused` in the list (rejected with
    its reason): one nested deeper than ``max_depth`` (found by a linear scan of the bytes and never given to the
    parser, whose recursion it would exhaust) or holding an object with a duplicate key (ambiguous: the
    stream job's parser and this one need not keep the same value).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _malformed(f"body is not UTF-8: invalid byte at offset {exc.start}") from None
    text = text.removeprefix("\ufeff")
    media = content_type.split(";", 1)[0].strip().lower()
    decoder = RecordDecoder()
    parsed: list[Any]
    if media not in NDJSON_TYPES and text.lstrip().startswith("["):
        shallow, deep = without_deep_elements(body, max_depth)
        if deep:
            text = shallow.decode("utf-8").removeprefix("\ufeff")
        try:
            events = decoder.decode(text)
        except json.JSONDecodeError as exc:
            raise _malformed(exc.msg, exc.lineno, exc.colno) from None
        except RecursionError:  # not an array of records (the scan found none to take out): nothing to split
            raise _malformed(f"nested deeper than {max_depth} levels (gateway.max_depth)") from None
        except ValueError as exc:
            raise _malformed(str(exc)) from None
        if len(events) > max_events:
            raise _too_many(len(events), max_events)
        parsed = list(events)
        for index in deep:
            parsed[index] = Refused(depth_reason(max_depth))
    else:
        lines = [(number, line) for number, line in enumerate(text.split("\n"), 1) if line.strip()]
        if len(lines) > max_events:  # before parsing: counting is cheap, parsing is not
            raise _too_many(len(lines), max_events)
        depths = line_depths(body) if lines else None
        parsed = []
        for number, line in lines:
            if depths is not None and depths[number - 1] > max_depth:
                parsed.append(Refused(depth_reason(max_depth)))
                continue
            try:
                parsed.append(decoder.decode(line))
            except json.JSONDecodeError as exc:
                raise _malformed(exc.msg, number, exc.colno) from None
            except RecursionError:  # after a broken line the scan's string boundaries may be off
                parsed.append(Refused(depth_reason(max_depth)))
            except ValueError as exc:
                raise _malformed(str(exc), number) from None
    if decoder.duplicates:
        for index, event in enumerate(parsed):
            if (key := duplicate_key(event)) is not None:
                event_id = event.get("id") if isinstance(event, dict) else None
                parsed[index] = Refused(f"invalid JSON: duplicate key: {key}",
                                        event_id if isinstance(event_id, str) else None)
    return parsed


@dataclass(frozen=True)
class PreparedBatch:
    """Kafka records (key, value) of the valid events, in batch order, and the rejected ones."""

    records: list[tuple[bytes, bytes]]
    rejected: list[Rejection]


_COMPACT: Final = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
"""``eventide.envelope.encode``'s format; one encoder, as ``json.dumps`` builds a new one per call with options."""


def prepare_batch(events: Sequence[object], received_time: int, max_record_bytes: int, *,
                  apps: frozenset[str] | None = None, check_unicode: bool = True) -> PreparedBatch:
    """Stamp ``received_time`` on every event object, encode it as compact JSON and validate it.

    The stamp goes on before validation and measuring, so the size checked is the size written, and a
    client's own ``received_time`` (whatever its type) is replaced rather than judged. ``apps``: the apps the
    request's token may write (None: any). ``check_unicode=False`` skips the lone-surrogate check, for a body
    known to hold none (:func:`~ingest.gateway.validation.may_hold_surrogates`).
    """
    records: list[tuple[bytes, bytes]] = []
    rejected: list[Rejection] = []

    def reject(index: int, event_id: object, reason: str) -> None:
        # Reasons and ids may quote the client's text, lone surrogates included: escaped, so the answer encodes.
        rejected.append(Rejection(index=index, id=printable(event_id) if isinstance(event_id, str) else None,
                                  reason=printable(reason)))

    for index, raw in enumerate(events):
        if isinstance(raw, Refused):
            reject(index, raw.id, raw.reason)
            continue
        if check_unicode and (reason := unicode_error(raw)) is not None:
            # First: nothing of such an event can be encoded for Kafka, nor quoted in a reason.
            reject(index, raw.get("id") if isinstance(raw, dict) else None, reason)
            continue
        event = {**raw, "received_time": received_time} if isinstance(raw, dict) else raw
        value: bytes | None
        try:
            value = _COMPACT.encode(event).encode()
            size = len(value)
        except ValueError:  # a non-finite number (1e999): not representable in JSON
            value, size = None, encoded_size(event)
        reason = validation_error(event, max_record_bytes, record_bytes=size)
        if reason is None and value is None:  # e.g. 1e999 in a field the envelope does not define
            reason = "invalid field: numbers must be finite"
        if reason is None and apps is not None and event["app"] not in apps:  # type: ignore[index]
            reason = f"token not allowed to write app {event['app']}"  # type: ignore[index]
        if reason is not None:
            reject(index, raw.get("id") if isinstance(raw, dict) else None, reason)
            continue
        assert isinstance(event, dict) and value is not None  # a valid envelope is an encodable object
        records.append((event["device"].encode(), value))
    return PreparedBatch(records, rejected)
