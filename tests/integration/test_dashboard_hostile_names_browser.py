"""Names from the store drawn as text, never as links or images, in a real headless Chromium against
``streamlit run`` (issue 49, item 11 and its audit).

An app name is whatever an ingest token's holder sends; rule names come from the rules file. The pages show them in
Markdown (the Alerts page's link to the error lines), in Plotly titles, legends, axis labels and hover labels
(Plotly reads ``<a href>`` there), in select boxes and in tables. Here one app is named with a Markdown link, a
Markdown image, a bare URL and an HTML link at once; every page that shows it must hold no link to and no image
from that host, and show the name as it is."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest
from playwright.sync_api import BrowserContext

from eventide.config import Config, load_config
from store.client import connect
from store.migrations import apply_migrations
from store.range_query import SeriesKey
from tests.integration.test_log_search import log_line
from tests.support import dashboard_data as data
from tests.support.browser import RULES, browser, opened, populate, screenshot, serving, texts
from tests.support.stack import own_database
from tests.support.window_rows import SECOND, Event, window_row

pytestmark = pytest.mark.integration
__all__ = ["browser"]   # the shared Chromium fixture

EVIL = "http://evil.example"
APP = f'[md]({EVIL}/app-md) ![]({EVIL}/app-img.png) <a href="{EVIL}/app-html">x</a> {EVIL}/app-bare'
SERIES = SeriesKey(APP, "log", "app.server")
RULE = f'{APP} errors'
ERROR_RULE = f"""
[[rule]]
name = '{RULE}'
series = {{ app = '{APP}', kind = "log", name = "app.server" }}
window_s = 10
statistic = "error_ratio"
comparator = ">"
threshold = 0.05
for = 2
severity = "critical"
"""
# Every link (HTML or SVG, as Plotly draws them) and every image or style that would reach the attacker's host.
EVIL_ELEMENTS = r"""() => [...document.querySelectorAll('a, img, image, source, [style]')]
    .flatMap(e => [e.getAttribute('href'), e.getAttributeNS('http://www.w3.org/1999/xlink', 'href'),
                   e.getAttribute('src'), e.getAttribute('srcset'), e.getAttribute('style')])
    .filter(v => v && /(^|url\(["']?)\s*(https?:)?\/\/evil\.example/.test(v))"""
PLOTLY_TEXT = """() => [...document.querySelectorAll(
    '.js-plotly-plot .legendtext, .js-plotly-plot .gtitle, .js-plotly-plot .ytick text')].map(e => e.textContent)"""


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory, store_url: str) -> Iterator[str]:
    """A small deployment (``populate``) plus the app with the hostile name, in every table a page reads."""
    root = tmp_path_factory.mktemp("hostile-names")
    config: Config = load_config(environ={}, root=str(root),
                                 store={"url": store_url, "database": own_database("hostile")},
                                 dashboard={"refresh_s": 3600})
    apply_migrations(config)
    populate(config)
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    grid = now - timedelta(seconds=now.second % 10)
    windows = [window_row(config, SERIES, grid - timedelta(seconds=10 * i), 10 * SECOND,
                          [Event(grid - timedelta(seconds=10 * i), user="u1", device="d1", level=level)
                           for level in ("info", "error", "error")], version=1) for i in range(1, 31)]
    windows += [window_row(config, SeriesKey(APP, "metric", "latency_ms"), grid - timedelta(seconds=10 * i),
                           10 * SECOND, [Event(grid - timedelta(seconds=10 * i), 5000.0, user="u1", device="d1")],
                           version=1) for i in range(1, 31)]
    with connect(config) as client:
        data.insert_rows(client, "window_aggregates", windows)
        data.insert_rows(client, "logs", [log_line(grid - timedelta(seconds=30), "payment failed", app=APP,
                                                   level="error", device=APP, tags={APP: APP})])
        data.insert_rows(client, "sessions", [data.session(now - timedelta(seconds=60 + k), APP, f"u{k}",
                                                           duration_s=40.0, events=4) for k in range(3)])
        data.insert_rows(client, "device_clocks", [data.device_clock(APP, APP, 1, 900.0, now - timedelta(seconds=30))])
        data.insert_rows(client, "alert_states", [data.alert_state(
            RULE, SERIES.label, "firing", evaluated_until=grid, since=grid - timedelta(seconds=60), value=0.6,
            threshold=0.05, severity="critical", breaches=2)])
        data.insert_rows(client, "alert_transitions", [data.alert_transition(
            RULE, SERIES.label, "firing", grid - timedelta(seconds=60), value=0.6, threshold=0.05)])
    with serving(root, config, RULES + ERROR_RULE) as url:
        yield url


PAGES = {
    "overview": "",
    "explorer": "explorer?" + urlencode({"series": f"{APP}|metric|latency_ms|"}),
    "logs": "logs?" + urlencode({"minutes": 30, "app": APP}),
    "sessions": "sessions",
    "stragglers": "stragglers",
    "alerts": "alerts",
}


@pytest.mark.parametrize("name", list(PAGES))
def test_a_hostile_app_name_is_drawn_as_text_on_every_page(browser: BrowserContext, dashboard: str, name: str):
    with opened(browser, f"{dashboard}/{PAGES[name]}") as page:
        shot = screenshot(page, f"hostile-name-{name}")
        assert texts(page, '[data-testid="stException"]') == [], shot
        assert page.evaluate(EVIL_ELEMENTS) == [], shot
        shown = page.inner_text("body") + "\n".join(page.evaluate(PLOTLY_TEXT))
        assert APP in shown, (name, shot)            # the name itself, as it is
        if name == "alerts":
            link = page.get_by_role("link", name="Error lines of")
            assert APP in link.inner_text() and RULE in link.inner_text(), shot
            assert (link.get_attribute("href") or "").startswith("logs?app="), shot   # our own link
