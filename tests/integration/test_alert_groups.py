"""Grouped notifications through routes and receivers, and silences (command line, HTTP API), against a real store
and a real HTTP receiver on loopback.

Windows are written as the job writes them and the ``windows`` watermark advanced minute by minute; the evaluator,
the grouping and the delivery run as the service runs them, on a test clock stepping every 30 s.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from alerting import service
from alerting.alertmanager import fingerprint
from alerting.api import MAX_BODY_BYTES, create_app
from alerting.rules import rules_for
from alerting.silences import expire, new_silence, save
from alerting.silences import listed as listed_silences
from eventide.config import Config, ConfigError
from stack.cli import build_parser, silence_command
from stack.services import free_port
from store.migrations import apply_migrations
from store.range_query import SeriesKey
from tests.support.alert_clock import MINUTE, SLOW_P99_RULE, AlertingOnTestClock, latency_minutes, with_rules
from tests.support.fault_injection import WebhookReceiver
from tests.support.pipeline import wait_until
from tests.support.servers import uvicorn_in_thread
from tests.support.stack import fresh_stack
from tests.support.window_rows import Event, insert, window_row

T0 = (datetime.now(UTC) - timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
SLOW, FAST = [900.0] * 100, [10.0] * 100


def ms(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)

RULES = SLOW_P99_RULE + """labels = { team = "web" }

[routing]
receiver = "oncall"
group_by = ["alertname"]
group_wait = "30s"
group_interval = "5m"
repeat_interval = "4h"

[[receiver]]
name = "oncall"
webhook = { url = "URL" }
"""


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as hook:
        yield hook


@pytest.fixture
def store(kafka: Config, request: pytest.FixtureRequest, tmp_path: Path, receiver: WebhookReceiver) -> Config:
    return with_rules(fresh_stack(kafka, request.node.name), tmp_path / "alerts.toml",
                      RULES.replace("URL", receiver.url))


def run_service(config: Config, receiver: WebhookReceiver, until_s: int,
                from_s: int = 65) -> list[tuple[int, dict[str, Any]]]:
    """A pass every 30 s of test clock from T0 + ``from_s``; (seconds, body) of each notification ``receiver``
    got."""
    service = AlertingOnTestClock(config, rules_for(config), T0)
    got: list[tuple[int, dict[str, Any]]] = []
    for t in range(from_s, until_s + 1, 30):
        before = len(receiver.received)
        service.at(t)
        got += [(t, r.body) for r in receiver.received[before:] if r.body is not None]
    return got


def test_thirty_series_make_one_notification_a_late_one_one_more_and_the_all_clear_one_resolved(
        store: Config, receiver: WebhookReceiver) -> None:
    # Given 30 apps slow for minutes 0-9 and one more slow from minute 3, all fast in minute 10,
    rows = [row for i in range(30) for row in latency_minutes(store, T0, f"app{i:02d}", [SLOW] * 10 + [FAST])]
    insert(store, rows + latency_minutes(store, T0, "late", [FAST] * 3 + [SLOW] * 7 + [FAST]))
    got = run_service(store, receiver, 725)

    # the 30 fire at the first evaluation (65 s) and are sent together after group_wait (95 s);
    assert [(t, b["status"], len(b["alerts"])) for t, b in got] == [
        (95, "firing", 30),
        # "late" fires at 245 s and waits for the group's next interval (95 + 300 s); nothing repeats before 4 h;
        (395, "firing", 31),
        # all resolve at 665 s (minute 10 ends at 660 s): one resolved notification at the next interval.
        (695, "resolved", 31)]
    first, _, clear = (b for _, b in got)
    assert first["groupKey"] == '{}:{alertname="slow"}' and first["groupLabels"] == {"alertname": "slow"}
    assert first["commonLabels"] == {"alertname": "slow", "severity": "warning", "kind": "metric",
                                     "name": "latency_ms", "team": "web"}
    assert first["version"] == "4" and first["receiver"] == "oncall"
    alert = first["alerts"][0]
    assert alert["fingerprint"] == fingerprint(alert["labels"]) and alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert alert["startsAt"] == (T0 + MINUTE).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert {a["status"] for a in clear["alerts"]} == {"resolved"}
    assert {a["endsAt"] for a in clear["alerts"]} == {(T0 + 11 * MINUTE).strftime("%Y-%m-%dT%H:%M:%SZ")}


BY_APP = RULES.replace('group_by = ["alertname"]', 'group_by = ["app"]').replace('"30s"', '"10s"').replace(
    '"5m"', '"1m"')


def test_thirty_series_in_ten_apps_grouped_by_app_make_ten_notifications_and_a_restart_sends_none_again(
        store: Config, receiver: WebhookReceiver) -> None:
    store.alert_rules_file.write_text(RULES.replace('group_by = ["alertname"]', 'group_by = ["app"]')
                                      .replace("URL", receiver.url))
    # Given 10 apps with 3 slow series each (one per region tag),
    rows = []
    for app in range(10):
        for region in ("ap", "eu", "us"):
            series = SeriesKey(f"app{app}", "metric", "latency_ms", f"region={region}")
            rows += [window_row(store, series, T0 + m * MINUTE, MINUTE,
                                [Event(T0 + m * MINUTE + timedelta(seconds=1), v) for v in SLOW]) for m in range(10)]
    insert(store, rows)
    # when the service runs, then is restarted and runs on (before repeat_interval),
    got = run_service(store, receiver, 275)
    again = run_service(store, receiver, 545, from_s=305)
    # one notification per app carries its three alerts, and the restarted service sends nothing again.
    assert sorted((t, b["groupLabels"]["app"], len(b["alerts"])) for t, b in got) == [
        (95, f"app{app}", 3) for app in range(10)]
    assert again == [], again


def test_a_silence_mutes_exactly_the_alerts_it_matches_through_a_restart_until_it_is_expired(
        store: Config, receiver: WebhookReceiver) -> None:
    store.alert_rules_file.write_text(BY_APP.replace("URL", receiver.url))
    insert(store, latency_minutes(store, T0, "checkout", [SLOW] * 6)
           + latency_minutes(store, T0, "search", [SLOW] * 6))
    apply_migrations(store)
    # Given a silence of app="checkout" from the start,
    silence = new_silence(['app="checkout"'], ms(T0), ms(T0 + timedelta(days=1)), "alice", "deploy")
    save(store, silence)

    def notified_apps(service: AlertingOnTestClock, seconds: range) -> list[tuple[int, str]]:
        got = []
        for t in seconds:
            before = len(receiver.received)
            service.at(t)
            got += [(t, r.body["groupLabels"]["app"]) for r in receiver.received[before:] if r.body is not None]
        return got

    # only search is notified, also by a restarted service (the silence is read from the store);
    assert notified_apps(AlertingOnTestClock(store, rules_for(store), T0), range(65, 106, 20)) == [(85, "search")]
    assert notified_apps(AlertingOnTestClock(store, rules_for(store), T0), range(125, 146, 20)) == []
    # expired, checkout is notified at the next pass (known for longer than group_wait, its new group goes at once).
    expire(store, silence.id, at_ms=ms(T0 + timedelta(seconds=150)))
    assert notified_apps(AlertingOnTestClock(store, rules_for(store), T0), range(165, 186, 20)) == [(165, "checkout")]


def test_silences_are_added_listed_and_expired_from_the_command_line(
        store: Config, capsys: pytest.CaptureFixture[str]) -> None:
    def command(*words: str) -> str:
        assert silence_command(store, build_parser().parse_args(["alerts", "silence", *words])) == 0
        return capsys.readouterr().out

    silence_id = command("add", 'app="checkout"', "--duration", "30m", "--comment", "deploy 42",
                         "--author", "alice").strip()
    [line] = command("list").splitlines()
    assert line.startswith(f"{silence_id}  active") and 'app="checkout"' in line and "'deploy 42'" in line
    command("expire", silence_id)
    assert command("list") == ""
    assert f"{silence_id}  expired" in command("list", "--all")
    with pytest.raises(ConfigError, match="already ended"):
        command("expire", silence_id)


TOKEN = "silences-test-token-0123456789"


def test_silences_over_alertmanagers_http_api_need_a_token_and_mute_like_the_command_line(store: Config) -> None:
    api_config = store.model_copy(update={"alerting": store.alerting.model_copy(update={"api_tokens": [TOKEN]})})
    apply_migrations(api_config)
    port = free_port()
    server = uvicorn.Config(create_app(api_config), host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    base = f"http://127.0.0.1:{port}/api/v2"

    def call(method: str, path: str, body: object = None, token: str | None = TOKEN) -> tuple[int, Any]:
        request = urllib.request.Request(base + path, method=method, data=None if body is None else
                                         json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, json.load(answer)
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    # What amtool posts: Alertmanager's PostableSilence.
    silence = {"matchers": [{"name": "app", "value": "checkout", "isRegex": False, "isEqual": True}],
               "startsAt": "2026-01-01T00:00:00Z", "endsAt": "2999-01-01T00:00:00Z", "createdBy": "alice",
               "comment": "deploy 42"}
    with uvicorn_in_thread(server):
        assert call("GET", "/silences", token=None)[0] == 401
        assert call("GET", "/silences", token="silences-test-token-wrong!!")[0] == 401
        status, created = call("POST", "/silences", silence)
        assert status == 200
        silence_id = created["silenceID"]
        [listed] = call("GET", "/silences")[1]
        assert listed["id"] == silence_id and listed["status"] == {"state": "active"}
        assert listed["matchers"] == silence["matchers"] and listed["createdBy"] == "alice"
        # what the command line, the evaluator and the page read: the same silence in the store;
        [stored] = listed_silences(api_config)
        assert [str(m) for m in stored.matchers] == ['app="checkout"']
        # one that would mute everything is refused, as Alertmanager refuses it;
        everything = {**silence, "matchers": [{"name": "app", "value": ".*", "isRegex": True}]}
        assert call("POST", "/silences", everything)[0] == 400
        # expired over HTTP, it is listed as expired and mutes nothing more.
        assert call("DELETE", f"/silence/{silence_id}")[0] == 200
        assert [s["status"]["state"] for s in call("GET", "/silences")[1]] == ["expired"]
        assert call("DELETE", "/silence/no-such-id")[0] == 404
        # a body over the cap is refused unread; invalid UTF-8 and deep nesting are client errors, never a 5xx.
        assert call("POST", "/silences", {"comment": "x" * (MAX_BODY_BYTES + 1)})[0] == 413
        for raw in (b'{"matchers": [{"name": "app", "value": "\xff"}]}', b"[" * 100_000 + b"]" * 100_000):
            request = urllib.request.Request(base + "/silences", method="POST", data=raw, headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert 400 <= refused.value.code < 500


def test_the_running_service_groups_notifies_after_group_wait_and_serves_the_silences_api(
        store: Config, receiver: WebhookReceiver, tmp_path: Path) -> None:
    # Given a rule that breaches on every window (no dead letters >= 0) routed to a webhook with a 1-s group_wait,
    # and the silences API on a free port, the service running as `eventide alerts` runs it:
    rules = ('[[rule]]\nname = "any dead letter"\nstatistic = "dead_letters"\ncomparator = ">="\nthreshold = 0\n'
             f'[routing]\nreceiver = "oncall"\ngroup_wait = "1s"\n[[receiver]]\nname = "oncall"\n'
             f'webhook = {{ url = "{receiver.url}" }}\n')
    port = free_port()
    config = with_rules(store, tmp_path / "service.toml", rules)
    config = config.model_copy(update={"alerting": config.alerting.model_copy(update={
        "evaluation_interval_s": 0.2, "api_port": port, "api_tokens": [TOKEN]})})
    stop = threading.Event()
    thread = threading.Thread(target=service.run, kwargs={"config": config, "stop": stop, "targets": []},
                              daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        wait_until(lambda: receiver.delivered(), timeout_s=20, interval_s=0.05)
        waited = receiver.delivered()[0].at - started
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v2/silences",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.status == 200 and json.load(answer) == []
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    # one group notification, sent no sooner than group_wait after the first evaluation found the alert.
    [sent] = [r.body for r in receiver.delivered()]
    assert sent["groupKey"] == "{}:{}" and sent["status"] == "firing" and waited >= 1.0
