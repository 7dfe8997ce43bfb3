"""The dashboard page against a real chDB store populated through the sql layer (Streamlit AppTest)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from datasketches import kll_doubles_sketch
from streamlit.testing.v1 import AppTest

from analytics.sinks import WINDOW_COLUMNS
from eventide.config import load_config, to_environ
from store.client import connect
from store.migrations import apply_migrations
from tests.conftest import REPO

APP = str(REPO / "dashboard" / "pages" / "explorer.py")


@pytest.fixture
def store(tmp_path, monkeypatch):
    config = load_config(environ={}, root=str(tmp_path), store={"database": "dash"})
    apply_migrations(config)
    for key, value in to_environ(config).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("EVENTIDE_CONFIG", raising=False)
    return config


def _window(start: datetime, count: int, p99: float) -> list:
    """A 10 s window as the job writes it, with a real KLL sketch of ``count`` values up to ``p99``."""
    sketch = kll_doubles_sketch(200)
    for i in range(count):
        sketch.update(1.0 + (p99 - 1.0) * i / max(count - 1, 1))
    row = dict.fromkeys(WINDOW_COLUMNS, 0)
    row.update(window_kind="tumbling", window_length_ms=10_000, window_start=start,
               window_end=start + timedelta(seconds=10), app="shop", kind="metric", name="latency_ms",
               series_tags="", event_count=count, value_count=count, sum=float(count), min=1.0, max=p99,
               mean=1.0, rate=count / 10, p50=1.0, p90=2.0, p95=3.0, p99=p99, p999=p99,
               window_hop_ms=10_000, value_sketch=sketch.serialize(), users_sketch=b"", devices_sketch=b"")
    return [row[c] for c in WINDOW_COLUMNS]


def _values(y: list | dict) -> list[float]:
    """Plotly ships numeric arrays as base64 ``{"dtype", "bdata"}``."""
    if isinstance(y, dict):
        return np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]).tolist()
    return list(y)


def test_empty_store_says_there_is_no_data_yet(store):
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception
    assert any("No windows yet" in info.value for info in at.info)


def test_series_page_charts_rate_and_p99(store):
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    now -= timedelta(seconds=now.second % 10)     # windows start on the 10 s grid, as the job writes them
    rows = [_window(now - timedelta(seconds=10 * i), 10 * i, float(i)) for i in range(1, 6)]
    with connect(store) as client:
        client.insert("window_aggregates", [[*r, 1, now] for r in rows],
                      column_names=[*WINDOW_COLUMNS, "version", "written_at"])
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception
    assert at.sidebar.selectbox[0].value.label == "shop · metric · latency_ms"
    charts = at.get("plotly_chart")
    assert len(charts) == 3
    assert any("5 buckets of 10 s" in c.value for c in at.caption)
    traces = {t["name"]: _values(t["y"]) for t in json.loads(charts[1].proto.spec)["data"]}
    assert traces["p99"] == [5.0, 4.0, 3.0, 2.0, 1.0]   # read from each window's KLL sketch, oldest first


def test_unreachable_store_shows_the_url_it_tried(store, monkeypatch):
    monkeypatch.setenv("EVENTIDE_STORE__URL", "http://127.0.0.1:1")
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert any("127.0.0.1:1" in err.value for err in at.error)


ALERTS_PAGE = str(REPO / "dashboard" / "pages" / "alerts.py")
RULES = """
[[rule]]
name = "checkout p99"
series = { app = "checkout", kind = "metric", name = "latency_ms" }
statistic = "p99"
comparator = ">"
threshold = 500
for = 2
"""


def test_alerts_page_shows_firing_alerts_their_history_and_the_rules(store, tmp_path, monkeypatch):
    rules = tmp_path / "alerts.toml"
    rules.write_text(RULES)
    monkeypatch.setenv("EVENTIDE_ALERTING__RULES_FILE", str(rules))
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    with connect(store) as client:
        client.insert("alert_states", [["checkout p99", "checkout · metric · latency_ms", "firing", 3, now, now,
                                        900.0, 500.0, "warning", now]],
                      column_names=["rule", "series", "state", "breaches", "evaluated_until", "since", "value",
                                    "threshold", "severity", "updated_at"])
        client.insert("alert_transitions", [
            [f"k{i}", "checkout p99", "checkout · metric · latency_ms", to, now - timedelta(minutes=3 - i), 900.0,
             500.0, "warning", int(to == "firing"), now] for i, to in enumerate(["pending", "firing"])],
            column_names=["transition_key", "rule", "series", "to_state", "window_end", "value", "threshold",
                          "severity", "notify", "recorded_at"])
    at = AppTest.from_file(ALERTS_PAGE, default_timeout=30).run()
    assert not at.exception
    assert {m.label: m.value for m in at.metric} == {"firing": "1", "pending": "0", "rules": "1"}
    [chart] = at.get("plotly_chart")
    assert {t["name"] for t in json.loads(chart.proto.spec)["data"]} >= {"pending, warning", "firing, warning"}
    assert len(at.dataframe) == 2 and list(at.dataframe[1].value["name"]) == ["checkout p99"]
    assert at.query_params["minutes"] == "15"      # the range is in the URL


def test_alerts_page_without_evaluations_and_with_broken_rules_says_so(store, tmp_path, monkeypatch):
    rules = tmp_path / "alerts.toml"
    rules.write_text(RULES.replace('"p99"', '"p100"'))
    monkeypatch.setenv("EVENTIDE_ALERTING__RULES_FILE", str(rules))
    at = AppTest.from_file(ALERTS_PAGE, default_timeout=30).run()
    assert not at.exception
    assert any("rule 'checkout p99' (rule #1), field statistic" in e.value for e in at.error)
    assert any("No rule has been evaluated yet" in i.value for i in at.info)


def test_a_shared_link_restores_the_time_range(store):
    at = AppTest.from_file(ALERTS_PAGE, default_timeout=30)
    at.query_params["minutes"] = "90"
    at.run()
    assert at.sidebar.slider[0].value == 90 and at.query_params["minutes"] == "90"


OVERVIEW_PAGE = str(REPO / "dashboard" / "pages" / "overview.py")


def test_overview_charts_rates_stragglers_dead_letters_and_shows_freshness(store):
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    now -= timedelta(seconds=now.second % 10)
    rows = [_window(now - timedelta(seconds=10 * i), 10 * i, float(i)) for i in range(1, 6)]
    with connect(store) as client:
        client.insert("window_aggregates", [[*r, 1, now] for r in rows],
                      column_names=[*WINDOW_COLUMNS, "version", "written_at"])
        client.insert("stragglers", [["tumbling", 10_000, 10_000, "shop", "metric", "latency_ms", "",
                                      now - timedelta(minutes=5), now, 0, i, f"e{i}", "d", now, now, 500,
                                      "windows", 1, now - timedelta(seconds=20)] for i in range(3)],
                      column_names=["window_kind", "window_length_ms", "window_hop_ms", "app", "kind", "name",
                                    "series_tags", "window_start", "window_end", "source_partition",
                                    "source_offset", "event_id", "device", "corrected_event_time", "watermark",
                                    "lateness_ms", "query_name", "batch_id", "detected_at"])
        client.insert("dead_letters", [["events", 0, i, now, "unparseable JSON", "x", 1, now - timedelta(seconds=30)]
                                       for i in range(7)],
                      column_names=["source_topic", "source_partition", "source_offset", "kafka_timestamp",
                                    "reason", "raw", "raw_bytes", "detected_at"])
        client.insert("pipeline_progress", [["windows", "q", "r", 1, now, now - timedelta(seconds=40), now]],
                      column_names=["query_name", "query_id", "run_id", "batch_id", "batch_timestamp", "watermark",
                                    "recorded_at"])
    at = AppTest.from_file(OVERVIEW_PAGE, default_timeout=30).run()
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["dead letters in range"] == "7" and metrics["alerts firing"] == "0"
    assert 40 <= int(metrics["freshness (now − watermark)"].removesuffix(" s")) < 100
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    assert titles[:2] == ["Events/s per app", "Error + critical log lines/s per app"]
    assert any(t.startswith("Dropped stragglers") for t in titles) and "Dead-letter rate" in titles
