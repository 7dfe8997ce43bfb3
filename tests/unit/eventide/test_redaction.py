"""Configured URLs shown without their secrets (issue 49, item 10), and text from a URL or the store shown verbatim
in Markdown (item 11): :mod:`eventide.redaction` and ``dashboard.common.literal``."""

from __future__ import annotations

import socket

import pytest

from alerting.notify import WebhookChannel
from dashboard.common import literal
from eventide.redaction import HIDDEN, scrub_url, url_origin

HOOK = "https://bot:pa55word@hooks.example.com:8443/services/T0/B0/SECRETPATH?token=SECRETQUERY#SECRETFRAG"
SECRETS = ("bot", "pa55word", "SECRETPATH", "SECRETQUERY", "SECRETFRAG")


@pytest.mark.parametrize(("url", "shown"), [
    (HOOK, "https://hooks.example.com:8443"),
    ("http://default:hunter2@127.0.0.1:8123", "http://127.0.0.1:8123"),
    ("https://clickhouse.internal/?user=x&password=y", "https://clickhouse.internal"),
    ("http://[::1]:9000/path", "http://[::1]:9000"),
    ("HTTP://Example.COM/x", "http://example.com"),
    ("http://host:99999/secret", "(unreadable URL)"),
    ("not a url with a secret", "(unreadable URL)"),
    ("", "(no URL)"),
])
def test_a_url_is_shown_as_its_scheme_and_host_only(url: str, shown: str):
    assert url_origin(url) == shown


@pytest.mark.parametrize("message", [
    f"webhook {HOOK}: ConnectionRefusedError [Errno 111] Connection refused",
    "cannot reach ClickHouse at https://bot:***@hooks.example.com:8443/services/T0/B0/SECRETPATH: timed out",
    f"<urlopen error unknown url type: '{HOOK}'>",
    "InvalidURL: nonnumeric port in /services/T0/B0/SECRETPATH?token=SECRETQUERY",
    "a decoded query: token=SECRETQUERY, a fragment SECRETFRAG, a password pa55word",
])
def test_a_message_quoting_the_url_in_any_form_keeps_none_of_its_secrets(message: str):
    scrubbed = scrub_url(message, HOOK)
    assert not [s for s in SECRETS if s in scrubbed], scrubbed
    assert "hooks.example.com" in scrubbed or HIDDEN in scrubbed


def test_scrubbing_leaves_other_urls_and_short_parts_alone():
    assert scrub_url("see http://other.example/docs/a then / and /a", "http://h.example/a?b") == \
        "see http://other.example/docs/a then / and /a"


def test_a_webhook_that_cannot_be_reached_names_its_host_but_not_its_secret():
    with socket.socket() as closed:         # a port that nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    channel = WebhookChannel(f"http://u:pa55word@127.0.0.1:{port}/hook/SECRETPATH?token=SECRETQUERY", 1, 0.1, 1.0)
    outcome = channel.attempt({"key": "k"}, b"{}", 1.0)
    assert not outcome.delivered and f"webhook http://127.0.0.1:{port}: " in outcome.error, outcome
    assert not [s for s in SECRETS if s in outcome.error + repr(channel)], outcome.error


@pytest.mark.parametrize("text", [
    "[x](http://evil.example)", "![](http://evil.example/img.png)", "<img src=x onerror=alert(1)>",
    "`code` and ``more``", "**bold** $x^2$ :red[colour] http://bare.example", "line\n\n# heading\r\nnext",
])
def test_literal_text_is_one_code_span_holding_the_text(text: str):
    shown = literal(text)
    fence = shown.split(" ", 1)[0]
    assert set(fence) == {"`"} and shown.endswith(f" {fence}")
    inner = shown[len(fence) + 1:-len(fence) - 1]
    assert inner == " ".join(text.splitlines())         # no line break: the span cannot be split into blocks
    assert fence not in inner and "`" * (len(fence) + 1) not in inner


def test_an_unreachable_store_is_named_by_scheme_and_host_without_its_credentials(monkeypatch, tmp_path):
    """Given ``store.url`` with ``user:password@`` and nothing listening there, then the dashboard's error names
    the store as ``http://host:port`` only (issue 49, item 10)."""
    from streamlit.testing.v1 import AppTest

    from eventide.config import load_config, to_environ
    from tests.support.stack import REPO

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    config = load_config(environ={}, root=str(tmp_path), store={"url": f"http://admin:S3CRETPW@127.0.0.1:{port}/"})
    for key, value in to_environ(config).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("EVENTIDE_CONFIG", raising=False)
    at = AppTest.from_file(str(REPO / "dashboard" / "views" / "overview.py"), default_timeout=30).run()
    shown = [str(e.value) for kind in ("error", "caption", "info", "markdown") for e in getattr(at, kind)]
    assert any(f"Store unreachable at http://127.0.0.1:{port}" in t for t in shown), shown
    assert not [t for t in shown if "S3CRETPW" in t or "admin" in t], shown


def test_names_in_charts_are_escaped_for_plotly_and_a_click_gives_the_stored_name_back():
    """Plotly reads ``<a href>`` in legends and titles: a stored name is drawn escaped (shown as typed), and the
    trace name a chart click reports (``drill_chart``) is the stored name again."""
    import html
    from datetime import UTC, datetime

    import pandas as pd

    from dashboard.common import plot_text, time_chart

    names = ['<a href="http://evil.example">x</a>', "a & b", "&lt;already&gt;", "plain"]
    now = datetime.now(UTC)
    df = pd.DataFrame({"t": [now] * len(names), "n": [1] * len(names), "app": names})
    fig = time_chart(df, "n", "title", "lines", (now, now), "app")
    drawn = [str(trace.name) for trace in fig.data]
    assert "<" not in "".join(drawn) and drawn == [plot_text(n) for n in names]
    assert [html.unescape(n) for n in drawn] == names
