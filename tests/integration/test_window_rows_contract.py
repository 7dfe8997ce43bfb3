"""Contract: the hand-written window row (tests/support/window_rows.py), which the SQL-layer tests (range queries,
alerting, dashboard) insert in place of the job's output, is the row the stream job really writes for the same
events: the same columns, the same values, the same sketch bytes. Without it those tests could pass on a model of
a row the job no longer writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from datasketches import hll_sketch, kll_doubles_sketch

from store.range_query import SeriesKey
from tests.support import window_rows as model
from tests.support.pipeline import Event, minute_in_past, produce_events, run_job, window_rows

MINUTE = timedelta(minutes=1)


def _as_model_event(e: Event) -> model.Event:
    return model.Event(datetime.fromtimestamp(e.at / 1000, UTC), e.value, user=e.user, device=e.device, level=e.level)


def _content(column: str, value: Any) -> Any:
    """A column's value as readers use it. Sketches: their content (the job stores the updatable serialisation,
    the model the compact one; every reader deserialises, and both hold the same items). Times: UTC (the store's
    client returns them naive)."""
    if column == "value_sketch" and value:
        sketch = kll_doubles_sketch.deserialize(value)
        return sketch.k, sketch.n, sorted(sketch)
    if column in ("users_sketch", "devices_sketch"):
        sketch = hll_sketch.deserialize(value)
        return sketch.lg_config_k, sketch.serialize_compact()
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def test_the_window_row_model_is_the_row_the_job_writes(stack, spark):
    start = minute_in_past()
    metrics = [Event(start + 1_000, 3.0, user="ann"), Event(start + 20_000, 1.5, device="d2"),
               Event(start + 59_999, 7.25, user="bob", device="d2"), Event(start + 30_000, -2.0, user="ann")]
    logs = [Event(start + 5_000, None, name="app.log", level="error"),
            Event(start + 6_000, None, name="app.log", level="info", user="ann", device="d3")]
    produce_events(stack, metrics + logs)
    run_job(spark, stack)

    written = {row["kind"]: row for row in window_rows(stack, 60)}
    assert sorted(written) == ["log", "metric"]
    for kind, events, name in (("metric", metrics, "latency_ms"), ("log", logs, "app.log")):
        job = written[kind]
        expected = model.window_row(stack, SeriesKey("shop", kind, name), datetime.fromtimestamp(start / 1000, UTC),
                                    MINUTE, [_as_model_event(e) for e in events], version=job["version"])
        assert sorted(expected) == sorted(job), kind                        # the same columns, none missing
        model_row = {column: _content(column, value) for column, value in expected.items()}
        job_row = {column: _content(column, value) for column, value in job.items()}
        differing = {column: f"model {model_row[column]!r:.70} != job {job_row[column]!r:.70}" for column in model_row
                     if column != "written_at" and model_row[column] != job_row[column]}
        assert not differing, "\n".join([kind, *(f"{column}: {diff}" for column, diff in differing.items())])
