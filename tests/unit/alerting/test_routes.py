"""Routes, matchers and durations as Alertmanager reads them; the webhook payload as its receivers read it."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from alerting.alertmanager import Alert, fingerprint, go_time, webhook_message
from alerting.routes import Matcher, RootRoute, Route, resolve, seconds_of
from alerting.rules import parse_rules
from eventide.config import ConfigError


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("5m", 300), ("4h", 14400), ("1h30m", 5400),
                                               ("1d", 86400), ("250ms", 0.25), (45, 45)])
def test_durations_are_alertmanagers_or_seconds(text: str | int, seconds: float) -> None:
    assert seconds_of(text) == seconds


@pytest.mark.parametrize("text", ["", "5 minutes", "m5", "1.5h"])
def test_a_duration_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        seconds_of(text)


@pytest.mark.parametrize(("matcher", "labels", "matches"), [
    ('app = "checkout"', {"app": "checkout"}, True),
    ("app=checkout", {"app": "search"}, False),
    ('app != "checkout"', {}, True),                         # a missing label is ""
    ('severity =~ "warning|critical"', {"severity": "critical"}, True),
    ("severity =~ warn", {"severity": "warning"}, False),    # the whole value must match
    ('team !~ "pay.*"', {"team": "payments"}, False),
    ('summary = "say \\"hi\\""', {"summary": 'say "hi"'}, True),
])
def test_matchers_compare_a_label_as_alertmanager_does(matcher: str, labels: dict[str, str], matches: bool) -> None:
    assert Matcher.parse(matcher).matches(labels) is matches


@pytest.mark.parametrize("text", ["app", "app ~ x", "1app = x", "app =~ ("])
def test_a_malformed_matcher_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="matcher"):
        Matcher.parse(text)


def test_children_inherit_what_they_do_not_set_and_continue_tries_the_next_sibling() -> None:
    tree = resolve(RootRoute(receiver="default", group_by=["alertname"], group_interval="10m"), [
        Route.model_validate({"matchers": ["team=payments"], "receiver": "payments", "continue": True,
                              "route": [{"matchers": ["severity=critical"], "receiver": "pager"}]}),
        Route.model_validate({"matchers": ["team=~pay.*"], "receiver": "audit", "group_by": ["..."]}),
    ])
    critical = {"alertname": "x", "team": "payments", "severity": "critical"}
    assert [r.receiver for r in tree.routes_for(critical)] == ["pager", "audit"]
    assert [r.receiver for r in tree.routes_for({"alertname": "x", "team": "payments"})] == ["payments", "audit"]
    assert [r.receiver for r in tree.routes_for({"alertname": "x"})] == ["default"]
    pager = tree.routes_for(critical)[0]
    assert (pager.group_by, pager.group_interval_s, pager.group_wait_s) == (("alertname",), 600, 30)
    assert tree.routes_for(critical)[1].group_labels(critical) == critical


def test_a_route_with_an_unknown_field_or_a_bad_group_by_label_is_refused() -> None:
    with pytest.raises(ValidationError, match="receivr"):
        Route.model_validate({"receivr": "x"})
    with pytest.raises(ValidationError, match="group_by"):
        Route.model_validate({"group_by": ["app-name"]})


def test_fingerprints_are_prometheus_label_set_hashes() -> None:
    # FNV-1a 64 over the sorted names and values, each followed by the 0xff separator.
    assert fingerprint({}) == "cbf29ce484222325"
    assert fingerprint({"a": "b"}) == fingerprint({"a": "b"}) != fingerprint({"a": "c"})
    assert fingerprint({"a": "1", "b": "2"}) == fingerprint({"b": "2", "a": "1"})
    assert fingerprint({"ab": ""}) != fingerprint({"a": "b"})


def test_the_webhook_payload_is_alertmanagers_version_4() -> None:
    firing = Alert({"alertname": "slow", "app": "a"}, {"summary": "s"}, 1_764_000_000_000, None)
    resolved = Alert({"alertname": "slow", "app": "b"}, {"summary": "s"}, 1_764_000_000_500, 1_764_000_060_000)
    message = webhook_message("on.call", '{}:{alertname="slow"}', {"alertname": "slow"}, [firing, resolved],
                              max_alerts=1)
    assert message["version"] == "4" and message["status"] == "firing" and message["receiver"] == "on\\.call"
    assert message["commonLabels"] == {"alertname": "slow"} and message["commonAnnotations"] == {"summary": "s"}
    assert message["truncatedAlerts"] == 1
    [sent] = message["alerts"]
    assert sent["endsAt"] == "0001-01-01T00:00:00Z" and sent["startsAt"] == "2025-11-24T16:00:00Z"
    assert sent["fingerprint"] == fingerprint(firing.labels)
    assert go_time(1_764_000_000_500) == "2025-11-24T16:00:00.5Z"


RULE = """
[[rule]]
name = "dead letters"
statistic = "dead_letters"
comparator = ">"
threshold = 0
"""


def test_a_rules_file_routes_its_alerts_through_the_routing_tree_it_declares() -> None:
    rules = parse_rules(RULE + """
[routing]
receiver = "oncall"
group_by = ["alertname"]
[[route]]
matchers = ['severity = "critical"']
receiver = "pager"
[[receiver]]
name = "oncall"
webhook = { url = "http://127.0.0.1:9/a" }
[[receiver]]
name = "pager"
webhook = { url = "http://127.0.0.1:9/b", send_resolved = false }
""")
    tree = rules.routing_tree
    assert tree is not None and tree.routes_for({"severity": "critical"})[0].receiver == "pager"
    assert [r.send_resolved for r in rules.receiver] == [True, False]
    assert parse_rules(RULE).routing_tree is None        # a file without [routing]: per-transition channels only


@pytest.mark.parametrize(("tables", "problem"), [
    ('[[receiver]]\nname = "a"\nwebhook = { url = "http://h/" }', "need a [routing] table"),
    ('[routing]\nreceiver = "nobody"', "routing.receiver: no [[receiver]] is named 'nobody'"),
    ('[routing]\nreceiver = "a"\n[[route]]\nreceiver = "b"\n[[receiver]]\nname = "a"\nwebhook = { url = "http://h/" }',
     "route[0].receiver: no [[receiver]] is named 'b'"),
    ('[routing]\nreceiver = "a"\n[[receiver]]\nname = "a"', 'has one of webhook'),
    ('[routing]\nreceiver = "a"\n[[receiver]]\nname = "a"\nwebhook = { url = "ftp://h/" }', "http://"),
])
def test_routes_and_receivers_that_cannot_work_stop_startup_naming_the_problem(tables: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)):
        parse_rules(RULE + tables)
