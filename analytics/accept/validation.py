"""Parse and validate Kafka records as v1 envelopes, in Spark's JVM (no Python per record).

Each record is parsed with ``try_parse_json`` into a VARIANT, so the JSON type of every field is known exactly
(``schema_of_variant``): ``"5"`` is not an integer and ``5`` is not a string. The first failing rule gives the
``dead_letter_reason``; records without one are accepted and get ``corrected_event_time``:

    corrected_event_time = event_time + (received_time - sent_time)

where ``received_time`` is the gateway's stamp if present, else the Kafka record timestamp (the events topic
uses LogAppendTime, i.e. the broker's clock).
"""

from __future__ import annotations

import functools

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from eventide.config import Config
from eventide.envelope import ENVELOPE_VERSION, KINDS, LEVELS, MAX_APP_CHARS, MAX_DEVICE_CHARS, MAX_NAME_CHARS

_INTEGER_TYPES = ("BIGINT", "INT", "SMALLINT", "TINYINT")
_NUMBER_PATTERN = r"^(BIGINT|INT|SMALLINT|TINYINT|DOUBLE|FLOAT|DECIMAL\(.*\))$"

# Every envelope field and the Spark type it is read as.
_FIELDS = {
    "v": "bigint", "id": "string", "kind": "string", "app": "string", "device": "string", "name": "string",
    "value": "double", "level": "string", "message": "string", "user": "string", "tags": "map<string,string>",
    "event_time": "bigint", "sent_time": "bigint", "received_time": "bigint",
}


def _json_type(field: str) -> Column:
    """The JSON type of a top-level field: 'STRING', 'BIGINT', 'DOUBLE', 'OBJECT<…>', 'VOID' (null), NULL (absent)."""
    return F.col(f"_t_{field}")


def _absent(field: str) -> Column:
    t = _json_type(field)
    return t.isNull() | (t == "VOID")


def _get(field: str) -> Column:
    """The field's value as its Spark type (NULL when absent or not convertible)."""
    return F.col(f"_v_{field}")


# The shape of almost every valid envelope, as ``schema_of_variant`` of the whole record prints it (fields sorted
# by name, keys unquoted when they are plain identifiers). A record of this shape whose values pass the value rules
# is valid for certain; every other record goes through the full rules, which find its reason (or accept it).
_FAST_SHAPE = (
    r"^OBJECT<app: STRING, device: STRING, event_time: BIGINT, id: STRING, kind: STRING, "
    r"(level: STRING, message: STRING, )?name: STRING, (received_time: BIGINT, )?sent_time: BIGINT, "
    r"(tags: OBJECT<(\w+: STRING(, \w+: STRING)*)?>, )?(user: STRING, )?v: BIGINT"
    r"(, value: (BIGINT|DOUBLE|DECIMAL\(\d+,\d+\)))?>$"
)
# The tags: every value a string, every key unquoted (``schema_of_variant`` quotes a key that is not a plain
# identifier, so ``\w+`` matches exactly the keys it leaves bare). Checked in the one pattern: a separate search is
# one more regex per record in accept's hottest code (docs/performance.md#validation-one-parse-and-a-fast-path).
_KAFKA_COLUMNS = ("topic", "partition", "offset", "kafka_timestamp", "value")
_FAST_SCHEMA = ", ".join(f"{field} {spark_type}" for field, spark_type in _FIELDS.items())


def _fast_path() -> Column:
    """``_root`` (the record's JSON schema) and ``_fj`` (its fields cast from the variant: exact for a record of
    the fast shape, whose JSON types are all as expected), from which ``_fast_accept`` decides.

    Checking one schema string and a few values costs a fraction of the full rules (per-field JSON types and typed
    reads; docs/performance.md#validation-one-parse-and-a-fast-path); only records that fail it pay for those
    (``_extract_fields``). The fast check accepts a subset of what the full rules accept, with the same values, so the
    outcome is the same."""
    root = F.expr("schema_of_variant(_json)")
    # Read from the variant already parsed, not parsed again with from_json: Spark's from_json allocates a reader and
    # its buffers per record, a second parse no cheaper than this cast
    # (docs/performance.md#validation-one-parse-and-a-fast-path). The cast is lenient ("5" would become 5), which is
    # harmless here: ``_fj`` is only used for records of the fast shape, whose JSON types are exactly the cast's.
    fields = F.expr(f"try_variant_get(_json, '$', 'struct<{_FAST_SCHEMA}>')")
    return F.inline(F.array(F.struct(root.alias("_root"), fields.alias("_fj"))))


def _fast_accept(limit: int) -> Column:
    """True when the record is valid for certain (shape and values); False sends it through the full rules."""
    fj = F.col("_fj")
    shape = F.col("_root").rlike(_FAST_SHAPE)
    value = fj["value"]
    kind_ok = (((fj["kind"] == "metric") & value.isNotNull() & ~F.isnan(value) & (F.abs(value) != float("inf")))
               | ((fj["kind"] == "log") & fj["level"].isin(*LEVELS) & fj["message"].isNotNull()))
    return F.coalesce(
        F.col("_json").isNotNull() & (F.octet_length("value") <= limit) & shape
        & (fj["v"] == ENVELOPE_VERSION) & (F.char_length(fj["id"]) > 0) & kind_ok
        & F.char_length(fj["app"]).between(1, MAX_APP_CHARS)
        & F.char_length(fj["device"]).between(1, MAX_DEVICE_CHARS)
        & F.char_length(fj["name"]).between(1, MAX_NAME_CHARS)
        & (fj["event_time"] <= fj["sent_time"]),
        F.lit(False))


def _extract_fields() -> Column:
    """JSON type and typed value of every field, computed once per record: from ``_fj`` on the fast path, else
    from the variant (types for the full rules, which only run off the fast path).

    They sit behind a generator (``inline`` of a one-element array) on purpose: Spark pushes the
    ``dead_letter_reason IS NULL`` filter below plain projections by inlining their expressions, which would
    re-evaluate every ``schema_of_variant`` in every rule that mentions it (several times the validation's cost,
    docs/performance.md#validation-one-parse-and-a-fast-path); it cannot push a filter below a generator, so the
    rules read these columns instead.
    """
    fast = F.col("_fast")
    parts = [fast.alias("_fast"), F.col("_root").alias("_t_root")]
    for field, spark_type in _FIELDS.items():
        json_type = F.expr(f"schema_of_variant(variant_get(_json, '$.{field}', 'variant'))")
        typed = F.expr(f"try_variant_get(_json, '$.{field}', '{spark_type}')")
        parts.append(F.when(~fast, json_type).alias(f"_t_{field}"))
        parts.append(F.when(fast, F.col("_fj")[field]).otherwise(typed).alias(f"_v_{field}"))
    return F.inline(F.array(F.struct(*parts)))


def _mistyped(field: str, expected: str) -> Column:
    return F.concat(F.lit(f"mistyped field: {field} (expected {expected}, got "), _json_type(field), F.lit(")"))


def _required(field: str, expected: str, ok: Column) -> list[tuple[Column, Column]]:
    """Rules for a required field: present, then of the expected JSON type."""
    return [(_absent(field), F.lit(f"missing field: {field}")), (~ok, _mistyped(field, expected))]


def _optional(field: str, expected: str, ok: Column) -> list[tuple[Column, Column]]:
    return [(~_absent(field) & ~ok, _mistyped(field, expected))]


def _is_string(field: str) -> Column:
    return _json_type(field) == "STRING"


def _is_integer(field: str) -> Column:
    return _json_type(field).isin(*_INTEGER_TYPES)


def _length_between(field: str, low: int, high: int) -> tuple[Column, Column]:
    n = F.char_length(_get(field))
    return (~n.between(low, high), F.lit(f"invalid field: {field} must be {low}-{high} characters"))


def _rules(limit: int) -> list[tuple[Column, Column]]:
    """(broken-when, reason) in evaluation order; the first match is the reason."""
    size = F.octet_length(F.col("value"))
    kind = _get("kind")
    value = _get("value")
    tags_type = _json_type("tags")
    return [
        (F.col("value").isNull(), F.lit("empty record")),
        (size > limit, F.concat(F.lit("record too large: "), size.cast("string"), F.lit(f" bytes > {limit}"))),
        (~F.is_valid_utf8(F.col("value").cast("string")), F.lit("not UTF-8")),
        (F.col("_json").isNull(), F.lit("unparseable JSON")),
        (~F.col("_t_root").startswith("OBJECT"), F.lit("not a JSON object")),
        *_required("v", "integer", _is_integer("v")),
        (_get("v") != ENVELOPE_VERSION,
         F.concat(F.lit("unsupported envelope version: "), _get("v").cast("string"))),
        *_required("id", "string", _is_string("id")),
        (F.char_length(_get("id")) == 0, F.lit("invalid field: id must not be empty")),
        *_required("kind", "string", _is_string("kind")),
        (~kind.isin(*KINDS), F.lit(f"invalid field: kind must be one of {', '.join(KINDS)}")),
        *_required("app", "string", _is_string("app")),
        _length_between("app", 1, MAX_APP_CHARS),
        *_required("device", "string", _is_string("device")),
        _length_between("device", 1, MAX_DEVICE_CHARS),
        *_required("name", "string", _is_string("name")),
        _length_between("name", 1, MAX_NAME_CHARS),
        *_required("event_time", "integer ms", _is_integer("event_time")),
        *_required("sent_time", "integer ms", _is_integer("sent_time")),
        *_optional("received_time", "integer ms", _is_integer("received_time")),
        *_optional("user", "string", _is_string("user")),
        # Every value a string: each ': ' of the type, once quoted keys (which may hold ': ') are blanked out,
        # is followed by STRING.
        *_optional("tags", "object of strings",
                   tags_type.startswith("OBJECT<")
                   & ~F.regexp_replace(tags_type, r"`([^`]|``)*`", "k").rlike(r": (?!STRING[,>])")),
        ((kind == "metric") & _absent("value"), F.lit("missing field: value")),
        ((kind == "metric") & ~_json_type("value").rlike(_NUMBER_PATTERN), _mistyped("value", "number")),
        ((kind == "metric") & (F.isnan(value) | (F.abs(value) == float("inf"))),
         F.lit("invalid field: value must be finite")),
        ((kind == "log") & _absent("level"), F.lit("missing field: level")),
        ((kind == "log") & ~_get("level").isin(*LEVELS),
         F.lit(f"invalid field: level must be one of {', '.join(LEVELS)}")),
        ((kind == "log") & _absent("message"), F.lit("missing field: message")),
        ((kind == "log") & ~_is_string("message"), _mistyped("message", "string")),
        (_get("event_time") > _get("sent_time"), F.lit("event_time is after sent_time")),
    ]


def _first_failure(rules: list[tuple[Column, Column]]) -> Column:
    reason = F.when(rules[0][0], rules[0][1])
    for broken, why in rules[1:]:
        reason = reason.when(broken, why)
    return reason


def parse(records: DataFrame, config: Config) -> DataFrame:
    """Kafka source rows -> one row per record with typed envelope fields and ``dead_letter_reason``.

    ``dead_letter_reason`` is NULL for accepted records. Kafka coordinates are kept for dead letters.
    """
    for columns in _projections(config.envelope.max_record_bytes, tuple(sorted(config.stream.series_tag_keys))):
        records = records.select(*columns)
    return records


@functools.cache
def _projections(limit: int, tag_keys: tuple[str, ...]) -> tuple[tuple[Column, ...], ...]:
    """The columns of ``parse``'s projections, one tuple per ``select``, built once per process and settings.

    Built anew they cost thousands of calls into Spark's JVM at every start of the ``accept`` query
    (docs/performance.md#query-columns-built-once-per-process). Columns are unresolved expressions, valid for any
    DataFrame and session of the JVM."""
    kafka = [F.col(c) for c in _KAFKA_COLUMNS]
    read = (
        *kafka[:3], F.col("timestamp").alias("kafka_timestamp"), F.col("value"),
        # Oversize records are never parsed: the size rule rejects them first. Nor are bytes that are not UTF-8
        # (the brief's encoding): Spark's parser would read them with replacement characters and accept them.
        F.when((F.octet_length("value") <= limit) & F.is_valid_utf8(F.col("value").cast("string")),
               F.expr("try_parse_json(CAST(value AS STRING))")).alias("_json"),
    )
    parsed_json = F.col("_json")
    fast_path = (F.col("*"), _fast_path())
    fast = (*kafka, parsed_json, F.col("_root"), F.col("_fj"), _fast_accept(limit).alias("_fast"))
    fields = (*kafka, parsed_json, _extract_fields())
    tags = _get("tags")
    received = F.coalesce(_get("received_time"), F.unix_millis("kafka_timestamp"))
    clock_offset = received - _get("sent_time")
    series_tags = (F.concat_ws(",", *[F.concat(F.lit(f"{k}="), F.coalesce(tags[k], F.lit(""))) for k in tag_keys])
                   if tag_keys else F.lit(""))
    typed = (
        *kafka,
        F.when(~F.col("_fast"), _first_failure(_rules(limit))).alias("dead_letter_reason"),
        *[_get(f).alias(f) for f in ("id", "kind", "app", "device", "name")],
        _get("value").alias("metric_value"),
        *[_get(f).alias(f) for f in ("level", "message", "user", "tags")],
        series_tags.alias("series_tags"),
        *[_get(f).alias(f) for f in ("event_time", "sent_time")],
        received.alias("received_time"),
        clock_offset.alias("clock_offset_ms"),
        F.timestamp_millis(_get("event_time") + clock_offset).alias("corrected_event_time"),
    )
    return read, fast_path, fast, fields, typed


def accepted(parsed: DataFrame) -> DataFrame:
    """The accepted records of ``parse``, as the accepted-events log stores them: without the raw value, and
    without a log's message, which only the ``logs`` table keeps (no window reads it, and the log is rewritten and
    re-read by every stateful query)."""
    return parsed.where(F.col("dead_letter_reason").isNull()).drop("dead_letter_reason", "value", "message")


KAFKA_SOURCE_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
                       "timestampType int")


_accepted_schema: list[StructType] = []


def accepted_schema(spark: SparkSession, config: Config) -> StructType:
    """The columns of an accepted event (``accepted(parse(...))``), as the accepted-events log stores them.

    Derived once per process: analysing the whole parse plan takes a noticeable part of a second, the writers ask
    for it every micro-batch, and the types do not depend on the configuration (only the values do)."""
    if not _accepted_schema:
        _accepted_schema.append(accepted(parse(spark.createDataFrame([], KAFKA_SOURCE_SCHEMA), config)).schema)
    return _accepted_schema[0]
