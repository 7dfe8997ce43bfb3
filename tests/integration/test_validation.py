"""The gateway's pure-Python envelope validator gives the same reasons as the stream job's Spark validator
(``analytics.accept.validation``), on every case of tests/unit/ingest/test_gateway_validator.py."""

from __future__ import annotations

import json
from typing import Any

from tests.unit.ingest.test_gateway_validator import BAD, RAW_TEXT, VALID


def test_same_reasons_as_the_stream_job(spark: Any) -> None:
    """Parity with the Spark validator on every row of both tables (records built in memory, no Kafka)."""
    from datetime import UTC, datetime

    from analytics.accept import validation as envelope
    from eventide.config import load_config

    config = load_config(environ={})
    cases = [*BAD, *((event, None) for event in VALID)]
    now = datetime.now(UTC)
    rows = [("t", 0, i, now, RAW_TEXT.get(id(event), json.dumps(event, separators=(",", ":"))).encode())
            for i, (event, _) in enumerate(cases)]
    records = spark.createDataFrame(rows, "topic string, partition int, offset long, timestamp timestamp, "
                                          "value binary")
    got = {r.offset: r.dead_letter_reason for r in envelope.parse(records, config).collect()}
    assert [got[i] for i in range(len(cases))] == [reason for _, reason in cases]
