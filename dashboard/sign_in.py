"""Who may see the dashboard: the check ``app.py`` runs before any page, and so before any query.

Three modes (``dashboard.sign_in``, docs/dashboard.md "Sign-in"):

- ``none``: no check, for a dashboard on loopback only. The config refuses it off loopback at startup; this check
  also refuses to show pages when Streamlit itself listens off loopback (``streamlit run`` started by hand with
  another ``--server.address``, or none, which is every interface).
- ``password``: one shared password, typed into a form, compared in constant time and remembered in the
  browser session's state; wrong tries are limited per client address (:class:`FailureLimiter`).
- ``oidc``: OpenID Connect through Streamlit's own ``st.login`` (its ``[auth]`` settings are written at launch by
  ``dashboard.auth_secrets``); a signed-in user outside ``allowed_emails`` / ``allowed_domains`` sees a refusal and
  a sign-out button, nothing else.
"""

from __future__ import annotations

import hmac
import math
import threading
import time
from collections import deque
from collections.abc import Callable

import streamlit as st

from eventide.config import Config, DashboardConfig, _is_loopback

SIGNED_IN = "eventide_signed_in"
"""Session-state key set once the shared password was typed right (that browser session only)."""
TITLE = "eventide"


def require_sign_in(config: Config) -> None:
    """Return when the visitor may see the pages; otherwise draw the sign-in (or the refusal) and stop the run."""
    mode = config.dashboard.sign_in
    if mode == "password":
        _password(config.dashboard)
    elif mode == "oidc":
        _oidc(config.dashboard)
    elif not _is_loopback(str(st.get_option("server.address") or "")):
        st.title(TITLE)
        st.error("This dashboard has no sign-in (dashboard.sign_in = \"none\") but is served off loopback, so it "
                 "shows nothing. Set dashboard.sign_in to \"oidc\" or \"password\", or serve it on 127.0.0.1.")
        st.stop()


class FailureLimiter:
    """Wrong passwords per client address: at most ``max_failures`` within any ``window_s``; past that every try
    from the address is refused without being checked until its oldest failure leaves the window. One instance per
    server process (every browser session shares it), so opening a new session gains nothing."""

    def __init__(self, max_failures: int, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_failures, self.window_s, self._clock = max_failures, window_s, clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def wait_s(self, address: str) -> float:
        """Seconds until ``address`` may try again; 0 when it may now."""
        with self._lock:
            self._forget_old()
            failures = self._failures.get(address, ())
            if len(failures) < self.max_failures:
                return 0.0
            return failures[0] + self.window_s - self._clock()

    def failed(self, address: str) -> None:
        """Record a wrong password from ``address``."""
        with self._lock:
            self._forget_old()
            self._failures.setdefault(address, deque()).append(self._clock())

    def _forget_old(self) -> None:
        """Drop failures that left the window, and addresses left with none: memory follows the addresses that
        failed lately."""
        oldest = self._clock() - self.window_s
        for address in list(self._failures):
            failures = self._failures[address]
            while failures and failures[0] <= oldest:
                failures.popleft()
            if not failures:
                del self._failures[address]


@st.cache_resource
def _limiter(max_failures: int, window_s: float) -> FailureLimiter:
    return FailureLimiter(max_failures, window_s)


def _password(dashboard: DashboardConfig) -> None:
    if st.session_state.get(SIGNED_IN):
        if st.sidebar.button("Sign out"):
            del st.session_state[SIGNED_IN]
            st.rerun()
        return
    st.title(TITLE)
    with st.form("sign_in"):
        typed = st.text_input("Password", type="password")
        submitted = st.form_submit_button("Sign in", type="primary")
    if submitted:
        limiter = _limiter(dashboard.password_max_failures, dashboard.password_failure_window_s)
        # No address on a local connection; every such visitor shares one allowance.
        address = st.context.ip_address or "local"
        wait = limiter.wait_s(address)
        if wait > 0:
            st.error(f"Too many wrong passwords from your address: try again in {math.ceil(wait)} s.")
        elif hmac.compare_digest(typed.encode(), dashboard.password.encode()):
            st.session_state[SIGNED_IN] = True
            st.rerun()
        else:
            limiter.failed(address)
            st.error("Wrong password.")
    st.stop()


def admitted(dashboard: DashboardConfig, email: str, email_verified: object = None) -> bool:
    """May a user the provider signed in with this ``email`` see the pages? With no list configured, every user
    the provider signs in for this client may; otherwise the email or its domain must be listed exactly (any case).
    An email the provider says is unverified is never admitted by a list: anyone could have typed it."""
    if not (dashboard.allowed_emails or dashboard.allowed_domains):
        return True
    if email_verified is False or str(email_verified).lower() == "false":
        return False
    email = email.strip().lower()
    local, at, domain = email.rpartition("@")
    if not (local and at and domain):
        return False
    return email in dashboard.allowed_emails or domain in dashboard.allowed_domains


def _oidc(dashboard: DashboardConfig) -> None:
    user = st.user
    if not user.is_logged_in:
        st.title(TITLE)
        st.write("Sign in to see the dashboard.")
        st.button("Sign in", on_click=st.login, type="primary")
        st.stop()
    email = str(user.get("email") or "")
    if not admitted(dashboard, email, user.get("email_verified")):
        st.title(TITLE)
        st.error("This account may not open this dashboard. Sign out, then sign in with an account it admits.")
        st.text(f"Signed in as {email or 'an account without an email address'}")   # text: no markup from outside
        st.button("Sign out", on_click=st.logout)
        st.stop()
    st.sidebar.text(email)
    st.sidebar.button("Sign out", on_click=st.logout)
