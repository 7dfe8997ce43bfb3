"""The dashboard page against a real chDB store populated through the sql layer (Streamlit AppTest)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from streamlit.testing.v1 import AppTest

from analytics.sinks import WINDOW_COLUMNS
from eventide.config import load_config, to_environ
from store.client import connect
from store.migrations import apply_migrations
from tests.conftest import REPO

APP = str(REPO / "dashboard" / "app.py")


@pytest.fixture
def store(tmp_path, monkeypatch):
    config = load_config(environ={}, root=str(tmp_path), store={"database": "dash"})
    apply_migrations(config)
    for key, value in to_environ(config).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("EVENTIDE_CONFIG", raising=False)
    return config


def _window(start: datetime, count: int, p99: float) -> list:
    row = dict.fromkeys(WINDOW_COLUMNS, 0)
    row.update(window_kind="tumbling", window_length_ms=10_000, window_start=start,
               window_end=start + timedelta(seconds=10), app="shop", kind="metric", name="latency_ms",
               series_tags="", event_count=count, value_count=count, sum=float(count), min=1.0, max=p99,
               mean=1.0, rate=count / 10, p50=1.0, p90=2.0, p95=3.0, p99=p99, p999=p99,
               value_sketch=b"", users_sketch=b"", devices_sketch=b"")
    return [row[c] for c in WINDOW_COLUMNS]


def test_empty_store_says_there_is_no_data_yet(store):
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception
    assert any("No windows yet" in info.value for info in at.info)


def test_series_page_charts_rate_and_p99(store):
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    rows = [_window(now - timedelta(seconds=10 * i), 10 * i, float(i)) for i in range(1, 6)]
    with connect(store) as client:
        client.insert("window_aggregates", [[*r, 1, now] for r in rows],
                      column_names=[*WINDOW_COLUMNS, "version", "written_at"])
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception
    assert at.sidebar.selectbox[0].value.label == "shop · metric · latency_ms"
    charts = at.get("plotly_chart")
    assert len(charts) == 2
    assert any("5 windows" in c.value for c in at.caption)


def test_unreachable_store_shows_the_url_it_tried(store, monkeypatch):
    monkeypatch.setenv("EVENTIDE_STORE__URL", "http://127.0.0.1:1")
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert any("127.0.0.1:1" in err.value for err in at.error)
