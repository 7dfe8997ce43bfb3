"""What the dashboard's browser tests share: a real ``streamlit run`` server over a store populated through the SQL
layer, and Debian's headless Chromium driven by the python ``playwright`` package (``playwright install`` cannot
download its own browser here; BRIEF §6). Screenshots go to ``test-artifacts/screenshots/<name>.png``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.error import URLError

import pytest
from playwright.sync_api import BrowserContext, Page, sync_playwright

from eventide.config import Config, to_environ
from stack.cli import STREAMLIT_OPTIONS
from stack.services import free_port, tail
from store.client import connect
from store.range_query import SeriesKey
from tests.support import dashboard_data as data
from tests.support.stack import REPO
from tests.support.window_rows import SECOND, Event, window_row

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
SCREENSHOTS = REPO / "test-artifacts" / "screenshots"
VIEWPORT = {"width": 1400, "height": 1000}
STATUS = '[data-testid="stStatusWidget"]'
# A chart counts as drawn once Plotly has put at least one trace into its SVG.
DRAWN_CHARTS = """() => [...document.querySelectorAll('[data-testid="stPlotlyChart"]')]
    .filter(c => c.querySelector('.js-plotly-plot .main-svg g.trace')).length"""


RULES = """
[[rule]]
name = "shop p99"
series = { app = "shop", kind = "metric", name = "latency_ms" }
window_s = 10
statistic = "p99"
comparator = ">"
threshold = 70
for = 2
severity = "warning"

[[rule]]
name = "dead letters"
window_s = 10
statistic = "dead_letters"
comparator = ">"
threshold = 10
"""


def populate(config: Config) -> datetime:
    """The last ten minutes of a small two-app deployment, in every table a page reads; returns when its last batch
    (of each of the job's queries) was stored, naive UTC."""
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    grid = now - timedelta(seconds=now.second % 10)      # windows start on the 10 s grid, as the job writes them
    windows = []
    for i in range(1, 61):
        start = grid - timedelta(seconds=10 * i)
        # shop's latency is the busiest series, so it is the one the explorer opens with.
        for app, events, base in (("shop", 30, 40.0), ("search", 20, 15.0)):
            metrics = [Event(start, base * (1 + (k * 7 + i) % 10 / 4), user=f"u{k % 9}", device=f"{app}-{k % 3}")
                       for k in range(events)]
            windows.append(window_row(config, SeriesKey(app, "metric", "latency_ms"), start, 10 * SECOND, metrics,
                                      version=1))
            levels = ["info"] * 6 + ["debug", "warning"] + ["error"] * (i % 3) + ["critical"] * (i % 7 == 0)
            logs = [Event(start, user=f"u{k}", level=level) for k, level in enumerate(levels)]
            windows.append(window_row(config, SeriesKey(app, "log", "app.server"), start, 10 * SECOND, logs,
                                      version=1))
    ago = [now - timedelta(seconds=s) for s in range(600)]
    stragglers = [data.straggler(ago[40 * k + 5], k, window_start=grid - timedelta(seconds=60 + 10 * k),
                                 window_kind=("tumbling", "hopping")[k % 2], lateness_s=2.0 + 3 * k)
                  for k in range(12)]
    corrections = [data.correction(ago[45 * k + 20], k, window_start=grid - timedelta(seconds=40 + 10 * k),
                                   window_kind=("tumbling", "hopping")[k % 2], late_events=1 + k % 3)
                   for k in range(10)]
    dead = [data.dead_letter(ago[30 * k + 3], k, reason=("unparseable JSON", "missing field: value")[k % 2])
            for k in range(8)]
    sessions = [data.session(ago[25 * k + 10], app, f"u{k}", duration_s=30.0 + 11 * k, events=3 + k)
                for k in range(12) for app in ("shop", "search")]
    slides = [data.sliding_window(ago[15 * k + 1], app, k, errors=k % 5)
              for k in range(30) for app in ("shop", "search")]
    clocks = [data.device_clock(app, f"{app}-{d}", b, (d - 4) * 1.5 + b * 0.2, ago[60 * (2 - b)])
              for app in ("shop", "search") for d in range(10) for b in range(2)]
    series = "shop · metric · latency_ms"
    states = [data.alert_state("shop p99", series, "firing", evaluated_until=grid, since=ago[240], value=92.0,
                               threshold=70, breaches=3),
              data.alert_state("dead letters", "pipeline", "ok", evaluated_until=grid, since=ago[500], value=1.0,
                               threshold=10)]
    transitions = [data.alert_transition("shop p99", series, state, ago[at], value=85.0, threshold=70)
                   for state, at in (("firing", 500), ("resolved", 400), ("pending", 300), ("firing", 240))]
    with connect(config) as client:
        data.insert_rows(client, "window_aggregates", windows)
        data.insert_rows(client, "stragglers", stragglers)
        data.insert_rows(client, "corrections", corrections)
        data.insert_rows(client, "dead_letters", dead)
        data.insert_rows(client, "pipeline_progress", [data.progress(now - timedelta(seconds=40), query_name=query,
                                                                     recorded_at=now)
                                                       for query in ("accept", "windows", "keyed_windows")])
        data.insert_rows(client, "sessions", sessions)
        data.insert_rows(client, "sliding_windows", slides)
        data.insert_rows(client, "device_clocks", clocks)
        data.insert_rows(client, "alert_states", states)
        data.insert_rows(client, "alert_transitions", transitions)
    return now


@contextmanager
def serving(root: Path, config: Config, rules_text: str = RULES) -> Iterator[str]:
    """Base URL of ``streamlit run dashboard/app.py`` on a free port over ``config``'s store (its log is
    ``root/streamlit.log``), with the alert rules ``rules_text``."""
    rules = root / "alerts.toml"
    rules.write_text(rules_text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTIDE_")}
    env.update(to_environ(config), EVENTIDE_ALERTING__RULES_FILE=str(rules))
    port, log = free_port(), root / "streamlit.log"
    argv = [sys.executable, "-m", "streamlit", "run", str(REPO / "dashboard" / "app.py"), *STREAMLIT_OPTIONS,
            "--server.port", str(port), "--server.address", "127.0.0.1"]
    with running_streamlit(argv, env, log, f"http://127.0.0.1:{port}") as url:
        yield url


@contextmanager
def running_streamlit(argv: list[str], env: dict[str, str], log: Path, url: str) -> Iterator[str]:
    """``argv`` (a Streamlit server, or a launcher that execs one) run from the repository, its output in ``log``;
    yields ``url`` once Streamlit answers its health check there, and stops the whole process group after."""
    with open(log, "wb") as out:
        # Its own process group, so that stopping a supervisor stops its Streamlit child too.
        server = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        _wait_healthy(url, server, log)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _wait_healthy(url: str, server: subprocess.Popen[bytes] | None, log: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server is not None and server.poll() is not None:
            pytest.fail(f"streamlit exited with {server.returncode}:\n{tail(log)}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (URLError, OSError):
            pass
        time.sleep(0.2)
    pytest.fail(f"streamlit at {url} not healthy after {timeout_s} s:\n{tail(log)}")


@pytest.fixture(scope="module")
def browser() -> Iterator[BrowserContext]:
    """One context of Debian's Chromium, headless, shared by the tests so Streamlit's JS bundle is fetched once.

    Missing Chromium is a failure, not a skip: CI has it, and a skipped browser test would let a broken frontend
    through silently."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} not found: install Debian's chromium package (apt-get install chromium); "
                    "`playwright install` cannot download its own browser on these machines")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        context = chromium.new_context(viewport=VIEWPORT)
        yield context
        context.close()
        chromium.close()


@contextmanager
def opened(browser: BrowserContext, url: str, settle_s: float = 30.0) -> Iterator[Page]:
    """A new page of ``browser`` at ``url``, settled (:func:`settle`, within ``settle_s``); closed when the block
    ends."""
    page = browser.new_page()
    try:
        page.goto(url)
        settle(page, settle_s)
        yield page
    finally:
        page.close()


def settle(page: Page, timeout_s: float = 30.0) -> None:
    """Wait until the script run is over and the DOM stopped changing.

    The status widget appears only while a script runs and only after a short delay, so "no status widget" alone
    can be true before the run has begun: the page counts as settled once its title is there, the widget is gone
    and the element and chart counts held still between two polls.
    """
    page.wait_for_selector("h1", timeout=timeout_s * 1000)
    deadline, last, steady = time.monotonic() + timeout_s, None, 0
    while steady < 2:
        if time.monotonic() > deadline:
            raise AssertionError(f"{page.url} did not settle within {timeout_s} s")
        page.wait_for_selector(STATUS, state="hidden", timeout=timeout_s * 1000)
        shape = page.evaluate(f"""() => [document.querySelectorAll('[data-testid]').length,
                                         ({DRAWN_CHARTS})()]""")
        steady = steady + 1 if shape == last else 0
        last = shape
        page.wait_for_timeout(300)


def screenshot(page: Page, name: str) -> Path:
    """A full-page PNG. Streamlit scrolls inside its main container, not the document, so the viewport is first
    grown to the content's height (otherwise only the first screen would be captured)."""
    height = page.evaluate("""() => Math.max(document.body.scrollHeight,
        ...[...document.querySelectorAll('[data-testid="stMain"], [data-testid="stAppViewContainer"]')]
            .map(e => e.scrollHeight))""")
    page.set_viewport_size({"width": VIEWPORT["width"], "height": max(VIEWPORT["height"], int(height))})
    page.wait_for_timeout(300)       # let Plotly re-layout to the new size
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def texts(page: Page, selector: str) -> list[str]:
    return [t.strip() for t in page.locator(selector).all_inner_texts()]
