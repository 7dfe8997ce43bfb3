"""A Kafka partition's share of a batch larger than an ``accept`` task may hold (``stream.task_memory_bytes``) is
written to the task's disk and handled a slice at a time (docs/operations.md, "Memory per task"), with exactly the
results it gives when held in memory.

Given the same records on two topics, one job holding every batch in memory and one whose tasks hold 64 KiB, every
table the job writes is the same (quantiles within the KLL sketch's error, as between any two runs): windows,
sliding windows, sessions, stragglers, log lines, duplicates, clock offsets; and the spilled job's events files are
cut into many row groups, the held one's into two.
"""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq

from analytics import accepted_log
from eventide.config import Config
from eventide.envelope import encode, log_event, metric_event
from tests.support.pipeline import minute_in_past, produce_raw, rows, run_job
from tests.support.stack import fresh_stack

S = 1000
TABLES = {
    "window_aggregates": "SELECT window_kind, window_length_ms, window_hop_ms, window_start, app, kind, name, "
                         "series_tags, event_count, value_count, sum, min, max, distinct_users, distinct_devices, "
                         "level_error FROM window_aggregates FINAL ORDER BY ALL",
    "sliding_windows": "SELECT app, name, window_end, source_partition, source_offset, event_count, sum "
                       "FROM sliding_windows FINAL ORDER BY ALL",
    "sessions": "SELECT app, key_kind, session_key, session_start, session_end, event_count, metric_count, "
                "log_count FROM sessions FINAL ORDER BY ALL",
    "stragglers": "SELECT window_kind, window_length_ms, window_start, source_partition, source_offset, event_id "
                  "FROM stragglers FINAL ORDER BY ALL",
    "logs": "SELECT event_id, message, level, app, device, user, tags, corrected_event_time, source_partition, "
            "source_offset FROM logs ORDER BY ALL",
    "duplicates": "SELECT source_partition, source_offset, event_id FROM duplicates FINAL ORDER BY ALL",
    "device_clocks": "SELECT app, device, batch_id, events, offset_min_ms, offset_max_ms FROM device_clocks FINAL "
                     "ORDER BY ALL",
}

QUANTILES = ("SELECT p50, p99 FROM window_aggregates FINAL WHERE value_count > 0 "
             "ORDER BY window_kind, window_length_ms, window_start, app, kind, name, series_tags")


def records(t0: int) -> list[bytes]:
    """A minute of logs (with tags and a few hundred bytes of message) and metrics from 7 devices and 11 users, every
    50th sent again 3 s later, then an event 20 minutes on, whose watermark closes the minute's windows and
    sessions."""
    out = []
    for i in range(1500):
        at = t0 + i * 40
        common = dict(app="shop", device=f"device-{i % 7}", event_time=at, sent_time=at, user=f"user-{i % 11}")
        if i % 3 == 0:
            event = log_event(level=("info", "warning", "error")[i % 9 // 3], name="app.server",
                              message=f"order {i} " + "payment declined " * 12, tags={"order": str(i)}, **common)
        else:
            event = metric_event(name="latency_ms", value=float(i % 97), **common)
        event["received_time"] = at
        out.append(encode(event))
        if i % 50 == 0:
            out.append(encode({**event, "received_time": at + 3 * S}))
    closing = metric_event(app="shop", device="device-0", name="latency_ms", value=1.0, event_time=t0 + 1_200 * S,
                           sent_time=t0 + 1_200 * S, user=None)
    return [*out, encode({**closing, "received_time": t0 + 1_200 * S})]


def late(t0: int) -> list[bytes]:
    """Events of the closed minute arriving after it: stragglers, written from the spilled batches' files."""
    out = []
    for i in range(40):
        at = t0 + i * 1_000
        event = metric_event(app="shop", device=f"device-{i % 7}", name="latency_ms", value=5.0, event_time=at,
                             sent_time=at + 1_000 * S, user=f"user-{i % 11}")
        out.append(encode({**event, "received_time": at + 1_000 * S}))
    return out


def tables(config: Config) -> dict[str, list[dict[str, Any]]]:
    return {name: rows(config, sql) for name, sql in TABLES.items()}


def row_groups(config: Config, batch_id: int) -> list[int]:
    return [pq.ParquetFile(accepted_log.partition_file(config.accepted_events_dir, batch_id, p)).num_row_groups
            for p in range(config.kafka.events_partitions)]


def test_given_batches_larger_than_a_task_s_memory_then_every_table_is_what_it_is_held_in_memory(
        kafka: Config, spark: Any) -> None:
    held = fresh_stack(kafka, "task_memory_held")
    spilled = fresh_stack(kafka, "task_memory_spilled", task_memory_bytes=64 * 1024)
    t0 = minute_in_past(60)
    first, then = records(t0), late(t0)   # the same bytes (the same ids) for both jobs
    for config in (held, spilled):
        produce_raw(config, first)
        run_job(spark, config)
        produce_raw(config, then)
        run_job(spark, config)

    expected = tables(held)
    assert len(expected["logs"]) == 500 and len(expected["duplicates"]) == 30
    assert expected["sessions"] and expected["stragglers"] and expected["sliding_windows"]
    assert tables(spilled) == expected
    # KLL sketches compact at random, so two runs over the same values agree within the sketch's rank error only.
    for found, wanted in zip(rows(spilled, QUANTILES), rows(held, QUANTILES), strict=True):
        assert abs(found["p50"] - wanted["p50"]) <= 3 and abs(found["p99"] - wanted["p99"]) <= 3
    assert max(row_groups(held, 0)) == 2
    assert max(row_groups(spilled, 0)) > 4
