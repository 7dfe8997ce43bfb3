"""Alert rules on log lines against a real store: the demo's rule ("payments declined", alerts.toml) counts the lines
its search finds in each finished minute, fires on the demo's error burst (stack.demo_load) and resolves after it,
and its notification's link opens the Logs page's search on exactly the burst's lines.

Lines and windows are written as the job writes them; the ``windows`` watermark advances minute by minute
(tests.support.alert_clock), as a running job moves it.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from alerting.evaluator import evaluate
from alerting.rules import AlertRules, parse_rules
from dashboard import log_search
from eventide.config import Config, load_config
from stack.demo_load import BURST_LOGGER, burst_message
from store.client import connect
from store.log_query import LogQuery
from store.migrations import apply_migrations
from store.range_query import SeriesKey
from tests.integration.test_log_search import log_line
from tests.support import dashboard_data as data
from tests.support.alert_clock import MINUTE
from tests.support.stack import own_database
from tests.support.window_rows import Event, window_row

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# An hour boundary two hours ago: inside every table's retention.
T0 = (datetime.now(UTC) - timedelta(hours=2)).replace(minute=0, second=0, microsecond=0, tzinfo=None)
SEARCH = 'checkout · log · lines "payment declined" level=error'


def demo_rule() -> AlertRules:
    """The demo's rule on log lines, as alerts.toml has it."""
    rules = parse_rules((ROOT / "alerts.toml").read_text(), "alerts.toml")
    return rules.model_copy(update={"rule": [r for r in rules.rule if r.name == "payments declined"]})


@pytest.fixture
def store(tmp_path: Path, store_url: str) -> Config:
    config = load_config(environ={}, root=str(tmp_path),
                         store={"url": store_url, "database": own_database("log_rules")})
    apply_migrations(config)
    return config


def evaluate_at(config: Config, rules: AlertRules, minute: int) -> list:
    """A pass at ``T0`` + ``minute`` minutes, the ``windows`` watermark there."""
    mark = T0 + minute * MINUTE
    with connect(config) as client:
        client.insert("pipeline_progress", [["windows", "q", "r", minute, mark, mark, mark]],
                      column_names=["query_name", "query_id", "run_id", "batch_id", "batch_timestamp", "watermark",
                                    "recorded_at"])
    return evaluate(config, rules, now=int(mark.replace(tzinfo=UTC).timestamp() * 1000) + 5_000)


def test_the_demo_rule_fires_on_the_error_burst_and_links_to_exactly_its_lines(store: Config):
    rng = random.Random(7)
    # Given six minutes of the demo's ordinary lines in two apps, with the error burst of checkout in minute 3
    # (2 lines/s), a few declined payments in search's minute 3 (under the threshold), and lines that hold the
    # words but not as the search wants them (a warning; the words apart),
    ordinary = [log_line(T0 + m * MINUTE + timedelta(seconds=s), f"demo {level} message", app=app, level=level)
                for m in range(6) for s in range(0, 60, 5) for app in ("checkout", "search")
                for level in ("info", "error")]
    burst = [log_line(T0 + 2 * MINUTE + timedelta(milliseconds=500 * k), burst_message(rng), app="checkout",
                      level="error", name=BURST_LOGGER) for k in range(120)]
    others = [*(log_line(T0 + 2 * MINUTE + timedelta(seconds=k), burst_message(rng), app="search", level="error",
                         name=BURST_LOGGER) for k in range(5)),
              log_line(T0 + 2 * MINUTE + timedelta(seconds=1), "payment declined, retrying", app="checkout",
                       level="warning"),
              log_line(T0 + 2 * MINUTE + timedelta(seconds=2), "declined: payment of 12 EUR", app="checkout",
                       level="error")]
    with connect(store) as client:
        data.insert_rows(client, "logs", [*ordinary, *burst, *others])
        # the apps' log windows, through which the rule knows which apps log (app = "*"),
        data.insert_rows(client, "window_aggregates", [
            window_row(store, SeriesKey(app, "log", "app.server"), T0 + m * MINUTE, MINUTE,
                       [Event(T0 + m * MINUTE, level="info")]) for m in range(6) for app in ("checkout", "search")])
    rules = demo_rule()
    # when the evaluator runs minute by minute,
    found = [t for minute in range(1, 7) for t in evaluate_at(store, rules, minute)]
    # then checkout's alert fires at the end of the burst's minute with its count and resolves a minute later;
    # search's five lines stay under the threshold,
    burst_end = T0 + 3 * MINUTE
    assert [(t.series, t.to, t.window_end_ms, t.value) for t in found if t.notify] == [
        (SEARCH, "firing", _ms(burst_end), 120.0), (SEARCH, "resolved", _ms(burst_end + MINUTE), 0.0)]
    # and the firing notification's links open the Logs page on that search over that minute: exactly the burst.
    with connect(store, role="reader") as client:
        labels, annotations = client.query(
            "SELECT labels, annotations FROM alert_transitions FINAL WHERE to_state = 'firing'").result_rows[0]
        assert json.loads(labels) | {"team": "checkout"} == {
            "alertname": "payments declined", "severity": "critical", "app": "checkout", "kind": "log",
            "name": 'lines "payment declined" level=error', "team": "checkout"}
        assert json.loads(annotations)["summary"] == "checkout: 120 declined payments logged in 60 s"
        query = logs_page_query(json.loads(annotations)["logs_url"])
        assert (query.since, query.until) == (T0 + 2 * MINUTE, burst_end)
        shown = log_search.search_lines(client, query, limit=1000)
    assert sorted(shown["event_id"]) == sorted(line["event_id"] for line in burst)


def logs_page_query(url: str) -> LogQuery:
    """The search the Logs page runs for a link (dashboard/views/logs.py reads the same URL parameters)."""
    params = parse_qs(urlparse(url).query)
    assert urlparse(url).path.endswith("/logs"), url
    return LogQuery(log_search.naive_utc(log_search.parse_time(params["from"][0])),
                    log_search.naive_utc(log_search.parse_time(params["to"][0])),
                    apps=tuple(params.get("app", [])), levels=tuple(params.get("level", [])),
                    names=tuple(params.get("name", [])), text=params.get("q", [""])[0],
                    tags=tuple(t for t in map(log_search.parse_tag, params.get("tag", [])) if t is not None))


def _ms(t: datetime) -> int:
    return int(t.replace(tzinfo=UTC).timestamp() * 1000)
