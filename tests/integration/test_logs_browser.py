"""Finding a log line, in a real headless Chromium against ``streamlit run`` (as test_dashboard_browser.py):
a search typed on the Logs page lists exactly the matching lines, and the drill-downs (a firing ``error_ratio``
alert's link on the Alerts page, a click on the Overview's error chart) open the Logs page with that app, level and
window applied. The store is populated through the SQL layer: the dashboard fixture's windows and alerts, and lines
in ``logs``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlencode, urlparse

import pytest
from playwright.sync_api import BrowserContext, Page

from dashboard import log_search
from eventide.config import Config, load_config
from store.client import connect
from store.migrations import apply_migrations
from tests.integration.test_log_search import log_line
from tests.support import dashboard_data as data
from tests.support.browser import RULES, browser, opened, populate, screenshot, serving, settle, texts
from tests.support.stack import own_database

pytestmark = pytest.mark.integration
__all__ = ["browser"]   # the shared Chromium fixture

ERROR_RULE = """
[[rule]]
name = "shop errors"
series = { app = "shop", kind = "log", name = "app.server" }
window_s = 10
statistic = "error_ratio"
comparator = ">"
threshold = 0.05
for = 2
severity = "critical"
"""
SEARCH_RULE = """
[[rule]]
name = "shop declines"
logs = { app = "shop", text = '"payment declined"', levels = ["error"] }
window_s = 10
statistic = "count"
comparator = ">"
threshold = 0
for = 2
severity = "critical"
"""
DECLINES = 'shop · log · lines "payment declined" level=error'
NOW = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
GRID = NOW - timedelta(seconds=NOW.second % 10)
FIRED = GRID - timedelta(seconds=60)
"""The alert fired at the end of this window, after two breaching 10 s windows: its lines start 20 s earlier."""
ALERT_WINDOW = (FIRED - timedelta(seconds=20), GRID)


def lines() -> list[dict]:
    """Log lines around the alert; those the alert's link must list are named "in alert window"."""
    at = ALERT_WINDOW[0]
    return [
        log_line(at + timedelta(seconds=5), "payment gateway timeout after 30 s (in alert window 1)", level="error",
                 tags={"region": "eu"}),
        log_line(at + timedelta(seconds=50), "payment gateway Timeout after 12 s (in alert window 2)",
                 level="critical", tags={"region": "us"}),
        log_line(at + timedelta(seconds=51), "checkout ok for cart 7", level="info"),
        log_line(at + timedelta(seconds=52), "search shard timeout", app="search", level="error"),
        log_line(at + timedelta(seconds=53), "db pool timeout", level="error", name="app.db"),
        log_line(at - timedelta(seconds=30), "payment gateway timeout before the alert", level="error",
                 event_id="ev-late"),
        log_line(at + timedelta(seconds=55), "gateway said: payment timeout", level="warning"),
        # The rule on log lines counts the first three, which its link must list; not the others.
        log_line(at + timedelta(seconds=6), "payment declined for order o-1 (declined 1)", level="error"),
        log_line(at + timedelta(seconds=16), "Payment declined for order o-2 (declined 2)", level="error"),
        log_line(at + timedelta(seconds=19), "payment: declined for order o-3 (declined 3)", level="error"),
        log_line(at + timedelta(seconds=17), "payment declined for order o-4, retried", level="warning"),
        log_line(at + timedelta(seconds=18), "payment was declined for order o-5", level="error"),
        log_line(at + timedelta(seconds=18), "payment declined for order o-6", app="search", level="error"),
        log_line(at - timedelta(seconds=1), "payment declined for order o-7 before", level="error"),
    ]


@pytest.fixture(scope="module")
def logs_store(tmp_path_factory: pytest.TempPathFactory, store_url: str) -> Config:
    root = tmp_path_factory.mktemp("logs-browser")
    return load_config(environ={}, root=str(root), store={"url": store_url, "database": own_database("logs_browser")},
                       dashboard={"refresh_s": 3600})


@pytest.fixture(scope="module")
def dashboard(logs_store: Config) -> Iterator[str]:
    config, root = logs_store, logs_store.root
    apply_migrations(config)
    populate(config)
    with connect(config) as client:
        rows = lines()
        data.insert_rows(client, "logs", rows)
        late = next(line for line in rows if line["event_id"] == "ev-late")
        # Its event was dropped from a closed window: the line is marked late.
        data.insert_rows(client, "stragglers", [{
            **data.straggler(NOW, 1, window_start=late["corrected_event_time"] - timedelta(seconds=5), app="shop",
                             kind="log", name="app.server"),
            "event_id": "ev-late", "corrected_event_time": late["corrected_event_time"]}])
        raw = '{"v":1,"kind":"log","app":"shop","device":"d1","name":"app.server","level":"fatal","message":"x"}'
        data.insert_rows(client, "dead_letters", [{
            **data.dead_letter(NOW - timedelta(minutes=2), 1000, reason="level: not one of debug, info, warning, "
                                                                         "error, critical"),
            "raw": raw, "raw_bytes": len(raw)}])
        data.insert_rows(client, "alert_states", [data.alert_state(
            "shop errors", "shop · log · app.server", "firing", evaluated_until=GRID, since=FIRED, value=0.3,
            threshold=0.05, severity="critical", breaches=2), data.alert_state(
            "shop declines", DECLINES, "firing", evaluated_until=GRID, since=FIRED, value=2.0, threshold=0.0,
            severity="critical", breaches=2)])
    with serving(root, config, RULES + ERROR_RULE + SEARCH_RULE) as url:
        yield url


def grid_texts(page: Page) -> list[str]:
    """The cells of the page's data grids (Streamlit draws them on a canvas; its accessible table holds the
    text)."""
    return texts(page, '[data-testid="stDataFrame"] [role="gridcell"]')


def drawn_grid_texts(page: Page, timeout_ms: int = 15_000) -> list[str]:
    """:func:`grid_texts` once a grid has drawn its first cell: a settled page may not have mounted its grid's
    accessible table yet (a CI run read none while the screenshot after it showed the row)."""
    page.wait_for_function("""() => document.querySelectorAll('[data-testid="stDataFrame"] [role="gridcell"]')
                              .length > 0""", timeout=timeout_ms)
    return grid_texts(page)


def shown_messages(page: Page) -> list[str]:
    return [t for t in grid_texts(page) if re.search(r"timeout|ok for cart", t, re.IGNORECASE)]


def chosen(page: Page, label: str) -> list[str]:
    """The values chosen in the multiselect labelled ``label``."""
    name = page.locator('[data-testid="stWidgetLabel"]', has_text=re.compile(f"^{re.escape(label)}$"))
    box = page.locator('[data-testid="stMultiSelect"]', has=name)
    return [t.strip() for t in box.locator(".react-aria-ComboBox [data-tag] span[title]").all_inner_texts()]


def test_a_typed_search_lists_exactly_the_matching_lines_newest_first(browser: BrowserContext, dashboard: str):
    with opened(browser, f"{dashboard}/logs?minutes=30") as page:
        box = page.get_by_role("textbox", name='Words and "phrases"')
        box.fill('"payment gateway" timeout')
        box.press("Enter")
        settle(page)
        shot = screenshot(page, "logs-search")
        assert shown_messages(page) == ["payment gateway Timeout after 12 s (in alert window 2)",
                                        "payment gateway timeout after 30 s (in alert window 1)",
                                        "payment gateway timeout before the alert"], shot
        assert grid_texts(page).count("late") == 1, shot          # the last line's event was a dropped straggler
        assert parse_qs(urlparse(page.url).query)["q"] == ['"payment gateway" timeout']   # the link keeps it
        assert texts(page, '[data-testid="stException"]') == [], shot


def test_a_followed_search_lists_a_new_line_by_itself_and_an_unfollowed_one_stays_put(
        browser: BrowserContext, dashboard: str, logs_store: Config):
    # Given two searches for words no stored line has yet, one followed (refreshing every second), one not,
    followed = f"{dashboard}/logs?minutes=30&refresh=1&follow=1&q=arrivedwhilewatching"
    still = f"{dashboard}/logs?minutes=30&refresh=1&q=arrivedwhilereading"
    page, unfollowed = browser.new_page(), browser.new_page()
    try:
        for tab, url in ((page, followed), (unfollowed, still)):
            # Not settle(): a page that re-runs a part every second never holds still for it.
            tab.goto(url)
            tab.get_by_text("No line matches in this range").wait_for(timeout=30_000)
        # when a line with each word is stored while both pages are open and untouched,
        now = datetime.now(UTC).replace(tzinfo=None)
        with connect(logs_store) as client:
            data.insert_rows(client, "logs", [log_line(now, "payment arrivedwhilewatching"),
                                              log_line(now, "payment arrivedwhilereading")])
        # then the followed search lists its line within a few refreshes, in place (the URL keeps following),
        page.get_by_text("lines match · newest").wait_for(timeout=15_000)
        shot = page.url   # no screenshot: it grows the viewport, and the page keeps re-running
        # The grid draws (and mounts its accessible cells) on animation frames, which a tab behind another may not
        # get while the machine is busy: the followed tab is brought to the front, as a user watching it has it.
        page.bring_to_front()
        # The grid's accessible cells exist only for rows in view. Scrolled from the page's own script on every
        # poll: Playwright's scroll waits for the element to hold still, which a page re-running each second
        # may never do within its timeout.
        page.wait_for_function("""() => {
            const grid = document.querySelector('[data-testid="stDataFrame"]');
            if (!grid) return false;
            grid.scrollIntoView({block: "nearest"});
            return [...grid.querySelectorAll('[role="gridcell"]')]
                .some(c => c.innerText.includes("payment arrivedwhilewatching"));
        }""", timeout=30_000)
        assert parse_qs(urlparse(page.url).query)["follow"] == ["1"], shot
        # and the unfollowed one, refreshed as often, keeps the lines of its search until asked.
        unfollowed.wait_for_timeout(4_000)
        assert unfollowed.get_by_text("No line matches in this range").count() == 1, unfollowed.url
        unfollowed.get_by_role("button", name="Refresh lines").click()
        unfollowed.get_by_text("lines match · newest").wait_for(timeout=15_000)
        assert texts(page, '[data-testid="stException"]') == [], shot
    finally:
        page.close()
        unfollowed.close()


def test_a_firing_error_ratio_alert_links_to_its_error_lines(browser: BrowserContext, dashboard: str):
    with opened(browser, f"{dashboard}/alerts") as page:
        link = page.get_by_role("link", name=re.compile("Error lines of shop errors"))
        href = link.get_attribute("href") or ""
        assert href == log_search.logs_url(apps=["shop"], levels=["error", "critical"], names=["app.server"],
                                           since=ALERT_WINDOW[0], until=ALERT_WINDOW[1])
        page.goto(f"{dashboard}/{href}")
        settle(page)
        shot = screenshot(page, "logs-from-alert")
        assert chosen(page, "App") == ["shop"] and chosen(page, "Level") == ["error", "critical"], shot
        assert chosen(page, "Logger name") == ["app.server"], shot
        assert shown_messages(page) == ["payment gateway Timeout after 12 s (in alert window 2)",
                                        "payment gateway timeout after 30 s (in alert window 1)"], shot
        assert any("from a link" in t for t in texts(page, '[data-testid="stAlertContentInfo"]')), shot
        page.get_by_role("button", name=re.compile("Clear window")).click()
        settle(page)
        assert "from=" not in page.url and "app=shop" in page.url


def test_a_firing_rule_on_log_lines_links_to_exactly_the_lines_its_search_counted(browser: BrowserContext,
                                                                                  dashboard: str):
    with opened(browser, f"{dashboard}/alerts") as page:
        link = page.get_by_role("link", name=re.compile("Lines of shop declines"))
        href = link.get_attribute("href") or ""
        assert href == log_search.logs_url(apps=["shop"], levels=["error"], text='"payment declined"',
                                           since=ALERT_WINDOW[0], until=ALERT_WINDOW[1])
        page.goto(f"{dashboard}/{href}")
        settle(page)
        shot = screenshot(page, "logs-from-search-alert")
        assert page.get_by_role("textbox", name='Words and "phrases"').input_value() == '"payment declined"', shot
        shown = [t for t in drawn_grid_texts(page) if "declined" in t]
        assert shown == ["payment: declined for order o-3 (declined 3)", "Payment declined for order o-2 (declined 2)",
                         "payment declined for order o-1 (declined 1)"], shot


def test_a_click_on_the_overviews_error_chart_opens_that_apps_error_lines(browser: BrowserContext, dashboard: str):
    with opened(browser, dashboard) as page:
        chart = page.locator('[data-testid="stPlotlyChart"]').filter(has_text="Error + critical log lines/s")
        chart.scroll_into_view_if_needed()
        # The newest point of a trace: its marker, where Plotly takes the click.
        marker = chart.locator(".scatterlayer .trace .points path.point").last
        box = marker.bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_url(re.compile(r"/logs\?"), timeout=15_000)
        settle(page)
        shot = screenshot(page, "logs-from-overview")
        params = parse_qs(urlparse(page.url).query)
        assert params["level"] == ["error", "critical"] and len(params["app"]) == 1, page.url
        assert chosen(page, "Level") == ["error", "critical"] and chosen(page, "App") == params["app"], shot
        since, until = (log_search.parse_time(params[k][0]) for k in ("from", "to"))
        assert timedelta(0) < until - since <= timedelta(minutes=1), page.url


def test_a_click_on_a_bar_of_the_logs_chart_searches_that_level_and_bucket(browser: BrowserContext, dashboard: str):
    with opened(browser, f"{dashboard}/logs?q=timeout") as page:
        chart = page.locator('[data-testid="stPlotlyChart"]').filter(has_text="Log lines per 10 s by level")
        # The error trace's newest bar (traces are drawn in legend order: critical, debug, error, ...).
        bar = chart.locator(".barlayer .trace").nth(2).locator("path").last
        box = bar.bounding_box()
        assert box is not None
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_url(re.compile(r"from="), timeout=15_000)
        settle(page)
        shot = screenshot(page, "logs-from-chart")
        params = parse_qs(urlparse(page.url).query)
        assert params["level"] == ["error"] and "app" not in params and "q" not in params, page.url  # a new search
        assert chosen(page, "Level") == ["error"] and chosen(page, "App") == [], shot
        since, until = (log_search.parse_time(params[k][0]) for k in ("from", "to"))
        assert until - since == timedelta(seconds=10) and since.second % 10 == 0, page.url
        assert page.get_by_role("textbox", name='Words and "phrases"').input_value() == "", shot


def test_the_patterns_and_dead_letter_views_render(browser: BrowserContext, dashboard: str):
    with opened(browser, f"{dashboard}/logs?minutes=30&view=patterns&q=timeout") as page:
        cells = drawn_grid_texts(page)
        shot = screenshot(page, "logs-patterns")
        assert "payment gateway timeout after <*> s (in alert window <*>)" in cells, (cells, shot)
        page.goto(f"{dashboard}/logs?minutes=30&view=dead")
        settle(page)
        cells = drawn_grid_texts(page)
        shot = screenshot(page, "logs-dead-letters")
        # The log record, with its reason; the fixture's other dead letters are no log records.
        assert "level: not one of debug, info, warning, error, critical" in cells and "fatal" in cells, (cells, shot)
        assert texts(page, '[data-testid="stException"]') == [], shot


EVIL = "http://evil.example"
# Markdown a link could carry in its query: a link, an image, a bare URL (a GFM autolink), raw HTML. (A tag with
# "=" is a k=v filter, not echoed: the tags hold none.)
HOSTILE_TAGS = [f"[x]({EVIL}/tag-link)", f"![]({EVIL}/tag-img.png)", f"{EVIL}/tag-bare", "**bold**`tick`"]
HOSTILE_FROM = f"[y]({EVIL}/from-link) ![]({EVIL}/from-img.png)"
HOSTILE_TO = f'<img src="{EVIL}/to-html.png"> {EVIL}/to-bare'

# Every link (HTML or SVG) and every image or style that would reach the attacker's host.
EVIL_ELEMENTS = r"""() => [...document.querySelectorAll('a, img, image, source, [style]')]
    .flatMap(e => [e.getAttribute('href'), e.getAttributeNS('http://www.w3.org/1999/xlink', 'href'),
                   e.getAttribute('src'), e.getAttribute('srcset'), e.getAttribute('style')])
    .filter(v => v && /(^|url\(["']?)\s*(https?:)?\/\/evil\.example/.test(v))"""


def test_url_parameters_echoed_on_the_logs_page_are_plain_text_not_links_or_images(browser: BrowserContext,
                                                                                    dashboard: str):
    """Given a link to the Logs page whose ``?tag=`` values are no k=v pairs and whose ``?from=&to=`` window is
    unreadable, all carrying Markdown (a link, an image, a bare URL, HTML), when a victim opens it, then the page
    says what it ignored, showing that text as it is, and holds no link to and no image from the attacker's host
    (issue 49, item 11)."""
    query = urlencode({"tag": HOSTILE_TAGS, "from": HOSTILE_FROM, "to": HOSTILE_TO}, doseq=True)
    with opened(browser, f"{dashboard}/logs?{query}") as page:
        shot = screenshot(page, "logs-hostile-url")
        assert page.evaluate(EVIL_ELEMENTS) == [], shot
        ignored = " ".join(t for t in texts(page, '[data-testid="stCaptionContainer"]') if "Ignored" in t)
        assert all(tag in ignored for tag in HOSTILE_TAGS), (ignored, shot)
        unreadable = " ".join(texts(page, '[data-testid="stAlertContentError"]'))
        assert HOSTILE_FROM in unreadable and HOSTILE_TO in unreadable, (unreadable, shot)
        assert texts(page, '[data-testid="stException"]') == [], shot


def test_the_dashboard_names_the_store_by_scheme_and_host_without_its_credentials(browser: BrowserContext,
                                                                                 dashboard: str, store_url: str):
    """Given a store URL that carries a user and password (the session's store: its writer's), then the Overview
    and the Metric explorer name the store as ``http://host:port`` only (issue 49, item 10)."""
    parsed = urlparse(store_url)
    assert parsed.username and parsed.password
    for path in ("", "explorer"):        # the Overview is the main page
        with opened(browser, f"{dashboard}/{path}") as page:
            shot = screenshot(page, f"store-url-{path or 'overview'}")
            shown = page.inner_text("body")
            assert parsed.password not in shown and f"{parsed.username}:" not in shown, (path, shot)
            assert f"store: http://{parsed.hostname}:{parsed.port}" in shown, (path, shot)
