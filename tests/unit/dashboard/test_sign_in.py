"""The dashboard's sign-in pieces that need no browser: who an OpenID Connect sign-in admits, how wrong passwords are
limited, and the secrets file the launcher writes for Streamlit's ``st.login``.
(tests/integration/test_dashboard_sign_in_browser.py signs in through Chromium.)"""

from __future__ import annotations

import stat
import tomllib

import pytest

from dashboard.auth_secrets import COOKIE_SECRET_FILE, SECRETS_FILE, streamlit_options
from dashboard.sign_in import FailureLimiter, admitted
from eventide.config import load_config
from stack.cli import dashboard_argv

OIDC = {"sign_in": "oidc", "oidc_server_metadata_url": "https://idp.example.com/.well-known/openid-configuration",
        "oidc_client_id": "eventide", "oidc_client_secret": 's3cret"\nadmin = true'}


def dashboard(**settings: object):
    return load_config(environ={}, dashboard={**OIDC, **settings}).dashboard


@pytest.mark.parametrize(("email", "verified", "admit"), [
    ("alice@example.com", True, True),
    ("Alice@EXAMPLE.com", None, True),                   # any case; no email_verified claim at all
    ("bob@partner.test", True, True),                     # listed by address
    ("mallory@evil.test", True, False),
    ("mallory@eu.example.com", True, False),             # a subdomain is another domain
    ("mallory@example.com.evil.test", True, False),
    ("mallory@notexample.com", True, False),
    ("alice@example.com", False, False),                  # the provider says nobody proved it
    ("alice@example.com", "false", False),
    ("", True, False),                                    # no email
    ("example.com", True, False),
    ("@example.com", True, False),
])
def test_a_list_admits_exactly_its_emails_and_domains(email, verified, admit):
    d = dashboard(allowed_domains=["example.com"], allowed_emails=["bob@partner.test"])
    assert admitted(d, email, verified) is admit


def test_without_a_list_every_user_the_provider_signs_in_is_admitted():
    assert admitted(dashboard(), "anyone@anywhere.test", None)


def test_wrong_passwords_are_limited_per_address_within_the_window():
    now = [0.0]
    limiter = FailureLimiter(max_failures=3, window_s=60, clock=lambda: now[0])
    for _ in range(3):
        assert limiter.wait_s("10.0.0.1") == 0
        limiter.failed("10.0.0.1")
        now[0] += 10
    assert limiter.wait_s("10.0.0.1") == pytest.approx(30)     # the first failure leaves the window at 60 s
    assert limiter.wait_s("10.0.0.2") == 0                       # another address has its own allowance
    now[0] = 60.5
    assert limiter.wait_s("10.0.0.1") == 0                       # one failure left the window: one more try
    now[0] = 1000
    assert limiter.wait_s("10.0.0.1") == 0 and limiter._failures == {}   # nothing kept for quiet addresses


def test_launcher_writes_streamlits_auth_settings_privately_and_only_for_oidc(tmp_path):
    config = load_config(environ={}, root=str(tmp_path), dashboard=OIDC)
    options = streamlit_options(config)
    secrets = config.data_dir / "dashboard" / SECRETS_FILE
    assert options == ["--secrets.files", str(secrets)]
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert stat.S_IMODE(secrets.parent.stat().st_mode) == 0o700
    auth = tomllib.loads(secrets.read_text())["auth"]
    assert auth["client_secret"] == 's3cret"\nadmin = true'       # a value, however quoted, stays one value
    assert set(auth) == {"redirect_uri", "cookie_secret", "client_id", "client_secret", "server_metadata_url",
                         "client_kwargs"}
    assert auth["redirect_uri"] == "http://127.0.0.1:8501/oauth2callback"
    assert auth["client_kwargs"] == {"prompt": "select_account"}
    assert len(auth["cookie_secret"]) >= 32
    # The generated cookie secret is kept: a restart signs nobody out.
    streamlit_options(config)
    assert tomllib.loads(secrets.read_text())["auth"]["cookie_secret"] == auth["cookie_secret"]
    assert stat.S_IMODE((secrets.parent / COOKIE_SECRET_FILE).stat().st_mode) == 0o600
    # Another sign-in: no client secret left behind, and still no other secrets file read.
    other = load_config(environ={}, root=str(tmp_path), dashboard={"sign_in": "password", "password": "p" * 12})
    assert streamlit_options(other) == options and not secrets.exists()


def test_the_cli_starts_streamlit_with_the_secrets_file_and_the_configured_address(tmp_path):
    config = load_config(environ={}, root=str(tmp_path), dashboard={**OIDC, "port": 8600})
    argv = dashboard_argv(config)
    assert argv[argv.index("--secrets.files") + 1] == str(config.data_dir / "dashboard" / SECRETS_FILE)
    assert argv[argv.index("--server.address") + 1] == "127.0.0.1"
    assert argv[argv.index("--server.port") + 1] == "8600"


def test_the_served_dashboard_watches_no_files_and_runs_no_collection_after_each_script_run(tmp_path):
    from streamlit import config as streamlit_config

    argv = dashboard_argv(load_config(environ={}, root=str(tmp_path)))
    options = {argv[i]: argv[i + 1] for i, arg in enumerate(argv) if arg.startswith("--") and i + 1 < len(argv)}
    assert options["--server.fileWatcherType"] == "none"
    assert options["--runner.postScriptGC"] == "false"
    # both are options of the installed Streamlit (an unknown one would stop `streamlit run`; get_option raises)
    for name in ("server.fileWatcherType", "runner.postScriptGC"):
        streamlit_config.get_option(name)
