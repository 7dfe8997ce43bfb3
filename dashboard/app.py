"""Streamlit dashboard entry point: one page per question a user brings.

Run with ``eventide dashboard`` (or ``streamlit run dashboard/app.py --server.address 127.0.0.1``: without a sign-in
it shows no page off loopback); reads the store named in the config.
The sign-in check (``dashboard.sign_in``) runs first: no page, and so no query, runs for a visitor it stops.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard.common import config_or_stop
from dashboard.sign_in import require_sign_in

# Not "pages/": Streamlit would also list that folder on its own, beside st.navigation.
PAGES = Path(__file__).resolve().parent / "views"

st.set_page_config(page_title="eventide", layout="wide")
require_sign_in(config_or_stop())
st.navigation([
    st.Page(PAGES / "overview.py", title="Overview", url_path="overview", default=True),
    st.Page(PAGES / "explorer.py", title="Metric explorer", url_path="explorer"),
    st.Page(PAGES / "logs.py", title="Logs", url_path="logs"),
    st.Page(PAGES / "sessions.py", title="Sessions", url_path="sessions"),
    st.Page(PAGES / "stragglers.py", title="Stragglers & clocks", url_path="stragglers"),
    st.Page(PAGES / "alerts.py", title="Alerts", url_path="alerts"),
]).run()
