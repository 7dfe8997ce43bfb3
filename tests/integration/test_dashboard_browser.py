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

import pytest
from playwright.sync_api import BrowserContext

from eventide.config import load_config
from store.migrations import apply_migrations
from tests.support.browser import DRAWN_CHARTS, browser, populate, screenshot, serving, settle, texts
from tests.support.stack import own_database

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


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory, store_url: str) -> Iterator[str]:
    """The dashboard over a freshly populated store."""
    root = tmp_path_factory.mktemp("dashboard-browser")
    # Charts must not re-run under the browser mid-assertion: one refresh an hour is "never" for this test.
    config = load_config(environ={}, root=str(root), store={"url": store_url, "database": own_database("browser")},
                         dashboard={"refresh_s": 3600})
    apply_migrations(config)
    populate(config)
    with serving(root, config) as url:
        yield url


@pytest.mark.parametrize("path", list(PAGES))
def test_page_renders_its_charts_in_chromium(browser: BrowserContext, dashboard: str, path: str) -> None:
    spec = PAGES[path]
    page = browser.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda exc: page_errors.append(str(exc)))
    try:
        page.goto(f"{dashboard}/{'' if spec.root else path}" + (f"?minutes={spec.minutes}" if spec.minutes else ""))
        settle(page)
        shot = screenshot(page, path)      # before asserting, so a failure leaves its picture behind
        if spec.minutes:     # a shared link keeps its time range: in the URL and on the slider
            assert f"minutes={spec.minutes}" in page.url, page.url
            assert texts(page, '[data-testid="stSliderThumbValue"]') == [str(spec.minutes)], shot
        assert texts(page, "h1") [:1] == [spec.title], f"{path} routed to the wrong page ({shot})"
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
