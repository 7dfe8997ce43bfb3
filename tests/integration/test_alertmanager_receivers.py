"""What the receivers send, checked by Alertmanager's own code: a loopback receiver in Go (tests/integration/
alertmanager_go, built by ``./run test``) decodes each ``POST /api/v2/alerts`` into Alertmanager's
``models.PostableAlerts`` and calls its ``Validate``, and each webhook body into its webhook notifier's ``Message``,
refusing unknown fields; it answers 400 to anything they refuse."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from alerting.alertmanager import fingerprint
from alerting.rules import rules_for
from eventide.config import Config
from stack.services import free_port
from tests.support.alert_clock import MINUTE, SLOW_P99_RULE, AlertingOnTestClock, latency_minutes, with_rules
from tests.support.stack import fresh_stack
from tests.support.window_rows import insert

RECEIVER = Path(__file__).parent / "alertmanager_go" / "bin" / "receiver"
T0 = (datetime.now(UTC) - timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
SLOW, FAST = [900.0] * 100, [10.0] * 100

RULES = SLOW_P99_RULE + """annotations = { summary = "{app} p99 {value} ms", runbook = "https://runbooks.example/slow" }

[routing]
receiver = "hook"
group_by = ["app"]
group_wait = "10s"
group_interval = "1m"

[[route]]                                 # checkout's alerts go to the team's Alertmanager, and on
matchers = ['app = "checkout"']
receiver = "team-alertmanager"
continue = true

[[route]]                                 # every alert to the webhook, in Alertmanager's webhook format
receiver = "hook"

[[receiver]]
name = "team-alertmanager"
alertmanager = { url = "BASE", resend_interval = "1m" }

[[receiver]]
name = "hook"
webhook = { url = "BASE/webhook" }
"""


class GoReceiver:
    """The Go program on a free loopback port."""

    def __init__(self) -> None:
        assert RECEIVER.is_file(), "./run test builds it (go build in tests/integration/alertmanager_go)"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen([str(RECEIVER), f"127.0.0.1:{port}"], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.received()
                return
            except OSError:
                assert time.monotonic() < deadline and self.process.poll() is None, "the Go receiver did not start"
                time.sleep(0.05)

    def received(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/received", timeout=5) as answer:
            return json.load(answer)

    def close(self) -> None:
        self.process.kill()
        self.process.wait(5)


@pytest.fixture
def go_receiver() -> Iterator[GoReceiver]:
    receiver = GoReceiver()
    yield receiver
    receiver.close()


@pytest.fixture
def store(kafka: Config, request: pytest.FixtureRequest, tmp_path: Path, go_receiver: GoReceiver) -> Config:
    return with_rules(fresh_stack(kafka, request.node.name), tmp_path / "alerts.toml",
                      RULES.replace("BASE", go_receiver.url))


def test_alertmanager_and_its_webhook_format_accept_every_request_and_see_alerts_fire_and_resolve(
        store: Config, go_receiver: GoReceiver) -> None:
    # Given checkout and search slow in minutes 0-2 and fast in minute 3, a pass every 20 s of test clock:
    insert(store, latency_minutes(store, T0, "checkout", [SLOW] * 3 + [FAST])
           + latency_minutes(store, T0, "search", [SLOW] * 3 + [FAST]))
    service = AlertingOnTestClock(store, rules_for(store), T0)
    for t in range(65, 306, 20):
        service.at(t)

    received = go_receiver.received()
    assert [r for r in received if not r["valid"]] == []        # Alertmanager's types accept every request
    pushed = [r["body"] for r in received if r["path"] == "/api/v2/alerts"]
    hooks = [r["body"] for r in received if r["path"] == "/webhook"]

    # The Alertmanager gets checkout's alert only (search's route does not lead there): firing from the first pass,
    # sent again every minute, valid for four resends; then resolved at the end of minute 3 once evaluated (245 s).
    assert {a["labels"]["app"] for body in pushed for a in body} == {"checkout"}
    firing, resolved = [b[0] for b in pushed if b[0]["endsAt"] != (T0 + 4 * MINUTE).strftime("%Y-%m-%dT%H:%M:%SZ")], \
        [b[0] for b in pushed if b[0]["endsAt"] == (T0 + 4 * MINUTE).strftime("%Y-%m-%dT%H:%M:%SZ")]
    assert len(firing) == 3 and len(resolved) >= 1          # at 65, 125 and 185 s; then resolved from 245 s
    assert firing[0]["startsAt"] == (T0 + MINUTE).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert firing[0]["endsAt"] == (T0 + timedelta(seconds=65 + 4 * 60)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert firing[0]["annotations"]["runbook"] == "https://runbooks.example/slow"
    assert firing[0]["generatorURL"].startswith("http://127.0.0.1:8501/alerts?minutes=")

    # The webhook gets both apps, a group each, firing after group_wait, then resolved.
    assert sorted((h["groupLabels"]["app"], h["status"]) for h in hooks) == [
        ("checkout", "firing"), ("checkout", "resolved"), ("search", "firing"), ("search", "resolved")]
    checkout = next(h for h in hooks if h["groupLabels"]["app"] == "checkout")
    assert checkout["groupKey"] == '{}/{}:{app="checkout"}'
    assert checkout["alerts"][0]["fingerprint"] == fingerprint(checkout["alerts"][0]["labels"])
