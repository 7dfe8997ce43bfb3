"""A newcomer's first minutes: the whole demo as ``./run demo`` starts it (broker, store, job, demo load, alerting,
gateway, dashboard) on free ports and a new data directory, and every dashboard page walked in Chromium one minute
after the job's first batches and again six minutes after the demo started (once the first sessions have ended).

Each page must show data or say why not: no exception box, no chart empty without its reason, no 1970 date, no table
cell showing a missing value, no legend title over an entry (``tests.support.page_walk``)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext

from eventide.config import Config, load_config, to_environ
from stack import cli
from stack.services import free_port
from store.client import connect
from tests.support.browser import browser, opened
from tests.support.page_walk import problems
from tests.support.stack import REPO

__all__ = ["browser"]   # the shared Chromium fixture

PAGES = {"overview": "", "explorer": "explorer", "logs": "logs", "sessions": "sessions",
         "stragglers": "stragglers", "alerts": "alerts"}


def _stored_batches(config: Config) -> int:
    try:
        with connect(config) as client:
            return int(client.query("SELECT count() FROM pipeline_progress").result_rows[0][0])
    except Exception:   # the store or its tables not there yet
        return 0


@pytest.fixture(scope="module")
def demo() -> Iterator[tuple[Config, float]]:
    """The demo stack and when it was started (monotonic)."""
    data = Path(tempfile.mkdtemp(prefix="eventide-first-minutes-"))
    config = load_config(environ={}, root=str(REPO), paths={"data_dir": str(data), "cache_dir": str(REPO / ".cache")},
                         kafka={"port": free_port(), "controller_port": free_port()}, store={"port": free_port()},
                         dashboard={"port": free_port()}, gateway={"port": free_port()}, otlp={"port": free_port()},
                         alerting={"api_port": free_port(), "api_tokens": ["first-minutes-walk-token-0123456789"]})
    saved = dict(os.environ)
    os.environ.update(to_environ(config))     # the services the launcher starts read their configuration from it
    started = time.monotonic()
    try:
        cli.demo(config)
        yield config, started
    finally:
        cli.stack_down(config)
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(data, ignore_errors=True)


def _walk(browser: BrowserContext, config: Config) -> list[str]:
    base = cli.dashboard_url(config)
    # Refresh off: a page re-running every 2 s on a busy machine never looks settled; what it draws is the same.
    return [p for name, path in PAGES.items() for p in problems(browser, f"{base}/{path}?refresh=off", name)]


def test_every_page_shows_data_or_says_why_in_the_first_minute_and_after_six(
        browser: BrowserContext, demo: tuple[Config, float]) -> None:
    config, started = demo
    deadline = time.monotonic() + 300
    while _stored_batches(config) < 3:
        assert time.monotonic() < deadline, "the demo's job stored no batches within 5 min"
        time.sleep(2)
    time.sleep(60)
    first = _walk(browser, config)
    print("one minute in:", *first, sep="\n")
    # Sessions in progress: the store holds open sessions and the Sessions page counts them. (That the first batch with
    # events publishes them is tests/integration/test_sliding_and_sessions.py's: here the store's merges keep only
    # each session's newest version, so which batch published one first cannot be read back.)
    with connect(config) as client:
        [(open_sessions,)] = client.query("SELECT count() FROM open_sessions_now").result_rows
    assert open_sessions > 0
    with opened(browser, f"{cli.dashboard_url(config)}/sessions?refresh=off", settle_s=90) as page:
        metrics = dict([line.strip() for line in text.splitlines() if line.strip()][:2]
                       for text in page.locator('[data-testid="stMetric"]').all_inner_texts())
    assert int(metrics["open now"].replace(",", "")) > 0, metrics
    time.sleep(max(0.0, started + 6 * 60 - time.monotonic()))
    later = _walk(browser, config)
    assert not first and not later, "\n".join(["one minute in:", *first, "six minutes in:", *later])
