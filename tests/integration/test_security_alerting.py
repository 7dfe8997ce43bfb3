"""Alert delivery against hostile names, broken values and broken receivers (issue 36): a real store, the real
evaluator and delivery threads, and a real local webhook receiver (``http.server`` in a thread).

Each notification has its own attempts and deadline; one that cannot be delivered is recorded as failed (shown on
the Alerts page) and never holds up the others, nor the evaluation loop.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import logging
import re
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from alerting import service
from alerting.api import server_config
from alerting.delivery import Delivery, deliver
from alerting.evaluator import evaluate
from alerting.notify import WebhookChannel, encode, idempotency_key
from alerting.rules import parse_rules
from alerting.state import Transition
from dashboard import queries
from eventide.config import Config, load_config, to_environ
from stack.services import free_port
from store.client import connect
from store.migrations import apply_migrations
from store.range_query import SeriesKey
from tests.support.fault_injection import WebhookReceiver, delivery_failures, store_transitions, webhook_faults
from tests.support.pipeline import wait_until
from tests.support.servers import answer_and_close, uvicorn_in_thread
from tests.support.stack import REPO, own_database
from tests.support.window_rows import Event, insert, window_row

# Deadlines, timeouts and time budgets measured on the wall clock: run alone (./run test), not beside other tests.
pytestmark = pytest.mark.serial

MINUTE = timedelta(minutes=1)
HEADER_VALUE = re.compile(r"^[0-9a-f]{64}$")
ALERTS_PAGE = str(REPO / "dashboard" / "views" / "alerts.py")


@pytest.fixture
def store(tmp_path: Any, store_url: str) -> Config:
    """A migrated database of its own on the session's store; short delivery timeouts so the tests are fast."""
    config = load_config(environ={}, root=str(tmp_path), store={"url": store_url,
                                                                "database": own_database("alertsec")},
                         alerting={"webhook_attempts": 3, "webhook_backoff_s": 0.1, "webhook_timeout_s": 0.5,
                                   "delivery_deadline_s": 1.5, "delivery_concurrency": 2,
                                   "evaluation_interval_s": 0.2})
    apply_migrations(config)
    return config


@pytest.fixture
def receiver() -> Any:
    with WebhookReceiver() as hook:
        yield hook


def webhook(config: Config, url: str) -> WebhookChannel:
    a = config.alerting
    return WebhookChannel(url, a.webhook_attempts, a.webhook_backoff_s, a.webhook_timeout_s, a.delivery_deadline_s)


def firing(series: str, minute: int = 0, value: float | None = 900.0, threshold: float = 500.0,
           rule: str = "p99") -> Transition:
    window_end = (int(time.time()) // 60 - 10 + minute) * 60_000
    return Transition(rule, series, "firing", window_end, value, threshold, "critical")


def delivered_keys(config: Config) -> dict[str, int]:
    with connect(config) as client:
        return dict(client.query("SELECT transition_key, attempts FROM alert_notifications FINAL "
                                 "WHERE channel = 'webhook'").result_rows)


def test_names_with_non_latin1_letters_and_line_breaks_are_delivered_with_a_valid_stable_header(store, receiver):
    """Given a series whose app has an é and whose name holds a newline and a CRLF, and a rule named with them too,
    when the evaluator fires and the webhook delivers, then the request is valid HTTP: the Idempotency-Key is 64
    hex characters (SHA-256 of the transition key), the same for the same transition, and the body carries the
    names as they are."""
    app, name = "caf\u00e9", "lat\nency\r\nms"
    series = SeriesKey(app, "metric", name)
    t0 = (datetime.now(UTC) - timedelta(hours=1)).replace(second=0, microsecond=0)
    insert(store, [window_row(store, series, t0 + m * MINUTE, MINUTE,
                              [Event(t0 + m * MINUTE + timedelta(seconds=1), 900.0)] * 10) for m in range(3)])
    rules = parse_rules(
        '[[rule]]\nname = "p99 caf\\u00e9\\r\\nX-Injected: 1"\n'
        'series = { app = "caf\\u00e9", kind = "metric", name = "lat\\nency\\r\\nms" }\n'
        'statistic = "p99"\ncomparator = ">"\nthreshold = 500\n')
    with connect(store) as client:
        mark = t0 + 3 * MINUTE
        client.insert("pipeline_progress", [["windows", "q", "r", 1, mark, mark, mark]],
                      column_names=["query_name", "query_id", "run_id", "batch_id", "batch_timestamp", "watermark",
                                    "recorded_at"])
    [moved] = evaluate(store, rules, now=int((t0 + 3 * MINUTE).timestamp() * 1000) + 5_000)
    assert moved.to == "firing" and "\r\n" in moved.key and "\u00e9" in moved.key

    assert deliver(store, [webhook(store, receiver.url)]) == {"webhook": 1}
    [got] = receiver.received
    assert HEADER_VALUE.match(got.headers["Idempotency-Key"])
    assert got.headers["Idempotency-Key"] == hashlib.sha256(moved.key.encode()).hexdigest() == idempotency_key(
        moved.key)
    assert "X-Injected" not in got.headers
    assert got.body is not None and got.body["key"] == moved.key and got.body["series"] == series.label
    assert got.body["rule"] == "p99 caf\u00e9\r\nX-Injected: 1"
    assert delivered_keys(store) == {moved.key: 1}


def test_non_finite_values_are_delivered_as_null_in_strict_json(store, receiver):
    """Given transitions whose value is inf or nan, or whose threshold is inf (a rule may say ``threshold = inf``),
    when they are delivered, then each body is strict JSON (the receiver rejects NaN/Infinity) with null there."""
    transitions = [firing("a", value=float("inf")), firing("b", value=float("nan")),
                   firing("c", threshold=float("inf")), firing("d", value=None)]
    store_transitions(store, transitions)
    assert deliver(store, [webhook(store, receiver.url)]) == {"webhook": 4}
    bodies = {r.body["series"]: r.body for r in receiver.received if r.body is not None}
    assert len(receiver.received) == 4 and len(bodies) == 4      # every body parsed as strict JSON
    assert [bodies[s]["value"] for s in "abcd"] == [None, None, 900.0, None]
    assert bodies["c"]["threshold"] is None and bodies["a"]["threshold"] == 500.0
    assert all(b"NaN" not in r.raw and b"Infinity" not in r.raw for r in receiver.received)
    with pytest.raises(ValueError, match="cannot be encoded"):
        encode({"series": "lone \ud800 surrogate"})


def test_a_notification_answered_400_is_recorded_as_failed_and_the_later_ones_are_delivered_at_once(
        store, tmp_path, monkeypatch):
    """Given a receiver that answers 400 to the notification of one series (the oldest), when the delivery
    threads run, then that one is tried once and recorded as failed (reason, attempts, status: on the Alerts page
    too), the later ones arrive within a second, and the refused one is never tried again."""
    with WebhookReceiver(lambda body: "400" if body["series"] == "refused" else "ok") as hook:
        store_transitions(store, [firing("refused", minute=0)] + [firing(f"later-{i}", minute=1) for i in range(3)])
        delivery = Delivery(store, [webhook(store, hook.url)], refresh_every_s=0.2)
        started = time.monotonic()
        delivery.start().wake()
        try:
            wait_until(lambda: len(hook.delivered()) == 3 and delivery_failures(store), timeout_s=10, interval_s=0.05)
            assert max(r.at for r in hook.delivered()) - started < 1.0
            time.sleep(0.6)                       # a few refreshes: the failed one stays given up
        finally:
            delivery.stop()
        assert len(hook.of("refused")) == 1
    [(reason, attempts, status, _)] = delivery_failures(store).values()
    assert (reason, attempts, status) == ("webhook answered 400 Bad Request", 1, 400)
    assert len(delivered_keys(store)) == 3

    with connect(store) as client:
        now = datetime.now(UTC)
        shown = queries.failed_deliveries(client, now - timedelta(minutes=5), now + timedelta(minutes=1))
    assert shown[["rule", "series", "channel", "reason", "attempts"]].values.tolist() == [
        ["p99", "refused", "webhook", "webhook answered 400 Bad Request", 1]]

    for key, value in to_environ(store).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("EVENTIDE_CONFIG", raising=False)
    (tmp_path / "alerts.toml").write_text("")
    at = AppTest.from_file(ALERTS_PAGE, default_timeout=30).run()
    assert not at.exception
    assert "Failed deliveries" in [s.value for s in at.subheader]
    [table] = [d.value for d in at.dataframe if "reason" in d.value.columns]
    assert list(table["reason"]) == ["webhook answered 400 Bad Request"] and list(table["series"]) == ["refused"]


def test_a_503_with_retry_after_is_retried_after_that_delay_without_holding_up_other_series(store):
    """Given a receiver that answers the first attempt of one notification 503 with ``Retry-After: 1``, then the
    later notifications of other series arrive before its second attempt, which waits the second it was asked to,
    and it is then delivered (2 attempts recorded)."""
    tries: dict[str, int] = {}

    def answer(body: dict[str, Any]) -> str:
        tries[body["series"]] = tries.get(body["series"], 0) + 1
        return "503:1" if body["series"] == "busy" and tries["busy"] == 1 else "ok"

    deadline = store.alerting.model_copy(update={"delivery_deadline_s": 5.0})
    config = store.model_copy(update={"alerting": deadline})
    with WebhookReceiver(answer) as hook:
        store_transitions(config, [firing("busy", minute=0)] + [firing(f"later-{i}", minute=1) for i in range(3)])
        assert deliver(config, [webhook(config, hook.url)]) == {"webhook": 4}
        first, second = hook.of("busy")
        assert second.at - first.at >= 0.95
        assert all(r.at < second.at for r in hook.received if r.body and r.body["series"] != "busy")
    assert sorted(delivered_keys(config).values()) == [1, 1, 1, 2]


def test_a_resolved_notification_is_not_sent_before_the_firing_of_its_series(store):
    """Given a firing notification answered 503 twice and the resolved one of the same series, then the receiver
    gets the firing first and the resolved after it (order kept per series), both delivered."""
    answers = iter(["503", "503"])

    def answer(body: dict[str, Any]) -> str:
        return next(answers, "ok") if body["status"] == "firing" else "ok"

    fired = firing("flapping", minute=0)
    resolved = Transition(fired.rule, fired.series, "resolved", fired.window_end_ms + 60_000, 10.0, 500.0,
                          "critical")
    with WebhookReceiver(answer) as hook:
        store_transitions(store, [fired, resolved])
        assert deliver(store, [webhook(store, hook.url)]) == {"webhook": 2}
        assert [r.body["status"] for r in hook.received if r.body] == ["firing", "firing", "firing", "resolved"]


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_receiver_that_refuses_hangs_or_resets_one_notification_delays_no_later_one_beyond_the_deadline(
        store, concurrency):
    """Given a receiver answering 400 to one notification, hanging on another and resetting the connection of a
    third (each the oldest of its series), then every later notification arrives within the deadline (+0.5 s),
    even with one attempt at a time; the hung one is given up after its attempts time out (by its deadline), the
    reset one after its attempts, the refused one at once."""
    outcome = webhook_faults(store, later=4, deadline_s=1.5, timeout_s=0.5, attempts=3, concurrency=concurrency)
    assert sorted(outcome.delivered_after_s) == [f"later-{i}" for i in range(4)]
    assert max(outcome.delivered_after_s.values()) <= outcome.deadline_s + 0.5, outcome.delivered_after_s
    refused, hung, reset = (outcome.failures[s] for s in ("refused", "hung", "reset"))
    assert refused[:3] == ("webhook answered 400 Bad Request", 1, 400)
    assert "timed out" in hung[0] and hung[2] is None and hung[3] <= outcome.deadline_s + 1.0
    assert hung[0].startswith(("gave up after", "deadline of 1.5 s reached"))
    assert reset[0].startswith(("gave up after", "deadline of 1.5 s reached")) and reset[2] is None
    assert any(word in reset[0] for word in ("Reset", "reset", "Disconnected")), reset[0]
    assert outcome.requests["refused"] == 1 and outcome.requests["reset"] == reset[1] >= 2


def test_evaluation_ticks_keep_their_interval_while_the_webhook_hangs(store, tmp_path):
    """Given the alerting service with a rule that fires at its first tick and a webhook that hangs on every
    request (each attempt times out after 0.5 s, 1.5 s per notification), then evaluation ticks keep starting
    every 0.2 s (no gap of 1 s, where delivery in the loop took at least 1.8 s), and the notification is
    recorded as failed once its deadline is reached."""
    rules = tmp_path / "alerts.toml"
    rules.write_text('[[rule]]\nname = "any dead letter"\nstatistic = "dead_letters"\ncomparator = ">="\n'
                     'threshold = 0\n')
    config = store.model_copy(update={"alerting": store.alerting.model_copy(update={"rules_file": rules})})
    ticks: list[float] = []
    stop = threading.Event()
    with WebhookReceiver(lambda _body: "hang") as hook:
        thread = threading.Thread(target=service.run, kwargs={
            "config": config, "stop": stop, "on_tick": lambda started, _s: ticks.append(started),
            "targets": [webhook(config, hook.url)]}, daemon=True)
        thread.start()
        try:
            wait_until(lambda: len(hook.received) >= 1, timeout_s=10, interval_s=0.05)
            first_request = hook.received[0].at
            wait_until(lambda: delivery_failures(config), timeout_s=10, interval_s=0.1)
            time.sleep(0.3)
        finally:
            stop.set()
            thread.join(10)
    assert not thread.is_alive()
    during = [t for t in ticks if t >= first_request - 0.2]
    gaps = [b - a for a, b in itertools.pairwise(during)]
    assert len(during) >= 6 and max(gaps) < 1.0, gaps
    [(reason, attempts, status, _)] = delivery_failures(config).values()
    assert "timed out" in reason and attempts >= 2 and status is None


def test_a_webhook_urls_secrets_appear_in_no_log_record_stored_failure_or_alerts_page(
        store, tmp_path, monkeypatch, caplog):
    """Given a webhook URL whose user info, path and query hold secrets (as Slack's and most receivers' do) and a
    receiver that cannot be reached, when the alerting service runs once (evaluation, then delivery until given
    up), then no log record, no row of ``alert_delivery_failures`` and nothing on the Alerts page holds any of
    them: the receiver is named by scheme and host. A reason stored by an older version, URL and all, is shown
    scrubbed too (issue 49, item 10)."""
    with socket.socket() as closed:           # a port nothing listens on: every attempt is refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    secrets = ("alertbot", "Pa55w0rdXYZ", "T0SECRETPATH", "tok3nSECRETQUERY")
    url = f"http://alertbot:Pa55w0rdXYZ@127.0.0.1:{port}/hooks/T0SECRETPATH?token=tok3nSECRETQUERY"
    rules = tmp_path / "alerts.toml"
    rules.write_text("")
    config = store.model_copy(update={"alerting": store.alerting.model_copy(
        update={"rules_file": rules, "webhook_url": url})})
    store_transitions(config, [firing("checkout")])
    old_reason = f"webhook {url}: ConnectionRefusedError [Errno 111] Connection refused"
    store_transitions(config, [firing("legacy", minute=1)])
    with connect(config) as client:             # as versions before this fix stored it
        client.insert("alert_delivery_failures", [[firing("legacy", minute=1).key, "webhook", "p99", "legacy",
                                                   "firing", datetime.now(UTC), old_reason, 3, None,
                                                   datetime.now(UTC)]],
                      column_names=["transition_key", "channel", "rule", "series", "to_state", "window_end",
                                    "reason", "attempts", "last_status", "failed_at"])

    caplog.set_level(logging.DEBUG)
    service.run(config, once=True, targets=[webhook(config, config.alerting.webhook_url)])

    logged = caplog.text
    with connect(config) as client:
        stored = repr(client.query("SELECT * FROM alert_delivery_failures FINAL WHERE series = 'checkout'")
                      .result_rows)
    for key, value in to_environ(config).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("EVENTIDE_CONFIG", raising=False)
    at = AppTest.from_file(ALERTS_PAGE, default_timeout=30).run()
    assert not at.exception
    [table] = [d.value for d in at.dataframe if "reason" in d.value.columns]
    assert set(table["series"]) == {"checkout", "legacy"}
    page = "\n".join([table.to_csv(), *(str(e.value) for kind in ("markdown", "caption", "info", "error", "warning")
                                        for e in getattr(at, kind))])
    for where, text in (("log records", logged), ("alert_delivery_failures", stored), ("Alerts page", page)):
        assert not [s for s in secrets if s in text], (where, text)
    # What they do say: where delivery failed, and how.
    assert f"webhook http://127.0.0.1:{port}: ConnectionRefusedError" in delivery_failures(config)["checkout"][0]
    assert f"via webhook given up: gave up after 3 attempts; last: webhook http://127.0.0.1:{port}: " in logged


def test_a_webhook_url_with_user_and_password_is_delivered_with_basic_credentials(store, receiver):
    """Given a webhook URL with ``user:password@`` (percent-encoded), then notifications reach the receiver with
    those as HTTP Basic credentials (urllib alone took them for part of the host name and never connected)."""
    store_transitions(store, [firing("basic")])
    url = receiver.url.replace("http://", "http://alert%20bot:p%40ss:w@")
    assert deliver(store, [webhook(store, url)]) == {"webhook": 1}
    [got] = receiver.received
    assert got.headers["Authorization"] == "Basic " + base64.b64encode(b"alert bot:p@ss:w").decode()
    assert got.body is not None and got.body["series"] == "basic"


# The silences API against slow and idle clients -------------------------------------------------------------

API_TOKEN = "silences-deadline-token-0123456789"


def test_the_silences_api_answers_408_to_late_headers_and_bodies_and_caps_its_connections(store: Config) -> None:
    # Given the API with a 1-s deadline and at most 4 connections,
    config = store.model_copy(update={"alerting": store.alerting.model_copy(update={
        "api_port": free_port(), "api_tokens": [API_TOKEN], "api_request_timeout_s": 1.0, "api_max_connections": 4})})
    address = ("127.0.0.1", config.alerting.api_port)
    with uvicorn_in_thread(server_config(config)):
        # a client that connects and sends nothing, and one that trickles its headers, each get 408 and are let go,
        with socket.create_connection(address) as silent:
            data, closed_after = answer_and_close(silent, timeout_s=5)
        assert data.startswith(b"HTTP/1.1 408") and b"alerting.api_request_timeout_s" in data, data
        assert 0.8 < closed_after < 2.0, closed_after
        with socket.create_connection(address) as trickling:
            trickling.sendall(b"GET /api/v2/silen")
            data, closed_after = answer_and_close(trickling, timeout_s=5)
        assert data.startswith(b"HTTP/1.1 408") and closed_after < 2.0, closed_after
        # a body that does not come within the deadline gets 408 too,
        with socket.create_connection(address) as slow_body:
            slow_body.sendall(f"POST /api/v2/silences HTTP/1.1\r\nHost: am\r\nAuthorization: Bearer {API_TOKEN}\r\n"
                              "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode())
            data, closed_after = answer_and_close(slow_body, timeout_s=5)
        assert data.startswith(b"HTTP/1.1 408") and b"the body did not arrive" in data, data
        assert closed_after < 2.5, closed_after
        # and connections past the cap are closed at once, while a request within it is answered.
        held = [socket.create_connection(address) for _ in range(4)]
        try:
            with socket.create_connection(address) as over:
                data, closed_after = answer_and_close(over, timeout_s=5)
            assert data == b"" and closed_after < 0.5, (data, closed_after)
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.2)
        with socket.create_connection(address) as sock:
            sock.sendall(f"GET /api/v2/silences HTTP/1.1\r\nHost: am\r\nAuthorization: Bearer {API_TOKEN}\r\n"
                         "Connection: close\r\n\r\n".encode())
            data, _ = answer_and_close(sock, timeout_s=5)
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"[]"), data
