"""Envelope v1 validation in pure Python, mirroring the stream job's rules (``analytics.accept.validation._rules``).

The HTTP gateway runs this before it writes anything, so a client learns at once why an event was refused,
and an event the gateway accepts is one the stream job accepts. The rules, their order (the first failure is the
reason) and the reason strings are the stream job's. Type names in ``mistyped field`` reasons are the ones
Spark's ``schema_of_variant`` reports for the same JSON (``BIGINT``, ``DECIMAL(2,1)``, ``DOUBLE``, ``STRING``,
``BOOLEAN``, ``VOID``, ``OBJECT<a: BIGINT>``, ``ARRAY<…>``), measured on Spark 4.1.

JSON typing is strict, as in the stream job: ``true`` is not an integer or a number, ``"5"`` is not an integer,
``5.0`` is not an integer ms. A JSON ``null`` in an optional field counts as absent, in a required one as missing.

Known difference: the stream job tests tag values on the rendered type string, so a tag *key* containing
``": "`` would be refused there and is accepted here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from decimal import Context, Decimal, InvalidOperation
from typing import Any, Final

import numpy as np

from eventide.envelope import ENVELOPE_VERSION, KINDS, LEVELS, MAX_APP_CHARS, MAX_DEVICE_CHARS, MAX_NAME_CHARS

_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_MAX_DECIMAL_DIGITS: Final = 38
# Exact arithmetic on any decimal a JSON text can hold; the default context rounds at 28 digits.
_EXACT: Final = Context(prec=1000)
_DECIMAL_CHARS: Final = frozenset("-.0123456789")


class JsonFloat(float):
    """A JSON number with a fraction or exponent that remembers its source text.

    Spark types such a number by its text (``1.5`` is ``DECIMAL(2,1)``, ``1e3`` is ``DOUBLE``), which a plain
    float has lost; :func:`loads` builds these so reasons name the type the stream job would name.
    """

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str) -> JsonFloat:
        number = super().__new__(cls, text)
        number.text = text
        return number


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def loads(text: str | bytes) -> Any:
    """``json.loads`` for envelopes: numbers with a fraction keep their text, ``NaN``/``Infinity`` are refused.

    Python's parser accepts ``NaN`` and ``Infinity`` literals, which are not JSON and which Spark cannot parse.
    ``1e999`` is valid JSON and becomes an infinite float, as in Spark (then ``value must be finite``).
    """
    return _DECODER.decode(text.decode() if isinstance(text, bytes) else text)


# One decoder: json.loads with options builds a new one per call, which costs more than a short NDJSON line.
_DECODER: Final = json.JSONDecoder(parse_float=JsonFloat, parse_constant=_reject_constant)


# Types as small tuples, rendered like Spark's schema_of_variant; tuples so array element types can be merged.
_Type = tuple[Any, ...]
_VOID: Final[_Type] = ("VOID",)
_BIGINT: Final[_Type] = ("BIGINT",)
_DOUBLE: Final[_Type] = ("DOUBLE",)
_VARIANT: Final[_Type] = ("VARIANT",)


def _number_text_type(text: str) -> _Type:
    # Spark's variant builder stores a number as a decimal when its text has no exponent and it fits
    # DECIMAL(38); the schema then shows it with trailing zeros stripped (5.0 -> DECIMAL(1,0)).
    if not set(text) <= _DECIMAL_CHARS:
        return _DOUBLE
    try:
        parsed = Decimal(text)
    except InvalidOperation:
        return _DOUBLE
    exponent = parsed.as_tuple().exponent
    assert isinstance(exponent, int)  # finite: only digits, '-' and '.'
    if len(parsed.as_tuple().digits) > _MAX_DECIMAL_DIGITS or -exponent > _MAX_DECIMAL_DIGITS:
        return _DOUBLE
    stripped = _EXACT.normalize(parsed).as_tuple()
    assert isinstance(stripped.exponent, int)
    if stripped.exponent > 0:
        precision, scale = len(stripped.digits) + stripped.exponent, 0
    else:
        precision, scale = len(stripped.digits), -stripped.exponent
    return ("DECIMAL", max(precision, scale), scale)


def _type_of(value: object) -> _Type:
    if value is None:
        return _VOID
    if isinstance(value, bool):
        return ("BOOLEAN",)
    if isinstance(value, str):
        return ("STRING",)
    if isinstance(value, int):
        return _BIGINT if _INT64_MIN <= value <= _INT64_MAX else _number_text_type(str(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            return _DOUBLE
        return _number_text_type(value.text if isinstance(value, JsonFloat) else repr(value))
    if isinstance(value, dict):
        return ("OBJECT", tuple(sorted((str(k), _type_of(v)) for k, v in value.items())))
    if isinstance(value, list | tuple):
        element = _VOID
        for item in value:
            element = _merge(element, _type_of(item))
        return ("ARRAY", element)
    return _VARIANT


def _as_decimal(t: _Type) -> tuple[int, int]:
    return (20, 0) if t == _BIGINT else (t[1], t[2])


def _merge(a: _Type, b: _Type) -> _Type:
    """The element type Spark reports for an array holding values of types ``a`` and ``b``."""
    if a in (_VOID, b):
        return b
    if b == _VOID:
        return a
    numeric = {"BIGINT", "DECIMAL", "DOUBLE"}
    if a[0] in numeric and b[0] in numeric:
        if _DOUBLE in (a, b):
            return _DOUBLE
        (pa, sa), (pb, sb) = _as_decimal(a), _as_decimal(b)
        scale = max(sa, sb)
        precision = max(pa - sa, pb - sb) + scale
        return ("DECIMAL", precision, scale) if precision <= _MAX_DECIMAL_DIGITS else _DOUBLE
    if a[0] == b[0] == "ARRAY":
        return ("ARRAY", _merge(a[1], b[1]))
    if a[0] == b[0] == "OBJECT":
        fields = dict(a[1])
        for name, t in b[1]:
            fields[name] = _merge(fields[name], t) if name in fields else t
        return ("OBJECT", tuple(sorted(fields.items())))
    return _VARIANT


_PLAIN_KEY = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _quoted(key: str) -> str:
    """A key as Spark prints it in a type: plain identifiers as they are, others in backquotes (doubled inside)."""
    return key if _PLAIN_KEY.fullmatch(key) else "`" + key.replace("`", "``") + "`"


def _render(t: _Type) -> str:
    if t[0] == "DECIMAL":
        return f"DECIMAL({t[1]},{t[2]})"
    if t[0] == "OBJECT":
        return "OBJECT<" + ", ".join(f"{_quoted(name)}: {_render(ft)}" for name, ft in t[1]) + ">"
    if t[0] == "ARRAY":
        return f"ARRAY<{_render(t[1])}>"
    return str(t[0])


def json_type(value: object) -> str:
    """The JSON type of a parsed value as Spark's ``schema_of_variant`` names it, e.g. ``OBJECT<a: BIGINT>``."""
    return _render(_type_of(value))


def encoded_size(event: object) -> int:
    """Bytes of ``event`` as compact JSON, as :func:`eventide.envelope.encode` writes it (non-finite numbers
    written as ``Infinity``, which ``encode`` refuses, so an invalid event still has a size)."""
    return len(json.dumps(event, separators=(",", ":")).encode())


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and _INT64_MIN <= value <= _INT64_MAX


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_string(value: object) -> bool:
    return isinstance(value, str)


def _is_string_map(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _any(_: object) -> bool:
    return True


def _supported_version(v: Any) -> str | None:
    return None if v == ENVELOPE_VERSION else f"unsupported envelope version: {v}"


def _non_empty_id(value: Any) -> str | None:
    return "invalid field: id must not be empty" if value == "" else None


def _known_kind(value: Any) -> str | None:
    return None if value in KINDS else f"invalid field: kind must be one of {', '.join(KINDS)}"


def _known_level(value: Any) -> str | None:
    # The stream job reads level as a string whatever its JSON type, so a number is "invalid", not "mistyped".
    ok = isinstance(value, str) and value in LEVELS
    return None if ok else f"invalid field: level must be one of {', '.join(LEVELS)}"


def _finite(value: Any) -> str | None:
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer beyond the double range: Spark reads it as an infinite double
        finite = False
    return None if finite else "invalid field: value must be finite"


def _length(field: str, high: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if 1 <= len(value) <= high else f"invalid field: {field} must be 1-{high} characters"
    return check


# (field, expected JSON type, type test, required, value check) in the stream job's rule order: absent (or
# null) -> "missing field" when required; wrong type -> "mistyped field"; then the value check's reason.
_Step = tuple[str, str, Callable[[object], bool], bool, Callable[[Any], str | None] | None]
_COMMON_STEPS: Final[tuple[_Step, ...]] = (
    ("v", "integer", _is_integer, True, _supported_version),
    ("id", "string", _is_string, True, _non_empty_id),
    ("kind", "string", _is_string, True, _known_kind),
    ("app", "string", _is_string, True, _length("app", MAX_APP_CHARS)),
    ("device", "string", _is_string, True, _length("device", MAX_DEVICE_CHARS)),
    ("name", "string", _is_string, True, _length("name", MAX_NAME_CHARS)),
    ("event_time", "integer ms", _is_integer, True, None),
    ("sent_time", "integer ms", _is_integer, True, None),
    ("received_time", "integer ms", _is_integer, False, None),
    ("user", "string", _is_string, False, None),
    ("tags", "object of strings", _is_string_map, False, None),
)
_KIND_STEPS: Final[dict[str, tuple[_Step, ...]]] = {
    "metric": (("value", "number", _is_number, True, _finite),),
    "log": (("level", "string", _any, True, _known_level), ("message", "string", _is_string, True, None)),
}


def _first_failure(fields: dict[str, Any], steps: tuple[_Step, ...]) -> str | None:
    for field, expected, type_ok, required, check in steps:
        value = fields.get(field)
        if value is None:
            if required:
                return f"missing field: {field}"
            continue
        if not type_ok(value):
            return f"mistyped field: {field} (expected {expected}, got {json_type(value)})"
        if check is not None and (reason := check(value)) is not None:
            return reason
    return None


def validation_error(event: object, max_record_bytes: int, *, record_bytes: int | None = None) -> str | None:
    """Why the stream job would dead-letter ``event`` (a parsed JSON value), or None when it is a valid envelope.

    ``max_record_bytes`` is ``config.envelope.max_record_bytes``. ``record_bytes`` is the size of the record as
    written to Kafka when the caller has already encoded it; by default ``event`` is measured as compact JSON.
    """
    size = encoded_size(event) if record_bytes is None else record_bytes
    if size > max_record_bytes:
        return f"record too large: {size} bytes > {max_record_bytes}"
    if not isinstance(event, dict):
        return "not a JSON object"
    reason = _first_failure(event, _COMMON_STEPS) or _first_failure(event, _KIND_STEPS[event["kind"]])
    if reason is None and event["event_time"] > event["sent_time"]:
        return "event_time is after sent_time"
    return reason


# ----------------------------------------------------------------------------------------------------------
# Hostile JSON (the gateway's input): what a parser or encoder would choke on is found before it is parsed, or
# named per record after, so a bad record is a rejection with a reason and never an error for the whole batch.

_OPEN: Final = (0x5B, 0x7B)      # [ {
_CLOSE: Final = (0x5D, 0x7D)     # ] }
_DELTA: Final = np.zeros(256, dtype=np.int8)
"""Per byte value: +1 opens a level, -1 closes one."""
_DELTA[list(_OPEN)], _DELTA[list(_CLOSE)] = 1, -1
_WITH_COMMAS: Final = _DELTA.copy()
_WITH_COMMAS[0x2C] = 1   # only a marker: a comma is structural but changes no level
_MAYBE_SURROGATE: Final = re.compile(rb"\\u[dD][89a-fA-F]")
"""The only way a lone surrogate gets into a string parsed from UTF-8: a ``\\uD800``-``\\uDFFF`` escape."""
_HUGE_INTEGER: Final = "integer string conversion"
"""Python refuses integers of more than ``sys.get_int_max_str_digits()`` digits with a ValueError saying this."""


class Refused:
    """A record of a batch taken out before validation, with the reason it is rejected (and its id, if known)."""

    __slots__ = ("id", "reason")

    def __init__(self, reason: str, event_id: str | None = None) -> None:
        self.reason, self.id = reason, event_id

    def __repr__(self) -> str:
        return f"Refused({self.reason!r})"


def depth_reason(limit: int) -> str:
    return f"invalid JSON: nested deeper than {limit} levels (gateway.max_depth)"


def _structure(data: bytes, commas: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The structural bytes of a JSON text outside its strings: (positions, bytes, nesting depth after each),
    vectorised. Brackets and braces, and with ``commas`` the commas too.

    Structural bytes are ASCII and never part of a UTF-8 multi-byte sequence, so bytes can be scanned as they are.
    A quote is a string's delimiter unless an odd number of backslashes precedes it. Linear in the text whatever
    its nesting (a few ms per MB), and only the few structural bytes are summed up."""
    b = np.frombuffer(data, dtype=np.uint8)
    quote = b == 0x22
    if data.find(b"\\") >= 0:
        index = np.arange(len(b), dtype=np.int64)
        last_other = np.maximum.accumulate(np.where(b == 0x5C, -1, index))
        escapes_before = np.zeros(len(b), dtype=np.int64)
        escapes_before[1:] = index[:-1] - last_other[:-1]
        quote &= escapes_before % 2 == 0
    inside = np.bitwise_xor.accumulate(quote.view(np.uint8)).view(bool)
    positions = np.flatnonzero(((_WITH_COMMAS if commas else _DELTA)[b] != 0) & ~inside)
    found = b[positions]
    return positions, found, np.cumsum(_DELTA[found], dtype=np.int32)


def line_depths(data: bytes) -> np.ndarray:
    """The deepest nesting of each line of ``data`` (lines split at ``\\n``, as ``str.split("\\n")`` does)."""
    newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 0x0A)
    deepest = np.zeros(len(newlines) + 1, dtype=np.int32)
    positions, found, depth = _structure(data)
    if not len(positions):
        return deepest
    line = np.searchsorted(newlines, positions)
    firsts = np.flatnonzero(np.concatenate(([True], line[1:] != line[:-1])))   # each line's first structural byte
    before = depth[firsts] - _DELTA[found[firsts]]                               # the depth its line begins at
    deepest[line[firsts]] = np.maximum.reduceat(depth, firsts) - before
    return deepest


def without_deep_elements(data: bytes, limit: int) -> tuple[bytes, list[int]]:
    """A JSON array text whose elements nested deeper than ``limit`` are replaced by ``null``, and their indices.

    The array's elements are the spans between its top-level commas; an element's depth is counted from inside
    the array. Returns ``data`` unchanged (and no indices) when nothing is deeper than ``limit``."""
    _, _, depth = _structure(data)
    if not len(depth) or int(depth.max()) <= limit + 1:
        return data, []
    positions, found, depth = _structure(data, commas=True)
    if found[0] != _OPEN[0]:
        return data, []   # not an array (the parser says why)
    closed = np.flatnonzero(depth == 0)
    end = int(closed[0]) if len(closed) else len(depth)          # the array's closing bracket (or the text's end)
    commas = np.flatnonzero((found[:end] == 0x2C) & (depth[:end] == 1))
    starts = np.concatenate(([0], commas))                       # the '[' or comma before each element
    stops = np.concatenate((commas, [end]))
    deepest = np.ones(len(starts), dtype=np.int32)               # an element without brackets: level 1
    inner = np.flatnonzero(starts + 1 < stops)
    if len(inner):
        # Each segment runs on to the next one's start: only commas at level 1 between, which change no maximum.
        deepest[inner] = np.maximum.reduceat(depth[:end], starts[inner] + 1)
    deep = [int(i) for i in np.flatnonzero(deepest - 1 > limit)]
    if not deep:
        return data, []
    parts, at = [], 0
    for i in deep:
        parts += [data[at:int(positions[starts[i]]) + 1], b"null"]
        at = int(positions[stops[i]]) if stops[i] < len(positions) else len(data)
    parts.append(data[at:])
    return b"".join(parts), deep


class _Duplicated(dict):  # type: ignore[type-arg]
    """An object that had a key twice (the last value kept, as json.loads does), and which key."""

    key: str


class RecordDecoder:
    """``loads`` for the gateway's records: also notes objects with a duplicate key and reads integers longer than
    Python converts as an infinite number (what Spark makes of them), so each can be a rejection of one record.

    One per request (it keeps state); ``duplicates`` says whether any object had a duplicate key."""

    def __init__(self) -> None:
        self.duplicates = False
        self._decoder = json.JSONDecoder(parse_float=JsonFloat, parse_constant=_reject_constant,
                                         object_pairs_hook=self._object)
        self._huge = json.JSONDecoder(parse_float=JsonFloat, parse_constant=_reject_constant,
                                      object_pairs_hook=self._object, parse_int=_int_or_infinite)

    def _object(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) == len(pairs):
            return obj
        self.duplicates = True
        seen: set[str] = set()
        duplicated = _Duplicated(obj)
        duplicated.key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        return duplicated

    def decode(self, text: str) -> Any:
        """The JSON value of ``text``. Raises ``json.JSONDecodeError`` / ``ValueError`` as ``loads`` does."""
        try:
            return self._decoder.decode(text)
        except ValueError as exc:
            if _HUGE_INTEGER not in str(exc):
                raise
            return self._huge.decode(text)


def _int_or_infinite(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:   # more digits than Python converts: far beyond any integer or double anyway
        return JsonFloat(text)


def duplicate_key(value: object, field: str = "") -> str | None:
    """Where an object of ``value`` (parsed by :class:`RecordDecoder`) had a duplicate key, e.g. ``tags.a``."""
    if isinstance(value, _Duplicated):
        return f"{field}{value.key}"
    if isinstance(value, dict):
        for key, item in value.items():
            if (found := duplicate_key(item, f"{field}{key}.")) is not None:
                return found
    elif isinstance(value, list):
        for item in value:
            if (found := duplicate_key(item, field)) is not None:
                return found
    return None


def may_hold_surrogates(body: bytes) -> bool:
    """False when no string parsed from ``body`` can hold a lone surrogate (the usual case: no check needed)."""
    return _MAYBE_SURROGATE.search(body) is not None


_STRICT: Final = json.JSONEncoder(ensure_ascii=False, check_circular=False)


def _encodable(value: object) -> bool:
    try:
        _STRICT.encode(value).encode("utf-8")
    except UnicodeEncodeError:
        return False
    except ValueError:   # a non-finite number: validation names it
        return True
    return True


def unicode_error(event: object) -> str | None:
    """Why ``event`` holds text that is not Unicode (a lone surrogate from a ``\\uD800`` escape, which cannot be
    written as UTF-8), naming the field; None when it has none."""
    if _encodable(event):
        return None
    if isinstance(event, dict):
        for key, value in event.items():
            if not _encodable(key):
                return "invalid field name: not valid Unicode (a lone surrogate)"
            if not _encodable(value):
                return f"invalid field: {key} is not valid Unicode (a lone surrogate)"
    return "invalid JSON: not valid Unicode (a lone surrogate)"


def printable(text: str) -> str:
    """``text`` with lone surrogates written as ``\\udXXX`` escapes, so it can go into a UTF-8 response."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
