"""An alert's labels and annotations: from its rule and series, the rule's own on top, text filled in plainly."""

from __future__ import annotations

import json

import pytest

from alerting.evaluator import described
from alerting.labels import alert_labels, fill
from alerting.rules import parse_rules
from alerting.state import Transition
from eventide.config import Config, ConfigError
from store.range_query import SeriesKey

RULE = """
[[rule]]
name = "checkout p99 latency"
series = { app = "*", kind = "metric", name = "latency_ms" }
window_s = 60
statistic = "p99"
comparator = ">"
threshold = 250
severity = "critical"
labels = { team = "payments", app = "not this one" }
annotations = { summary = "{app} slow: p99 {value} ms", runbook = "https://runbooks.example/{alertname}" }
"""
CHECKOUT = SeriesKey("checkout", "metric", "latency_ms")
WINDOW_END_MS = 1_795_000_020_000     # 2026-11-18 11:07:00 UTC


def rule_with(**lines: str):
    text = RULE
    for key, line in lines.items():
        text = "\n".join(x for x in text.splitlines() if not x.startswith(f"{key} ")) + "\n" + line + "\n"
    return parse_rules(text).rule[0]


def test_an_alert_is_labelled_by_its_rule_and_series_and_the_rules_own_labels():
    assert alert_labels("checkout p99 latency", "critical", CHECKOUT, {"team": "payments"}) == {
        "alertname": "checkout p99 latency", "severity": "critical", "app": "checkout", "kind": "metric",
        "name": "latency_ms", "team": "payments"}
    assert alert_labels("dead letters", "warning", None, {}) == {"alertname": "dead letters", "severity": "warning"}


def test_a_transition_carries_labels_and_filled_in_annotations():
    rule = rule_with(labels='labels = { team = "payments" }')
    firing = Transition(rule.name, CHECKOUT.label, "firing", WINDOW_END_MS, 312.5, 250.0, "critical")
    labels, annotations = (json.loads(text) for text in described(Config(), rule, firing, CHECKOUT))
    assert labels["team"] == "payments" and labels["app"] == "checkout"
    assert annotations["summary"] == "checkout slow: p99 312.5 ms"
    assert annotations["runbook"] == "https://runbooks.example/checkout p99 latency"
    assert annotations["description"] == (
        "p99 of checkout · metric · latency_ms was 312.5 in the 60-s window ending 2026-11-18 11:07:00 UTC "
        "(fires when > 250); now firing")


def test_a_transition_links_to_the_alerts_page_and_a_log_series_to_exactly_its_lines():
    config = Config().model_copy(update={"dashboard": Config().dashboard.model_copy(
        update={"public_url": "https://metrics.example.com/"})})
    errors = SeriesKey("checkout", "log", "app.server")
    rule = rule_with(labels="labels = {}").model_copy(update={"statistic": "error_ratio", "for_windows": 2})
    firing = Transition(rule.name, errors.label, "firing", WINDOW_END_MS, 0.2, 0.05, "critical")
    _, annotations = (json.loads(text) for text in described(config, rule, firing, errors))
    assert annotations["dashboard_url"] == "https://metrics.example.com/alerts?minutes=15"
    # the two windows that made it fire (for = 2), error and critical lines of that app and logger:
    assert annotations["logs_url"] == (
        "https://metrics.example.com/logs?app=checkout&level=error&level=critical&name=app.server"
        "&from=2026-11-18T11%3A05%3A00.000Z&to=2026-11-18T11%3A07%3A00.000Z")
    metric = Transition(rule.name, CHECKOUT.label, "firing", WINDOW_END_MS, 312.5, 250.0, "critical")
    _, on_metric = (json.loads(text) for text in described(Config(), rule_with(labels="labels = {}"), metric, CHECKOUT))
    assert "logs_url" not in on_metric and on_metric["dashboard_url"].startswith("http://127.0.0.1:8501/alerts")


def test_filling_in_is_plain_substitution():
    assert fill("{value.__class__} {value} {{value}}", {"value": "3"}) == "{value.__class__} 3 {3}"


@pytest.mark.parametrize(("line", "message"), [
    ('labels = { app = "x" }', "label 'app' comes from the rule and its series"),
    ('labels = { "team-name" = "x" }', "label 'team-name': a label name is letters, digits and _"),
    ('annotations = { summary = "{valu}" }', "annotation 'summary': unknown placeholder {valu}"),
])
def test_a_label_or_annotation_that_cannot_work_is_refused_naming_it(line: str, message: str):
    with pytest.raises(ConfigError, match=message):
        rule_with(labels=line) if line.startswith("labels") else rule_with(annotations=line)
