"""The alert evaluator and notifications against a real store (SQL layer), broker and a local webhook server.

Windows are written as the stream job writes them (sketches included); the ``windows`` query's watermark is a
``pipeline_progress`` row, advanced minute by minute like a running job would.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from alerting.delivery import deliver
from alerting.evaluator import evaluate
from alerting.notify import KafkaChannel, WebhookChannel
from alerting.rules import parse_rules
from eventide.config import Config
from stack import broker
from stack.services import free_port
from store.client import connect
from store.range_query import SeriesKey
from tests.support.stack import fresh_stack
from tests.support.window_rows import Event, insert, window_row

# An hour boundary a day ago: within every table's retention (TTL), so the windows written are kept.
T0 = (datetime.now(UTC) - timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
MINUTE = timedelta(minutes=1)
LATENCY = SeriesKey("checkout", "metric", "latency_ms")

P99_FOR_2 = """
[[rule]]
name = "checkout p99"
series = { app = "checkout", kind = "metric", name = "latency_ms" }
window_s = 60
statistic = "p99"
comparator = ">"
threshold = 500
for = 2
severity = "critical"
"""


def ms(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)


@pytest.fixture
def store(kafka: Config, request: pytest.FixtureRequest) -> Config:
    config = fresh_stack(kafka, request.node.name)
    config = config.model_copy(update={"alerting": config.alerting.model_copy(
        update={"alerts_topic": f"alerts.{config.store.database}"})})
    broker.ensure_topics(config)
    return config


def minute_of(config: Config, minute: int, latencies: list[float], series: SeriesKey = LATENCY,
              at: datetime = T0) -> dict[str, Any]:
    start = at + minute * MINUTE
    return window_row(config, series, start, MINUTE, [Event(start + timedelta(seconds=1), v) for v in latencies])


def advance_watermark(config: Config, to: datetime) -> None:
    with connect(config) as client:
        client.insert("pipeline_progress", [["windows", "q", "r", ms(to), to, to, to]],
                      column_names=["query_name", "query_id", "run_id", "batch_id", "batch_timestamp",
                                    "watermark", "recorded_at"])


def evaluate_minutes(config: Config, rules_text: str, minutes: range) -> list[tuple[str, int]]:
    """Run the evaluator as the watermark reaches each minute; (transition, window-end minute) in order."""
    rules = parse_rules(rules_text)
    seen = []
    for m in minutes:
        advance_watermark(config, T0 + m * MINUTE)
        seen += [(t.to, (t.window_end_ms - ms(T0)) // 60_000)
                 for t in evaluate(config, rules, now=ms(T0 + m * MINUTE + timedelta(seconds=5)))]
    return seen


class Webhook:
    """A local HTTP server that records JSON bodies; answers 500 to the first ``fail_first`` requests."""

    def __init__(self, fail_first: int = 0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.requests = 0
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.requests += 1
                if hook.requests <= fail_first:
                    self.send_response(500)
                else:
                    hook.bodies.append(json.loads(body))
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook(fail_first=2)
    yield hook
    hook.server.shutdown()


def test_p99_over_threshold_for_two_finished_windows_fires_then_resolves(store: Config) -> None:
    fast, slow = [10.0] * 99 + [20.0], [10.0] * 90 + [900.0] * 10
    insert(store, [minute_of(store, m, lat) for m, lat in enumerate([fast, slow, slow, slow, fast, fast])])
    # Minute 5 is not finished until the watermark reaches its end, so it is never judged early.
    assert evaluate_minutes(store, P99_FOR_2, range(1, 7)) == [
        ("pending", 2), ("firing", 3), ("resolved", 5)]
    with connect(store) as client:
        [(state, value)] = client.query("SELECT state, value FROM alert_states FINAL").result_rows
    assert state == "ok" and value is not None and value < 500


def test_a_rank_the_job_does_not_store_is_read_from_each_windows_sketch(store: Config) -> None:
    # Given minutes whose p75 (stored by no column: the job keeps p50 … p999) is 10, 600, 600, 10,
    fast, slow = [10.0] * 100, [10.0] * 20 + [600.0] * 80
    insert(store, [minute_of(store, m, lat) for m, lat in enumerate([fast, slow, slow, fast])])
    # a p75 rule reads it from each window's KLL sketch, and fires and resolves on it.
    rules = P99_FOR_2.replace('statistic = "p99"', 'statistic = "p75"').replace("checkout p99", "checkout p75")
    assert evaluate_minutes(store, rules, range(1, 5)) == [("pending", 2), ("firing", 3), ("resolved", 4)]


def test_keep_firing_for_rides_out_a_dip_and_its_count_is_stored_between_evaluations(store: Config) -> None:
    # Given a rule kept firing one window past its last breach, evaluated once a minute (state read from the store),
    fast, slow = [10.0] * 100, [900.0] * 100
    insert(store, [minute_of(store, m, lat) for m, lat in enumerate([fast, slow, slow, fast, slow, fast, fast, fast])])
    # one calm window (minute 3) is ridden out, and the second calm window in a row (minute 6) resolves it.
    assert evaluate_minutes(store, P99_FOR_2 + "keep_firing_for = 1\n", range(1, 9)) == [
        ("pending", 2), ("firing", 3), ("resolved", 7)]


def test_a_single_breach_with_for_two_never_fires(store: Config) -> None:
    fast, slow = [10.0] * 100, [900.0] * 100
    insert(store, [minute_of(store, m, lat) for m, lat in enumerate([fast, slow, fast, slow, fast])])
    assert evaluate_minutes(store, P99_FOR_2, range(1, 6)) == [
        ("pending", 2), ("ok", 3), ("pending", 4), ("ok", 5)]


def test_notifications_reach_the_webhook_with_retries_and_kafka_once_across_restarts(
        store: Config, webhook: Webhook) -> None:
    fast, slow = [10.0] * 100, [900.0] * 100
    insert(store, [minute_of(store, m, lat) for m, lat in enumerate([slow, slow, fast])])
    evaluate_minutes(store, P99_FOR_2, range(1, 4))
    channels = [WebhookChannel(webhook.url, attempts=3, backoff_s=0.05), KafkaChannel(store)]

    assert deliver(store, channels) == {"webhook": 2, "kafka": 2}
    assert [(b["status"], b["rule"], b["severity"]) for b in webhook.bodies] == [
        ("firing", "checkout p99", "critical"), ("resolved", "checkout p99", "critical")]
    assert webhook.requests == 4        # two failed attempts, then both delivered
    assert webhook.bodies[0]["labels"] == {"alertname": "checkout p99", "severity": "critical", "app": "checkout",
                                           "kind": "metric", "name": "latency_ms"}
    assert webhook.bodies[1]["annotations"]["summary"] == "checkout p99: p99 > 500 on checkout · metric · latency_ms"
    assert webhook.bodies[1]["annotations"]["description"].endswith("(fires when > 500); now resolved")

    # A restarted evaluator and notifier: the same windows again, nothing new, nothing sent twice.
    assert evaluate_minutes(store, P99_FOR_2, range(1, 4)) == []
    assert deliver(store, [WebhookChannel(webhook.url, 3, 0.05), KafkaChannel(store)]) == {"webhook": 0, "kafka": 0}
    assert len(webhook.bodies) == 2
    on_topic = [json.loads(m.value()) for m in broker.read_committed(store, store.alerting.alerts_topic)]
    assert [(m["status"], m["key"]) for m in on_topic] == [(b["status"], b["key"]) for b in webhook.bodies]


def test_week_over_week_fires_when_traffic_triples_against_the_same_minutes_last_week(store: Config) -> None:
    week = timedelta(days=7)
    insert(store, [minute_of(store, m, [10.0] * 100, at=T0 - week) for m in range(4)]
           + [minute_of(store, m, [10.0] * n) for m, n in enumerate([100, 120, 300, 90])])
    rules = """
[[rule]]
name = "checkout traffic spike"
series = { app = "checkout", kind = "metric", name = "latency_ms" }
statistic = "count"
comparator = ">="
threshold = 2.5
week_over_week = true
"""
    assert evaluate_minutes(store, rules, range(1, 5)) == [("firing", 3), ("resolved", 4)]


def test_dead_letters_per_minute_are_a_pipeline_alert(store: Config) -> None:
    with connect(store) as client:
        client.insert("dead_letters", [["events", 0, i, T0, "unparseable JSON", "x", 1, T0 + 61 * timedelta(seconds=1)]
                                       for i in range(3)],
                      column_names=["source_topic", "source_partition", "source_offset", "kafka_timestamp",
                                    "reason", "raw", "raw_bytes", "detected_at"])
    rules = """
[[rule]]
name = "dead letters"
statistic = "dead_letters"
comparator = ">"
threshold = 0
"""
    # Processing time: minute 1 (12:01-12:02) holds the 3 dead letters.
    assert evaluate_minutes(store, rules, range(1, 4)) == [("firing", 2), ("resolved", 3)]


def test_offsets_lost_to_kafka_retention_per_minute_are_a_pipeline_alert(store: Config) -> None:
    columns = ["topic", "partition", "from_offset", "to_offset", "skipped_offsets", "query_name", "batch_id",
               "detected_at"]
    with connect(store) as client:
        # Detected during minute 1 (12:01-12:02): two ranges, 30 + 12 offsets; the first written twice (a replayed
        # batch rewrites its range), counted once.
        for rows in ([["events", 0, 100, 130, 30, "accept", 7, T0 + 70 * timedelta(seconds=1)],
                      ["events", 1, 0, 12, 12, "accept", 7, T0 + 70 * timedelta(seconds=1)]],
                     [["events", 0, 100, 130, 30, "accept", 7, T0 + 70 * timedelta(seconds=1)]]):
            client.insert("kafka_data_loss", rows, column_names=columns)
    rules = """
[[rule]]
name = "data lost"
statistic = "skipped_offsets"
comparator = ">="
threshold = 42
"""
    assert evaluate_minutes(store, rules, range(1, 4)) == [("firing", 2), ("resolved", 3)]
    with connect(store) as client:
        [(value,)] = client.query("SELECT value FROM alert_transitions FINAL WHERE to_state = 'firing'").result_rows
    assert value == 42.0


def test_dropped_stragglers_of_a_series_per_minute_fire_a_rule(store: Config) -> None:
    insert(store, [minute_of(store, m, [10.0] * 10) for m in range(4)])    # the series exists
    with connect(store) as client:
        client.insert("stragglers", [["tumbling", 60_000, 60_000, "checkout", "metric", "latency_ms", "", T0, T0,
                                      0, i, f"e{i}", "d", T0, T0, 1000, "windows", 1,
                                      T0 + 90 * timedelta(seconds=1)] for i in range(4)],
                      column_names=["window_kind", "window_length_ms", "window_hop_ms", "app", "kind", "name",
                                    "series_tags", "window_start", "window_end", "source_partition",
                                    "source_offset", "event_id", "device", "corrected_event_time", "watermark",
                                    "lateness_ms", "query_name", "batch_id", "detected_at"])
    rules = P99_FOR_2.replace('statistic = "p99"', 'statistic = "dropped_stragglers"').replace(
        "threshold = 500", "threshold = 3").replace("for = 2", "for = 1")
    # detected during minute 1 (12:01-12:02): 4 distinct events > 3
    assert evaluate_minutes(store, rules, range(1, 4)) == [("firing", 2), ("resolved", 3)]


def test_freshness_and_lag_are_sampled_from_the_pipeline_when_the_evaluator_runs(store: Config) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": store.kafka.bootstrap})
    for _ in range(25):
        producer.produce(store.kafka.events_topic, b"{}", b"k", partition=0)
    producer.flush(10)
    processed = json.dumps([{"endOffset": json.dumps({store.kafka.events_topic: {"0": 5}})}])
    now = T0 + 10 * MINUTE
    with connect(store) as client:
        client.insert("pipeline_progress", [["windows", "q", "r", 1, now, now - 5 * MINUTE, processed, now]],
                      column_names=["query_name", "query_id", "run_id", "batch_id", "batch_timestamp", "watermark",
                                    "sources", "recorded_at"])
    rules = parse_rules("""
[[rule]]
name = "stale"
statistic = "freshness"
comparator = ">"
threshold = 120
[[rule]]
name = "behind"
statistic = "lag"
comparator = ">="
threshold = 20
""")
    moved = evaluate(store, rules, now=ms(now + timedelta(seconds=30)))
    assert sorted((t.rule, t.to, t.value) for t in moved) == [("behind", "firing", 20.0), ("stale", "firing", 330.0)]
