"""Every dashboard page in a real headless Chromium against a running ``streamlit run`` server.

AppTest (test_dashboard.py) runs page scripts without a browser; this test serves the app as users get it and
drives Debian's ``/usr/bin/chromium`` with the python ``playwright`` package (``playwright install`` cannot download
its own browser here; BRIEF §6), so it also catches what only the frontend shows: a page that does not route, a
Plotly figure the browser cannot draw, an exception rendered in place of a chart. A chDB store is populated through
the SQL layer with data for every page first. Screenshots go to ``test-artifacts/screenshots/<page>.png``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import BrowserContext, Page

from analytics.progress import record_round
from eventide.config import Config, load_config
from store.client import connect
from store.migrations import apply_migrations
from store.pipeline import PROVISIONAL_WINDOWS
from store.range_query import SeriesKey
from tests.support.browser import DRAWN_CHARTS, browser, populate, screenshot, serving, settle, texts
from tests.support.stack import own_database
from tests.support.window_rows import SECOND, Event, insert, window_row

__all__ = ["browser"]   # the shared Chromium fixture


@dataclass(frozen=True)
class PageSpec:
    title: str
    charts: int
    """Charts the fixture data gives the page (at least; a page may gain more)."""
    minutes: int | None = None
    """Open the page as a shared link with ``?minutes=`` (which must survive the load) instead of the default."""
    root: bool = False
    """The default page: served at the app's root URL (its own path would show "Page not found" first)."""


PAGES = {
    "overview": PageSpec("Overview", 4, root=True),
    "explorer": PageSpec("Metric explorer", 3),
    "logs": PageSpec("Logs", 3),
    "sessions": PageSpec("Sessions", 3),
    "stragglers": PageSpec("Stragglers & clocks", 5),
    "alerts": PageSpec("Alerts", 1, minutes=90),
}


@dataclass(frozen=True)
class Served:
    url: str
    batch_stored: datetime
    """When the populated store's last batch was stored (naive UTC): what every page's freshness line shows."""
    config: Config


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory, store_url: str) -> Iterator[Served]:
    """The dashboard over a freshly populated store."""
    root = tmp_path_factory.mktemp("dashboard-browser")
    # Charts must not re-run under the browser mid-assertion: one refresh an hour is "never" for this test. And a
    # job with an hourly trigger, so the one stored batch reads fresh, not stale, however long the test takes.
    config = load_config(environ={}, root=str(root), store={"url": store_url, "database": own_database("browser")},
                         dashboard={"refresh_s": 3600}, stream={"trigger_interval_s": 3600})
    apply_migrations(config)
    stored = populate(config)
    with serving(root, config) as url:
        yield Served(url, stored, config)


def freshness_lines(page: Page) -> list[str]:
    return [t for t in texts(page, '[data-testid="stCaptionContainer"]') if t.startswith("data as of")]


@pytest.mark.parametrize("path", list(PAGES))
def test_page_renders_its_charts_in_chromium(browser: BrowserContext, dashboard: Served, path: str) -> None:
    spec = PAGES[path]
    page = browser.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda exc: page_errors.append(str(exc)))
    try:
        page.goto(f"{dashboard.url}/{'' if spec.root else path}"
                  + (f"?minutes={spec.minutes}" if spec.minutes else ""))
        settle(page)
        shot = screenshot(page, path)      # before asserting, so a failure leaves its picture behind
        if spec.minutes:     # a shared link keeps its time range: in the URL and on the slider
            assert f"minutes={spec.minutes}" in page.url, page.url
            assert texts(page, '[data-testid="stSliderThumbValue"]') == [str(spec.minutes)], shot
        assert texts(page, "h1") [:1] == [spec.title], f"{path} routed to the wrong page ({shot})"
        [line] = freshness_lines(page)       # how current the page's data is, under its title
        assert line.startswith(f"data as of {dashboard.batch_stored:%H:%M:%S} UTC · "), (line, shot)
        assert line.endswith(" behind · refreshes every 3600 s"), (line, shot)
        assert page.get_by_text("Page not found").count() == 0, f"{path} is not where the app serves it ({shot})"
        # The app's own navigation (st.navigation titles), not Streamlit's automatic listing of a pages/ folder.
        assert texts(page, '[data-testid="stSidebarNavLink"]') == [p.title for p in PAGES.values()], shot
        assert texts(page, '[data-testid="stException"]') == [], f"exception on {path} ({shot})"
        assert texts(page, '[data-testid="stAlertContentError"]') == [], f"error on {path} ({shot})"
        assert texts(page, '[data-testid="stAlertContentWarning"]') == [], f"warning on {path} ({shot})"
        assert page_errors == [], f"JavaScript errors on {path} ({shot})"
        assert page.locator('[data-testid="stAppDeployButton"]').count() == 0, f"Deploy button shown ({shot})"
        drawn = page.evaluate(DRAWN_CHARTS)
        infos = texts(page, '[data-testid="stAlertContentInfo"]')
        assert drawn >= spec.charts, f"{path}: {drawn} charts drawn, want ≥ {spec.charts}; notes: {infos} ({shot})"
    finally:
        page.close()


def test_the_charts_refresh_in_place_at_the_interval_a_link_picks(browser: BrowserContext, dashboard: Served) -> None:
    """The server's config refreshes hourly; ``?refresh=1`` sets the sidebar's "Refresh every" to 1 s, and the
    page's fragment then re-runs every second on its own: its freshness line moves on ("N s behind" grows) while
    the reader's scroll position stays where it was."""
    page = browser.new_page()
    try:
        page.goto(f"{dashboard.url}/stragglers?refresh=1")
        # Not settle(): a page that re-runs a part every second never holds still for it.
        page.locator('[data-testid="stCaptionContainer"]', has_text="data as of").wait_for(timeout=30_000)
        page.wait_for_function(f"() => ({DRAWN_CHARTS})() >= {PAGES['stragglers'].charts}", timeout=30_000)
        # No screenshot: it grows the viewport to the whole page, which then no longer scrolls.
        assert "refresh=1" in page.url, page.url
        [first] = freshness_lines(page)
        assert first.endswith(" behind · refreshes every 1 s"), first
        scroller = """() => [...document.querySelectorAll('[data-testid="stMain"], [data-testid="stAppViewContainer"]')]
                               .find(e => e.scrollHeight > e.clientHeight)"""
        scrolled = page.evaluate(f"() => {{ const e = ({scroller})(); e.scrollTop = 300; return e.scrollTop; }}")
        assert scrolled > 0, "the page is too short to scroll"
        page.wait_for_function("""first => [...document.querySelectorAll('[data-testid="stCaptionContainer"]')]
                                  .some(e => e.innerText.startsWith("data as of") && e.innerText.trim() !== first)""",
                               arg=first, timeout=10_000)
        [later] = freshness_lines(page)
        behind = [int(line.split(" · ")[1].removesuffix(" s behind")) for line in (first, later)]
        assert behind[1] > behind[0], (first, later)
        assert page.evaluate(f"() => ({scroller})().scrollTop") == scrolled, "a refresh lost the scroll position"
    finally:
        page.close()


def test_the_overview_shows_a_provisional_row_once_its_round_is_recorded_not_at_the_next_windows_batch(
        browser: BrowserContext, dashboard: Served) -> None:
    """Between two batches of the ``windows`` query, ``accept``'s provisional rows move the tumbling windows and
    record each round (``provisional_windows``). The Overview, refreshing every second, reads again after a round;
    a row written without one waits, since the ``windows`` query's batch has not moved and is fresh."""
    app = "between-batches"
    page = browser.new_page()
    try:
        page.goto(f"{dashboard.url}/?refresh=1")
        page.locator('[data-testid="stCaptionContainer"]', has_text="data as of").wait_for(timeout=30_000)
        page.wait_for_function(f"() => ({DRAWN_CHARTS})() >= {PAGES['overview'].charts}", timeout=30_000)
        legend = page.locator("text.legendtext", has_text=app)
        # Given a tumbling row of a new app, written between two batches with no round recorded,
        now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
        start = now - timedelta(seconds=10 + now.second % 10)
        insert(dashboard.config, [window_row(dashboard.config, SeriesKey(app, "metric", "latency_ms"), start,
                                             10 * SECOND, [Event(start, 12.0)], version=2)])
        # then three refreshes later the page still shows its last read,
        page.wait_for_timeout(3_000)
        assert legend.count() == 0
        # and once the round is recorded, the next refresh reads the row and draws the app.
        with connect(dashboard.config) as client:
            record_round(client, PROVISIONAL_WINDOWS, datetime.now(UTC))
        legend.first.wait_for(timeout=10_000)
    finally:
        page.close()
