"""Streamlit dashboard entry point: one page per question a user brings.

Run with ``eventide dashboard`` (or ``streamlit run dashboard/app.py``); reads the store named in the config.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

# Not "pages/": Streamlit would also list that folder on its own, beside st.navigation.
PAGES = Path(__file__).resolve().parent / "views"

st.set_page_config(page_title="eventide", layout="wide")
st.navigation([
    st.Page(PAGES / "overview.py", title="Overview", url_path="overview", default=True),
    st.Page(PAGES / "explorer.py", title="Metric explorer", url_path="explorer"),
    st.Page(PAGES / "logs.py", title="Logs", url_path="logs"),
    st.Page(PAGES / "sessions.py", title="Sessions", url_path="sessions"),
    st.Page(PAGES / "stragglers.py", title="Stragglers & clocks", url_path="stragglers"),
    st.Page(PAGES / "alerts.py", title="Alerts", url_path="alerts"),
]).run()
