"""The alerting service's passes on a test clock: windows written as the job writes them, the ``windows`` watermark at
the last minute boundary, then evaluation, routing and delivery, as ``alerting.service`` runs them."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from alerting.delivery import deliver, receiver_deliveries
from alerting.dispatch import GroupNotifier
from alerting.evaluator import evaluate
from alerting.rules import AlertRules
from eventide.config import Config
from store.client import connect
from store.range_query import SeriesKey
from tests.support.window_rows import Event, window_row

MINUTE = timedelta(minutes=1)
SLOW_P99_RULE = """
[[rule]]
name = "slow"
series = { app = "*", kind = "metric", name = "latency_ms" }
window_s = 60
statistic = "p99"
comparator = ">"
threshold = 500
"""
"""A rule on every app's 1-min latency p99 (breached by 900 ms values): each test adds its labels and routes."""


def with_rules(config: Config, rules_file: Path, text: str) -> Config:
    """``config`` reading its alert rules from ``rules_file``, written with ``text``."""
    rules_file.write_text(text)
    return config.model_copy(update={"alerting": config.alerting.model_copy(update={"rules_file": rules_file})})


def latency_minutes(config: Config, t0: datetime, app: str, latencies: list[list[float]]) -> list[dict[str, Any]]:
    """The rows of ``app``'s ``latency_ms`` windows, one per minute from ``t0``."""
    series = SeriesKey(app, "metric", "latency_ms")
    return [window_row(config, series, t0 + m * MINUTE, MINUTE,
                       [Event(t0 + m * MINUTE + timedelta(seconds=1), v) for v in lat])
            for m, lat in enumerate(latencies)]


class AlertingOnTestClock:
    """One rules file's evaluator, routes and receivers; :meth:`at` runs a pass at ``t0`` + seconds."""

    def __init__(self, config: Config, rules: AlertRules, t0: datetime) -> None:
        self.config, self.rules, self.t0 = config, rules, t0
        self.grouping = GroupNotifier(config, rules)
        self.receivers = receiver_deliveries(config, rules)

    def at(self, seconds: int) -> None:
        now, mark = self.t0 + timedelta(seconds=seconds), self.t0 + (seconds // 60) * MINUTE
        with connect(self.config) as client:
            client.insert("pipeline_progress", [["windows", "q", "r", seconds, mark, mark, mark]],
                          column_names=["query_name", "query_id", "run_id", "batch_id", "batch_timestamp",
                                        "watermark", "recorded_at"])
        now_ms = int(now.timestamp() * 1000)
        evaluate(self.config, self.rules, now=now_ms)
        self.grouping.flush(now_ms)
        deliver(self.config, [], self.receivers)
