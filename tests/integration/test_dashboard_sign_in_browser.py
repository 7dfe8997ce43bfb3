"""The dashboard's sign-in, in Debian's headless Chromium, against the dashboard as ``eventide dashboard`` starts it.

OpenID Connect is tried against a real provider on loopback: panva's ``oidc-provider`` (an OpenID Certified
implementation, from the npm registry; ``./run test`` installs it into tests/integration/oidc_js), whose development
login form signs in any login name as an account with that email. The dashboard admits ``example.com`` only.
The shared password and the refusals to serve without a sign-in off loopback are tried too. The store is a real
served one with the schema and no rows: the pages must render, or refuse, not show data.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from eventide.config import Config, load_config, to_environ
from stack.cli import STREAMLIT_OPTIONS
from stack.services import free_port, tail
from store.migrations import apply_migrations
from tests.support.browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    STATUS,
    VIEWPORT,
    running_streamlit,
    screenshot,
    settle,
    texts,
)
from tests.support.stack import REPO, own_database

OIDC_JS = Path(__file__).resolve().parent / "oidc_js"
CLIENT_ID, CLIENT_SECRET = "eventide-dashboard", "test-client-secret-of-some-length"
PASSWORD = "correct horse battery staple"
NAV = '[data-testid="stSidebarNavLink"]'
PAGE_TITLES = ["Overview", "Metric explorer", "Logs", "Sessions", "Stragglers & clocks", "Alerts"]
ERRORS = '[data-testid="stAlertContentError"]'


@dataclass(frozen=True)
class Provider:
    issuer: str

    @property
    def metadata_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    """Debian's Chromium; each test opens its own context, so no test inherits another's cookies."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} not found: install Debian's chromium package (apt-get install chromium)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@contextmanager
def context(chromium: Browser) -> Iterator[Page]:
    """A fresh browser profile (no cookies) and a page in it."""
    ctx: BrowserContext = chromium.new_context(viewport=VIEWPORT)
    try:
        yield ctx.new_page()
    finally:
        ctx.close()


def dashboard_config(root: Path, store_url: str, port: int, **dashboard: object) -> Config:
    config = load_config(environ={}, root=str(REPO), paths={"data_dir": str(root / "var")},
                         store={"url": store_url, "database": own_database("sign_in")},
                         dashboard={"host": "127.0.0.1", "port": port, "refresh_s": 3600, **dashboard})
    apply_migrations(config)
    return config


def launcher_env(config: Config) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTIDE_")}
    # Others may edit dashboard/ while this runs: a changed file would put a "rerun?" prompt in the status widget.
    return {**env, **to_environ(config), "STREAMLIT_SERVER_FILE_WATCHER_TYPE": "none"}


@contextmanager
def launched(config: Config, log: Path) -> Iterator[str]:
    """``eventide dashboard`` (the CLI, which writes the sign-in's secrets file and runs ``streamlit run``) for
    ``config``; yields its base URL."""
    with running_streamlit([sys.executable, "-m", "stack.cli", "dashboard"], launcher_env(config), log,
                           f"http://127.0.0.1:{config.dashboard.port}") as url:
        yield url


@contextmanager
def oidc_provider(root: Path, redirect_uri: str) -> Iterator[Provider]:
    """``node provider.mjs`` on a free loopback port with the dashboard as its one client."""
    assert (OIDC_JS / "node_modules").is_dir(), "./run test installs it (npm ci in tests/integration/oidc_js)"
    port, log = free_port(), root / "oidc-provider.log"
    with open(log, "wb") as out:
        node = subprocess.Popen(["node", "provider.mjs", str(port), CLIENT_ID, CLIENT_SECRET, redirect_uri],
                                cwd=OIDC_JS, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_listening(node, log)
        yield Provider(f"http://127.0.0.1:{port}")
    finally:
        os.killpg(node.pid, signal.SIGTERM)
        node.wait(timeout=10)


def _wait_listening(node: subprocess.Popen[bytes], log: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while "listening http://" not in log.read_text(errors="replace"):
        if node.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the OpenID Connect provider did not start:\n{tail(log)}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def oidc(tmp_path_factory: pytest.TempPathFactory, store_url: str) -> Iterator[tuple[str, Provider]]:
    """The dashboard with ``sign_in = "oidc"`` admitting ``example.com``, and its provider: (dashboard URL,
    provider)."""
    root = tmp_path_factory.mktemp("dashboard-oidc")
    port = free_port()
    with oidc_provider(root, f"http://127.0.0.1:{port}/oauth2callback") as provider:
        # prompt=login: this provider supports login, consent and none, not Streamlit's default select_account.
        config = dashboard_config(root, store_url, port, sign_in="oidc", oidc_server_metadata_url=provider.metadata_url,
                                  oidc_client_id=CLIENT_ID, oidc_client_secret=CLIENT_SECRET, oidc_prompt="login",
                                  allowed_domains=["example.com"])
        with launched(config, root / "dashboard.log") as url:
            yield url, provider


def sign_in_at_provider(page: Page, provider: Provider, login: str) -> None:
    """From the dashboard's sign-in page through the provider's login and consent forms, back to the dashboard."""
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{provider.issuer}/interaction/**")
    page.fill('input[name="login"]', login)
    page.fill('input[name="password"]', "any password: the development form checks none")
    page.click('button[type="submit"]')
    page.wait_for_url(f"{provider.issuer}/interaction/**")      # consent: the dashboard may read the email
    page.get_by_role("button", name="Continue").click()
    page.wait_for_url(lambda url: not url.startswith(provider.issuer) and "oauth2callback" not in url)
    settle(page)


def test_signed_out_visitor_sees_only_a_sign_in_that_leads_to_the_provider(chromium, oidc):
    dashboard, provider = oidc
    with context(chromium) as page:
        for path in ("", "logs"):                       # the root and a page's own URL alike
            page.goto(f"{dashboard}/{path}")
            settle(page)
            shot = screenshot(page, f"sign-in-oidc-signed-out{'-' + path if path else ''}")
            assert texts(page, "h1") == ["eventide"], shot
            assert texts(page, NAV) == [], f"pages listed before sign-in ({shot})"
            assert page.get_by_role("button", name="Sign in").count() == 1
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"{provider.issuer}/interaction/**")
        assert page.locator('input[name="login"]').count() == 1        # the provider's own sign-in form


def test_user_of_an_admitted_domain_signs_in_and_sees_the_pages(chromium, oidc):
    dashboard, provider = oidc
    with context(chromium) as page:
        page.goto(dashboard)
        settle(page)
        sign_in_at_provider(page, provider, "alice@example.com")
        screenshot(page, "sign-in-oidc-admitted")
        assert page.url.startswith(dashboard)
        assert texts(page, "h1")[:1] == ["Overview"]
        assert texts(page, NAV) == PAGE_TITLES
        assert "alice@example.com" in page.locator('[data-testid="stSidebar"]').inner_text()
        assert texts(page, '[data-testid="stException"]') == [] and texts(page, ERRORS) == []
        page.goto(f"{dashboard}/logs")                 # signed in for every page, across reloads (a cookie)
        settle(page)
        assert texts(page, "h1")[:1] == ["Logs"]


def test_user_of_another_domain_is_refused_and_sees_no_page(chromium, oidc):
    dashboard, provider = oidc
    with context(chromium) as page:
        page.goto(dashboard)
        settle(page)
        sign_in_at_provider(page, provider, "mallory@evil.test")
        for path in ("", "logs", "alerts"):
            if path:
                page.goto(f"{dashboard}/{path}")
                settle(page)
            shot = screenshot(page, f"sign-in-oidc-refused{'-' + path if path else ''}")
            assert texts(page, "h1") == ["eventide"], shot
            assert texts(page, NAV) == [], shot
            assert any("may not open this dashboard" in e for e in texts(page, ERRORS)), path
            assert "Signed in as mallory@evil.test" in page.locator('[data-testid="stMain"]').inner_text()
            assert page.get_by_role("button", name="Sign out").count() == 1
            assert page.locator('[data-testid="stPlotlyChart"], [data-testid="stDataFrame"]').count() == 0


@pytest.fixture
def password_dashboard(tmp_path: Path, store_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """The dashboard with ``sign_in = "password"``; ``password_max_failures`` from the test's parameter if any."""
    failures = getattr(request, "param", 5)
    config = dashboard_config(tmp_path, store_url, free_port(), sign_in="password", password=PASSWORD,
                              password_max_failures=failures)
    with launched(config, tmp_path / "dashboard.log") as url:
        yield url


def type_password(page: Page, password: str) -> None:
    page.get_by_label("Password", exact=True).fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_timeout(300)
    page.wait_for_selector(STATUS, state="hidden")
    settle(page)


def test_shared_password_wrong_is_refused_right_shows_the_pages(chromium, password_dashboard):
    with context(chromium) as page:
        page.goto(password_dashboard)
        settle(page)
        assert texts(page, NAV) == [] and texts(page, "h1") == ["eventide"]
        type_password(page, "not the password")
        shot = screenshot(page, "sign-in-password-wrong")
        assert texts(page, ERRORS) == ["Wrong password."], shot
        assert texts(page, NAV) == []
        type_password(page, PASSWORD)
        assert texts(page, "h1")[:1] == ["Overview"]
        assert texts(page, NAV) == PAGE_TITLES
        assert page.get_by_role("button", name="Sign out").count() == 1


@pytest.mark.parametrize("password_dashboard", [2], indirect=True)
def test_shared_password_tries_are_limited_per_address_across_sessions(chromium, password_dashboard):
    with context(chromium) as page:
        page.goto(password_dashboard)
        settle(page)
        for _ in range(2):
            type_password(page, "guess")
            assert texts(page, ERRORS) == ["Wrong password."]
        type_password(page, PASSWORD)                   # right, but past the limit: not even checked
        assert any(e.startswith("Too many wrong passwords") for e in texts(page, ERRORS))
        assert texts(page, NAV) == []
    with context(chromium) as page:                     # a new browser session starts no new allowance
        page.goto(password_dashboard)
        settle(page)
        type_password(page, PASSWORD)
        assert any(e.startswith("Too many wrong passwords") for e in texts(page, ERRORS))
        assert texts(page, NAV) == []


def test_launcher_refuses_to_serve_off_loopback_without_a_sign_in(tmp_path, store_url):
    config = dashboard_config(tmp_path, store_url, free_port())
    env = {**launcher_env(config), "EVENTIDE_DASHBOARD__HOST": "0.0.0.0"}
    try:
        done = subprocess.run([sys.executable, "-m", "stack.cli", "dashboard"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=30, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the dashboard started on 0.0.0.0 without a sign-in: {exc.stdout!r}")
    assert done.returncode == 2, done
    assert "dashboard.sign_in" in done.stderr and "0.0.0.0" in done.stderr, done.stderr


def test_app_served_off_loopback_by_hand_without_a_sign_in_shows_nothing(chromium, tmp_path, store_url):
    """``streamlit run dashboard/app.py`` started by hand on every interface, bypassing the launcher's check."""
    config = dashboard_config(tmp_path, store_url, free_port())
    port, log = config.dashboard.port, tmp_path / "streamlit.log"
    argv = [sys.executable, "-m", "streamlit", "run", str(REPO / "dashboard" / "app.py"), *STREAMLIT_OPTIONS,
            "--server.port", str(port), "--server.address", "0.0.0.0"]
    with running_streamlit(argv, launcher_env(config), log, f"http://127.0.0.1:{port}") as url, \
            context(chromium) as page:
        page.goto(f"{url}/")
        settle(page)
        assert texts(page, NAV) == []
        assert any("served off loopback" in e for e in texts(page, ERRORS)), texts(page, ERRORS)
