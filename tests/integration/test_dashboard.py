"""The dashboard page against a real chDB store populated through the sql layer (Streamlit AppTest)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
import pytest
import uvicorn
from datasketches import hll_sketch, kll_doubles_sketch
from streamlit.testing.v1 import AppTest

from alerting.alertmanager import fingerprint
from alerting.api import create_app
from alerting.silences import listed as listed_silences
from alerting.silences import new_silence, save
from analytics.windows.writer import WINDOW_COLUMNS
from dashboard import common, queries
from eventide.config import load_config, to_environ
from stack.services import free_port
from store import pipeline
from store.client import connect
from store.migrations import apply_migrations
from tests.support.servers import uvicorn_in_thread
from tests.support.stack import REPO, own_database

APP = str(REPO / "dashboard" / "views" / "explorer.py")


@pytest.fixture
def store(tmp_path, monkeypatch, store_url):
    config = load_config(environ={}, root=str(tmp_path), store={"url": store_url, "database": own_database("dash")})
    apply_migrations(config)
    for key, value in to_environ(config).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("EVENTIDE_CONFIG", raising=False)
    return config


def _window(start: datetime, count: int, top: float, /, **changes: Any) -> list:
    """A 10 s window as the job writes it, with a real KLL sketch of ``count`` values up to ``top`` (its p99);
    ``changes`` replace any of its columns."""
    sketch = kll_doubles_sketch(200)
    for i in range(count):
        sketch.update(1.0 + (top - 1.0) * i / max(count - 1, 1))
    row = dict.fromkeys(WINDOW_COLUMNS, 0)
    row.update(window_kind="tumbling", window_length_ms=10_000, window_start=start,
               window_end=start + timedelta(seconds=10), app="shop", kind="metric", name="latency_ms",
               series_tags="", event_count=count, value_count=count, sum=float(count), min=1.0, max=top,
               mean=1.0, rate=count / 10, p50=1.0, p90=2.0, p95=3.0, p99=top, p999=top,
               window_hop_ms=10_000, value_sketch=sketch.serialize(), users_sketch=b"", devices_sketch=b"")
    row.update(changes)
    return [row[c] for c in WINDOW_COLUMNS]


def _values(y: list | dict) -> list[float]:
    """Plotly ships numeric arrays as base64 ``{"dtype", "bdata"}``."""
    if isinstance(y, dict):
        return np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]).tolist()
    return list(y)


def _specs(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _time_charts_span_the_range(at: AppTest, minutes: int = 15) -> int:
    """Checks what every chart of the page shares (common.chart_layout, common.time_axis); returns how many time
    charts there were, so a caller can tell the check was not vacuous.

    Every legend sits above its plot, under the title (below, it covered the x-axis title); every time axis spans
    exactly the chosen range, ending now, whatever the data covers, and the data lies in it (a bucket may start up to
    a bucket before); no tick is labelled finer than a second.
    """
    now = datetime.now(UTC).replace(tzinfo=None)
    time_charts = 0
    for spec in _specs(at):
        layout = spec["layout"]
        legend = layout["legend"]     # in the figure, from just under the title band down
        assert (legend["yref"], legend["yanchor"]) == ("container", "top") and legend["y"] < 1, layout["title"]
        if layout["xaxis"].get("type") != "date":
            continue
        time_charts += 1
        lo, hi = (datetime.fromisoformat(t) for t in layout["xaxis"]["range"])
        assert hi - lo == timedelta(minutes=minutes), layout["title"]
        assert abs(now - hi) < timedelta(seconds=30), (layout["title"], hi, now)
        xs = [datetime.fromisoformat(x) for trace in spec["data"] for x in trace["x"]]
        assert xs and all(lo - timedelta(hours=1) <= x <= hi for x in xs), (layout["title"], min(xs), max(xs))
        assert all("%L" not in stop["value"] for stop in layout["xaxis"]["tickformatstops"])
    return time_charts


def test_a_time_chart_with_one_bucket_spans_the_chosen_range_with_a_bucket_wide_bar():
    until = datetime(2026, 11, 23, 18, 45, tzinfo=UTC)
    since = until - timedelta(hours=1)
    one = pd.DataFrame({"t": [pd.Timestamp("2026-11-23 18:44:00", tz="UTC")], "n": [3], "app": ["shop"]})
    bar = json.loads(common.time_chart(one, "n", "per 60 s", "events", (since, until), "app", "bar", 60).to_json())
    assert bar["layout"]["xaxis"]["range"] == ["2026-11-23T17:45:00", "2026-11-23T18:45:00"]   # naive UTC
    [trace] = bar["data"]
    assert (trace["width"], trace["offset"]) == (60_000, 0)       # [bucket start, + 60 s), not a hairline
    # Plotly labels sub-second ticks with milliseconds: they are formatted to the second instead.
    assert bar["layout"]["xaxis"]["tickformatstops"] == [{"dtickrange": [None, 1000], "value": "%H:%M:%S"}]
    [line] = json.loads(common.time_chart(one, "n", "rate", "events / s", (since, until)).to_json())["data"]
    assert line["mode"] == "lines+markers"        # a one-point line would draw nothing


def test_the_partition_axis_is_categorical():
    fig = json.loads(common.partition_chart({0: 12, 1: 0, 2: 7}).to_json())
    assert fig["layout"]["xaxis"]["type"] == "category"
    assert fig["data"][0]["x"] == ["0", "1", "2"]


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
    assert _time_charts_span_the_range(at) == 3


def test_explorer_opens_on_the_busiest_metric_and_shows_a_log_series_its_levels_and_error_ratio(store):
    # Given, in the last minutes, a logger with many more lines than the one metric has events,
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    now -= timedelta(seconds=now.second % 10)
    metric = [_window(now - timedelta(seconds=10 * i), 5, 9.0) for i in range(1, 4)]
    logs = [_window(now - timedelta(seconds=10 * i), 100, 0.0, app="checkout", kind="log", name="payments",
                    value_count=0, sum=0.0, min=None, max=None, mean=None, p50=None, p90=None, p95=None, p99=None,
                    p999=None, value_sketch=b"", level_info=90, level_error=10 * i - 5, level_critical=5 * (i == 3))
            for i in range(1, 4)]
    with connect(store) as client:
        client.insert("window_aggregates", [[*r, 1, now] for r in metric + logs],
                      column_names=[*WINDOW_COLUMNS, "version", "written_at"])
    # the explorer opens on the metric (its percentiles mean something), listing each series with its events;
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception
    assert at.sidebar.selectbox[0].value.label == "shop · metric · latency_ms"
    assert at.sidebar.selectbox[0].options == ["checkout · log · payments · 300 events",
                                               "shop · metric · latency_ms · 15 events"]
    # and the log series shows its lines per level and error ratio, never percentiles, and links to its lines.
    at.sidebar.selectbox[0].select(at.sidebar.selectbox[0].options[0]).run()
    assert not at.exception
    specs = _specs(at)
    assert [s["layout"]["title"]["text"] for s in specs] == [
        "Lines per level · checkout · log · payments", "Error ratio · checkout · log · payments"]
    levels = {t["name"]: _values(t["y"]) for t in specs[0]["data"]}
    assert levels == {"info": [90, 90, 90], "error": [25, 15, 5], "critical": [5, 0, 0]}
    [ratio] = specs[1]["data"]
    assert _values(ratio["y"]) == [0.3, 0.15, 0.05]
    assert any("Open these lines on the Logs page" in m.value and "app=checkout" in m.value for m in at.markdown)


def test_unreachable_store_shows_the_url_it_tried(store, monkeypatch):
    tried = f"http://127.0.0.1:{free_port()}"          # nothing listens there; not a prefix of any other URL shown
    monkeypatch.setenv("EVENTIDE_STORE__URL", tried)
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert [err.value for err in at.error if err.value.startswith(f"Store unreachable at {tried}: ")], \
        [err.value for err in at.error]


ALERTS_PAGE = str(REPO / "dashboard" / "views" / "alerts.py")
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
    assert _time_charts_span_the_range(at) == 1
    assert len(at.dataframe) == 2 and list(at.dataframe[1].value["name"]) == ["checkout p99"]
    assert at.query_params["minutes"] == "15"      # the range is in the URL


ROUTING = """
[routing]
receiver = "oncall"
group_by = ["app"]

[[receiver]]
name = "oncall"
webhook = { url = "http://127.0.0.1:9/hook" }
"""


def test_alerts_page_marks_silenced_alerts_and_lists_silences_and_what_receivers_were_sent(store, tmp_path,
                                                                                             monkeypatch):
    rules = tmp_path / "alerts.toml"
    rules.write_text(RULES + ROUTING)
    monkeypatch.setenv("EVENTIDE_ALERTING__RULES_FILE", str(rules))
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    labels = '{"alertname": "checkout p99", "severity": "warning", "app": "checkout"}'
    with connect(store) as client:
        for series, app in (("checkout · metric · latency_ms", "checkout"), ("search · metric · latency_ms", "search")):
            client.insert("alert_states", [["checkout p99", series, "firing", 3, now, now, 900.0, 500.0, "warning",
                                            now]],
                          column_names=["rule", "series", "state", "breaches", "evaluated_until", "since", "value",
                                        "threshold", "severity", "updated_at"])
            client.insert("alert_transitions", [[f"k-{app}", "checkout p99", series, "firing", now, 900.0, 500.0,
                                                 "warning", 1, now, labels.replace("checkout\"}", f'{app}"}}')]],
                          column_names=["transition_key", "rule", "series", "to_state", "window_end", "value",
                                        "threshold", "severity", "notify", "recorded_at", "labels"])
        search = {"alertname": "checkout p99", "severity": "warning", "app": "search"}
        client.insert("alert_group_notifications", [["oncall|{}:{}|1", "oncall", '{}:{app="search"}', "firing",
                                                     [fingerprint(search)], [], 1, "{}", now]],
                      column_names=["notification_key", "receiver", "group_key", "status", "firing", "resolved",
                                    "alerts", "body", "decided_at"])
    at_ms = int(now.replace(tzinfo=UTC).timestamp() * 1000)
    save(store, new_silence(['app="checkout"'], at_ms - 1000, at_ms + 3_600_000, "alice", "deploy 42"))
    at = AppTest.from_file(ALERTS_PAGE, default_timeout=30).run()
    assert not at.exception
    states, groups, silences, sent = (at.dataframe[i].value for i in range(4))
    silence_id = silences["silence_id"][0]
    assert dict(zip(states["series"], states["silenced"], strict=True)) == {
        "checkout · metric · latency_ms": silence_id, "search · metric · latency_ms": common.MISSING}
    # and says why the one is not notified and when the other's repeat is due,
    sent_at, repeat = (t.strftime("%H:%M:%S UTC") for t in (now, now + timedelta(hours=4)))
    assert dict(zip(states["series"], states["notified"], strict=True)) == {
        "checkout · metric · latency_ms": f"silenced ({silence_id[:8]}): not sent to receivers",
        "search · metric · latency_ms": f"oncall: sent {sent_at}; repeated at {repeat} if still firing "
                                        "(repeat_interval)"}
    # the silenced alert is in no group; search's group was notified of its one alert,
    assert groups.to_dict("records") == [{"receiver": "oncall", "group": '{app="search"}', "firing": 1, "to_clear": 0,
                                          "last_notified": pd.Timestamp(now, tz="UTC"), "firing_notified": 1}]
    assert list(silences["state"]) == ["active"] and list(silences["matchers"]) == ['app="checkout"']
    assert list(sent["receiver"]) == ["oncall"] and list(sent["delivered"]) == [False]


def test_a_silence_is_created_and_expired_from_the_alerts_page_through_the_silences_api(store, tmp_path,
                                                                                         monkeypatch):
    rules = tmp_path / "alerts.toml"
    rules.write_text(RULES)
    monkeypatch.setenv("EVENTIDE_ALERTING__RULES_FILE", str(rules))
    port, token = free_port(), "page-test-token-0123456789"
    api_config = store.model_copy(update={"alerting": store.alerting.model_copy(
        update={"api_port": port, "api_tokens": [token]})})
    monkeypatch.setenv("EVENTIDE_ALERTING__API_PORT", str(port))
    monkeypatch.setenv("EVENTIDE_ALERTING__API_TOKENS", json.dumps([token]))
    server = uvicorn.Config(create_app(api_config), host="127.0.0.1", port=port, log_level="warning",
                            lifespan="off")
    with uvicorn_in_thread(server):
        at = AppTest.from_file(ALERTS_PAGE, default_timeout=30).run()
        at.text_input[0].input('app="checkout"')
        at.text_input[1].input("deploy 42")
        at.button[0].click().run()                   # "Create silence"
        assert not at.exception and not at.error, [e.value for e in at.error]
        [silence] = listed_silences(store)
        assert ([str(m) for m in silence.matchers], silence.comment, silence.created_by) == (
            ['app="checkout"'], "deploy 42", "dashboard")
        at = AppTest.from_file(ALERTS_PAGE, default_timeout=30).run()
        at.button[1].click().run()                   # "Expire now", on the only silence
        assert not at.exception and not at.error, [e.value for e in at.error]
    assert listed_silences(store) == []              # none active or pending any more


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


OVERVIEW_PAGE = str(REPO / "dashboard" / "views" / "overview.py")


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
        client.insert("duplicates", [["events", 0, i, now - timedelta(minutes=i), f"e{i}", app, "d", 1, now]
                                     for i, app in enumerate(["shop", "shop", "search"])],
                      column_names=["source_topic", "source_partition", "source_offset", "kafka_timestamp",
                                    "event_id", "app", "device", "batch_id", "detected_at"])
    at = AppTest.from_file(OVERVIEW_PAGE, default_timeout=30).run()
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["dead letters in range"] == "7" and metrics["alerts firing"] == "0"
    assert 40 <= int(metrics["freshness (now − watermark)"].removesuffix(" s")) < 100
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    assert titles[:2] == ["Events/s per app", "Error + critical log lines/s per app"]
    assert any(t.startswith("Dropped stragglers") for t in titles) and "Dead-letter rate" in titles
    [duplicates] = [json.loads(c.proto.spec) for c in at.get("plotly_chart")
                    if json.loads(c.proto.spec)["layout"]["title"]["text"].startswith("Duplicates per minute")]
    assert sorted((t["name"], sum(_values(t["y"]))) for t in duplicates["data"]) == [("search", 1), ("shop", 2)]
    assert _time_charts_span_the_range(at) == 5


def _data_loss(partition: int, first: int, resumed: int, detected_at: datetime, batch_id: int = 1) -> list:
    """Offsets [first, resumed) Kafka deleted before the job read them, as analytics/data_loss.py writes them."""
    return ["eventide.events", partition, first, resumed, resumed - first, "accept", batch_id, detected_at]


DATA_LOSS_COLUMNS = ["topic", "partition", "from_offset", "to_offset", "skipped_offsets", "query_name", "batch_id",
                     "detected_at"]


def test_overview_shows_records_lost_to_kafka_retention_zero_normally_and_the_ranges_when_some_were(store):
    at = AppTest.from_file(OVERVIEW_PAGE, default_timeout=30).run()
    assert not at.exception
    assert {m.label: m.value for m in at.metric}["records lost to Kafka retention"] == "0"
    assert not any("retention" in e.value for e in at.error) and not at.dataframe

    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    with connect(store) as client:
        client.insert("kafka_data_loss", [
            _data_loss(0, 100, 1_100, now - timedelta(minutes=3)),
            _data_loss(2, 40, 70, now - timedelta(minutes=1), batch_id=2),
            _data_loss(1, 0, 5_000, now - timedelta(hours=2)),                 # before the 15 min range
        ], column_names=DATA_LOSS_COLUMNS)
        # The first batch replayed: it writes its range again (a part of its own), counted once.
        client.insert("kafka_data_loss", [_data_loss(0, 100, 1_100, now - timedelta(minutes=3))],
                      column_names=DATA_LOSS_COLUMNS)
        loss = queries.kafka_data_loss(client, datetime.now(UTC) - timedelta(minutes=15), datetime.now(UTC))
    assert loss.skipped == 1_030
    assert loss.ranges[["partition", "from_offset", "to_offset", "skipped_offsets"]].values.tolist() == [
        [2, 40, 70, 30], [0, 100, 1_100, 1_000]]                                  # newest first

    at = AppTest.from_file(OVERVIEW_PAGE, default_timeout=30).run()
    assert not at.exception
    assert {m.label: m.value for m in at.metric}["records lost to Kafka retention"] == "1,030"
    [warning] = [e.value for e in at.error if "retention" in e.value]
    assert "kafka.events_retention_ms" in warning and "lag" in warning
    [table] = at.dataframe
    assert sorted(table.value["skipped_offsets"].tolist()) == [30, 1_000]


def _log_window(start: datetime, app: str, **levels: int) -> dict:
    row = dict.fromkeys(WINDOW_COLUMNS, 0)
    row.update(window_kind="tumbling", window_length_ms=10_000, window_hop_ms=10_000, window_start=start,
               window_end=start + timedelta(seconds=10), app=app, kind="log", name="app.server", series_tags="",
               event_count=sum(levels.values()), value_sketch=b"", users_sketch=b"", devices_sketch=b"",
               min=None, max=None, mean=None, p50=None, p90=None, p95=None, p99=None, p999=None,
               **{f"level_{lvl}": n for lvl, n in levels.items()})
    return row


def test_logs_page_charts_levels_errors_per_app_and_error_burst_peaks(store):
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    now -= timedelta(seconds=now.second % 10)
    windows = [_log_window(now - timedelta(seconds=10 * i), app, info=20, error=i, critical=1)
               for i in range(1, 4) for app in ("shop", "search")]
    slides = [[300_000, "shop", "log", "app.server", "", now - timedelta(seconds=300 - i), now - timedelta(seconds=i),
               0, i, f"e{i}", 5, 0, 0.0, None, None, None, 5 / 300, 0, 0, 0, 4 + i, 1, 1, now] for i in range(3)]
    with connect(store) as client:
        client.insert("window_aggregates", [[w[c] for c in WINDOW_COLUMNS] + [1, now] for w in windows],
                      column_names=[*WINDOW_COLUMNS, "version", "written_at"])
        client.insert("sliding_windows", slides, column_names=[
            "window_length_ms", "app", "kind", "name", "series_tags", "window_start", "window_end",
            "source_partition", "source_offset", "event_id", "event_count", "value_count", "sum", "min", "max",
            "mean", "rate", "level_debug", "level_info", "level_warning", "level_error", "level_critical",
            "version", "written_at"])
    at = AppTest.from_file(str(REPO / "dashboard" / "views" / "logs.py"), default_timeout=30).run()
    assert not at.exception
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert [s["layout"]["title"]["text"] for s in specs] == [
        "Log lines per 10 s by level", "Error + critical lines per 10 s by app",
        "Error bursts: most error lines in any 300 s"]
    levels = {t["name"]: sum(_values(t["y"])) for t in specs[0]["data"]}
    assert levels == {"debug": 0, "info": 120, "warning": 0, "error": 12, "critical": 6}
    [peak] = specs[2]["data"]
    assert max(_values(peak["y"])) == 7          # 4 + 2 errors + 1 critical in the fullest sliding window
    assert _time_charts_span_the_range(at) == 3


def test_sessions_page_counts_sessions_and_shows_duration_and_size_distributions(store):
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    ended = now - timedelta(minutes=1)
    rows = [[300_000, app, "user", f"u{i}", now - timedelta(minutes=9), ended - timedelta(seconds=i),
             now - timedelta(minutes=6), 1000 * (60 + i), 2 + i, 2 + i, 0, 0, 0, 0, 0, 0, 1, now]
            for i in range(10) for app in ("shop", "search")]
    columns = ["gap_ms", "app", "key_kind", "session_key", "session_start", "session_end", "last_event_time",
               "duration_ms", "event_count", "metric_count", "log_count", "level_debug", "level_info",
               "level_warning", "level_error", "level_critical", "version", "written_at"]
    # Two sessions in progress, a third retired by a newer version (merged or closed): not open.
    started = now - timedelta(minutes=3)
    in_progress = [[300_000, "shop", "user", key, started, last + timedelta(minutes=5), last,
                    int((last - started).total_seconds() * 1000), n, n, 0, 0, 0, 0, 0, 0, is_open, version, now]
                   for key, last, n, is_open, version in (
                       ("ann", now - timedelta(seconds=30), 7, 1, 1), ("bob", now - timedelta(seconds=10), 3, 1, 1),
                       ("cy", now - timedelta(seconds=20), 4, 1, 1), ("cy", now - timedelta(seconds=20), 4, 0, 2))]
    with connect(store) as client:
        client.insert("sessions", rows, column_names=columns)
        client.insert("open_sessions", in_progress, column_names=[*columns[:-2], "is_open", *columns[-2:]])
    at = AppTest.from_file(str(REPO / "dashboard" / "views" / "sessions.py"), default_timeout=30).run()
    assert not at.exception
    assert {m.label: m.value for m in at.metric} == {
        "open now": "2", "sessions ended": "20", "median duration": "64 s", "median events": "6"}
    [open_sessions] = at.dataframe
    assert open_sessions.value[["session_key", "events"]].values.tolist() == [["bob", 3], ["ann", 7]]
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    # No tumbling windows are stored, so buckets fall back to 60 s.
    assert titles == ["Active sessions per 60 s by app", "Sessions ended per 60 s by app", "Session duration (s)",
                      "Events per session"]
    # Active: every ended session from its start to its last event (minutes -9 to -6), then ann's and bob's open
    # sessions from theirs (minute -3) on; cy's retired row counts nowhere.
    active = {t["name"]: _values(t["y"]) for t in json.loads(at.get("plotly_chart")[0].proto.spec)["data"]}
    assert max(active["search"]) == max(active["shop"]) == 10
    # the minutes of shop's open sessions, after its ended ones: both from minute -3 on (the newest minute may hold
    # bob's last event only)
    open_minutes = [v for v in active["shop"] if v != 10]
    assert len(open_minutes) >= 3 and set(open_minutes[:-1]) == {2} and open_minutes[-1] in (1, 2)
    assert _time_charts_span_the_range(at) == 2      # all ended in one minute: one bucket, still 15 min wide


def test_stragglers_page_charts_drops_lateness_and_the_worst_device_clocks(store):
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    with connect(store) as client:
        client.insert("stragglers", [[kind, 60_000, 60_000, "shop", "metric", "latency_ms", "",
                                      now - timedelta(minutes=5), now - timedelta(minutes=4), 0, i, f"e{i}", "d",
                                      now - timedelta(minutes=5), now, 1000 * (i + 1), "windows", 1,
                                      now - timedelta(seconds=30)]
                                     for i, kind in enumerate(["tumbling", "tumbling", "hopping"])],
                      column_names=["window_kind", "window_length_ms", "window_hop_ms", "app", "kind", "name",
                                    "series_tags", "window_start", "window_end", "source_partition",
                                    "source_offset", "event_id", "device", "corrected_event_time", "watermark",
                                    "lateness_ms", "query_name", "batch_id", "detected_at"])
        client.insert("device_clocks", [["shop", f"phone-{d}", b, 10, 0, 0, 1000.0 * d * (b + 1),
                                         now - timedelta(seconds=10 * (1 - b)), now]
                                        for d in range(20) for b in range(2)],
                      column_names=["app", "device", "batch_id", "events", "offset_min_ms", "offset_max_ms",
                                    "offset_avg_ms", "last_received", "recorded_at"])
        client.insert("corrections", [["hopping", 300_000, 60_000, "shop", "metric", "latency_ms", "",
                                       now - timedelta(minutes=5 + w), now - timedelta(minutes=w), 7, 2, 1500,
                                       now - timedelta(seconds=30)] for w in range(3)],
                      column_names=["window_kind", "window_length_ms", "window_hop_ms", "app", "kind", "name",
                                    "series_tags", "window_start", "window_end", "batch_id", "late_events",
                                    "max_lateness_ms", "detected_at"])
    at = AppTest.from_file(str(REPO / "dashboard" / "views" / "stragglers.py"), default_timeout=30).run()
    assert not at.exception
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert [s["layout"]["title"]["text"] for s in specs] == [
        "Dropped per 60 s by window kind", "Lateness behind the watermark (s)",
        "Windows corrected by late events per 60 s", "Clock offset per device (s)", "Worst device clocks (s off)"]
    assert [sum(_values(t["y"])) for t in specs[2]["data"]] == [3]
    assert {t["name"]: sum(_values(t["y"])) for t in specs[0]["data"]} == {"tumbling": 2, "hopping": 1}
    assert list(at.dataframe[0].value["dropped"]) == [2, 1]
    [worst] = specs[4]["data"]
    assert max(_values(worst["x"])) == 38.0 and len(_values(worst["x"])) == 15   # phone-19, 2nd batch: 38 s
    assert _time_charts_span_the_range(at) == 2


def test_explorer_shows_hopping_and_sliding_windows_of_the_series(store):
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    now -= timedelta(seconds=now.second % 60)
    tumbling = [_window(now - timedelta(seconds=10 * i), 10, 5.0) for i in range(1, 3)]
    hopping = [_window(start, 20 * i, 7.0 * i, window_kind="hopping", window_length_ms=300_000, window_hop_ms=60_000,
                       window_end=start + timedelta(minutes=5))
               for i in range(1, 4) for start in [now - timedelta(minutes=5 + i)]]
    slides = [[300_000, "shop", "metric", "latency_ms", "", now - timedelta(seconds=300 - i),
               now - timedelta(seconds=60 - i), 0, i, f"e{i}", 3 + i, 3 + i, 10.0, 1.0, 9.0 + i, 3.0, (3 + i) / 300,
               0, 0, 0, 0, 0, 1, now] for i in range(4)]
    with connect(store) as client:
        client.insert("window_aggregates", [[*r, 1, now] for r in tumbling + hopping],
                      column_names=[*WINDOW_COLUMNS, "version", "written_at"])
        client.insert("sliding_windows", slides, column_names=[
            "window_length_ms", "app", "kind", "name", "series_tags", "window_start", "window_end",
            "source_partition", "source_offset", "event_id", "event_count", "value_count", "sum", "min", "max",
            "mean", "rate", "level_debug", "level_info", "level_warning", "level_error", "level_critical",
            "version", "written_at"])
    at = AppTest.from_file(APP, default_timeout=30)
    at.query_params["kind"] = "hopping"
    at.run()
    assert not at.exception and at.sidebar.selectbox[1].value == "hopping"
    assert at.sidebar.selectbox[2].options == ["300 s every 60 s"]
    p99 = {t["name"]: _values(t["y"]) for t in json.loads(at.get("plotly_chart")[1].proto.spec)["data"]}["p99"]
    assert p99 == [21.0, 14.0, 7.0]                       # each hopping window's own sketch, oldest first
    assert any("3 hopping windows of 300 s every 60 s" in c.value for c in at.caption)
    assert _time_charts_span_the_range(at) == 3

    at.sidebar.selectbox[1].select("sliding").run()
    assert not at.exception and at.query_params["kind"] == "sliding"
    traces = {t["name"]: _values(t["y"]) for t in json.loads(at.get("plotly_chart")[1].proto.spec)["data"]}
    assert traces["max"] == [9.0, 10.0, 11.0, 12.0]
    assert any("4 sliding windows" in c.value for c in at.caption)
    assert _time_charts_span_the_range(at) == 2


def test_device_clock_offsets_equal_the_newest_row_of_each_device_in_any_range(store):
    """The Stragglers page reads per-minute newest offsets (sql/0008) instead of every device_clocks row: whatever
    the range (ends inside a minute, newer rows after it, a device's newest row just outside), the answer is the
    offset of each device's newest row in ``[since, until)``, as ``argMax`` over all rows gives it."""
    t0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    rows = [["shop", f"phone-{d}", b, 1, 0, 0, float(100 * d + b), (t0 + timedelta(seconds=7 * b + d)).replace(
        tzinfo=None), t0.replace(tzinfo=None)] for d in range(3) for b in range(40)]      # every 7 s for ~4.5 min
    columns = ["app", "device", "batch_id", "events", "offset_min_ms", "offset_max_ms", "offset_avg_ms",
               "last_received", "recorded_at"]
    with connect(store) as client:
        # Two inserts: the per-minute table then holds unmerged rows for the same minutes, as in production.
        client.insert("device_clocks", rows[::2], column_names=columns)
        client.insert("device_clocks", rows[1::2], column_names=columns)

    def newest(since: datetime, until: datetime) -> dict[str, float]:
        inside = [r for r in rows if since.replace(tzinfo=None) <= r[7] < until.replace(tzinfo=None)]
        return {d: max((r[7], r[6]) for r in inside if r[1] == d)[1] / 1000 for d in {r[1] for r in inside}}

    ranges = [(t0, t0 + timedelta(hours=1)),                                        # everything, whole minutes
              (t0 + timedelta(seconds=30.5), t0 + timedelta(minutes=10)),            # starts inside a minute
              (t0 + timedelta(seconds=61), t0 + timedelta(seconds=150.25)),          # ends inside one, newer after
              (t0 + timedelta(seconds=125), t0 + timedelta(seconds=135)),            # inside one minute
              (t0 + timedelta(seconds=3), t0 + timedelta(seconds=4))]                # between two rows: nothing
    with connect(store) as client:
        for since, until in ranges:
            df = queries.device_clock_offsets(client, since, until)
            assert dict(zip(df["device"], df["offset_s"], strict=True)) == newest(since, until), (since, until)


def test_the_series_catalog_lists_series_by_events_with_their_tumbling_lengths_and_hopping_windows(store):
    now = datetime.now(UTC).replace(microsecond=0, second=0, tzinfo=None)
    quiet = [_window(now - timedelta(minutes=i), 5, 1.0) for i in range(1, 3)]            # shop: 10 events
    busy = [_window(start, 20, 2.0, app="search", window_kind=kind, window_length_ms=length,   # search: 40, in 2 kinds
                    window_hop_ms=hop, window_end=start + timedelta(milliseconds=length))
            for i, (kind, length, hop) in enumerate([("tumbling", 60_000, 60_000), ("hopping", 300_000, 60_000)])
            for start in [now - timedelta(minutes=5 + i)]]
    with connect(store) as client:
        client.insert("window_aggregates", [[*r, 1, now] for r in quiet + busy],
                      column_names=[*WINDOW_COLUMNS, "version", "written_at"])
        catalog = queries.series_catalog(client)
        assert catalog.lengths_ms == queries.window_lengths_ms(client) == [10_000, 60_000]
    assert [s.app for s in catalog.series] == ["search", "shop"]
    assert {s.app: specs for s, specs in catalog.hopping.items()} == {"search": [(300_000, 60_000)]}


def _consistent_window(start: datetime, values: list[float], users: list[str]) -> list:
    """A 10 s window as the job writes it: its stored percentiles and distinct users read from its own sketches."""
    values_sketch, users_sketch = kll_doubles_sketch(200), hll_sketch(12)
    for v in values:
        values_sketch.update(v)
    for u in users:
        users_sketch.update(u)
    return _window(start, len(values), max(values), value_sketch=values_sketch.serialize(),
                   users_sketch=users_sketch.serialize_compact(), sum=float(sum(values)), min=min(values),
                   mean=sum(values) / len(values), distinct_users=round(users_sketch.get_estimate()),
                   **{col: values_sketch.get_quantile(q, inclusive=True)
                      for col, q in (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999))})


def test_explorer_buckets_of_the_stored_length_are_the_windows_and_coarser_ones_merge_their_sketches(store):
    now = datetime.now(UTC).replace(microsecond=0, second=0, tzinfo=None) - timedelta(minutes=2)
    # Two 10 s windows of one 20 s bucket: the first with small values and users a, b; the second large, b, c.
    first = _consistent_window(now, [1.0, 2.0, 3.0], ["a", "b"])
    second = _consistent_window(now + timedelta(seconds=10), [100.0, 200.0], ["b", "c"])
    with connect(store) as client:
        client.insert("window_aggregates", [[*r, 1, now] for r in (first, second)],
                      column_names=[*WINDOW_COLUMNS, "version", "written_at"])
        series = queries.series_catalog(client).series[0]
        since, until = now - timedelta(minutes=1), now + timedelta(minutes=1)
        catalog = queries.series_catalog(client)
        windows = queries.series_buckets(client, series, 10, since, until, catalog.lengths_ms)
        merged = queries.series_buckets(client, series, 20, since, until, catalog.lengths_ms)
    assert windows["event_count"].tolist() == [3, 2]
    assert windows["p99"].tolist() == [3.0, 200.0]
    assert windows["p50"].tolist() == [2.0, 100.0]
    assert windows["distinct_users"].tolist() == [2, 2]
    assert windows["rate"].tolist() == [0.3, 0.2]
    # One 20 s bucket: counts add, percentiles come from the merged sketch (not an average), users from the union.
    assert merged["event_count"].tolist() == [5]
    assert merged["p50"].tolist() == [3.0]
    assert merged["p99"].tolist() == [200.0]
    assert merged["distinct_users"].tolist() == [3]
    assert merged["rate"].tolist() == [0.25]
    assert not windows["final"].any() and not merged["final"].any()     # no watermark recorded yet
    assert [*windows["window_start"], *merged["window_start"]] == [now, now + timedelta(seconds=10), now]


# Freshness and refresh -------------------------------------------------------------------------------------------
# Every page says how current its data is ("data as of <when the last batch was stored> · N s behind"), inside the
# fragment that refreshes in place, at the interval the sidebar's "Refresh every" picks (default dashboard.refresh_s).

VIEWS = REPO / "dashboard" / "views"
PAGES = ("overview", "explorer", "logs", "sessions", "stragglers", "alerts")
SESSIONS_PAGE = str(VIEWS / "sessions.py")


def _batches_stored(config, recorded_at: datetime, queries=("accept", "windows", "keyed_windows")) -> None:
    from tests.support import dashboard_data as data

    with connect(config) as client:
        data.insert_rows(client, "pipeline_progress", [
            data.progress(recorded_at - timedelta(seconds=30), query_name=q, recorded_at=recorded_at)
            for q in queries])


def _freshness_lines(at: AppTest) -> list[str]:
    return [c.value for c in at.caption if c.value.startswith("data as of")]


def _as_shown(stored: datetime) -> str:
    """``stored`` as a page rendered just now shows it: the time alone on the day it renders, else with its date
    (a test that runs across midnight)."""
    return f"{stored:%H:%M:%S}" if stored.date() == datetime.now(UTC).date() else f"{stored:%Y-%m-%d %H:%M:%S}"


def test_every_page_says_its_data_is_as_of_the_stored_batch_and_how_far_behind(store):
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    stored = now - timedelta(seconds=4)
    _batches_stored(store, stored)
    with connect(store) as client:       # a series, so the explorer gets past "no windows yet" to its charts
        client.insert("window_aggregates", [[*_window(now - timedelta(seconds=10 * now.second // 10), 5, 2.0), 1,
                                             now]], column_names=[*WINDOW_COLUMNS, "version", "written_at"])
    for name in PAGES:
        at = AppTest.from_file(str(VIEWS / f"{name}.py"), default_timeout=30).run()
        assert not at.exception, name
        [line] = _freshness_lines(at)
        assert line.startswith(f"data as of {_as_shown(stored)} UTC · "), (name, line)
        behind = int(line.split(" · ")[1].removesuffix(" s behind"))
        assert 4 <= behind < 60, (name, line)
        assert line.endswith(" · refreshes every 2 s"), (name, line)
        assert not at.warning and not [i for i in at.info if "No batch stored yet" in i.value], name


def test_the_overview_says_its_tumbling_charts_moved_with_the_last_provisional_round(store, monkeypatch):
    from analytics.progress import record_round

    monkeypatch.setenv("EVENTIDE_DASHBOARD__STALE_AFTER_TRIGGERS", "100")   # a slow page run stays "fresh"
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    _batches_stored(store, now - timedelta(seconds=20))
    with connect(store) as client:
        record_round(client, pipeline.PROVISIONAL_WINDOWS, now - timedelta(seconds=2))
    at = AppTest.from_file(str(VIEWS / "overview.py"), default_timeout=30).run()
    assert not at.exception
    [line] = _freshness_lines(at)
    page_age, tumbling, refresh = line.split(" · ")[1:]
    assert 20 <= int(page_age.removesuffix(" s behind")) < 120, line
    assert tumbling.startswith("tumbling windows ") and tumbling.endswith(" s behind"), line
    assert 2 <= int(tumbling.removeprefix("tumbling windows ").removesuffix(" s behind")) < 20, line
    assert refresh == "refreshes every 2 s", line


def test_a_page_before_the_job_stored_any_batch_says_so(store):
    at = AppTest.from_file(SESSIONS_PAGE, default_timeout=30).run()
    assert not at.exception and not _freshness_lines(at)
    assert [i.value for i in at.info if i.value.startswith("No batch stored yet: is the stream job running?")]


def test_a_last_batch_older_than_three_trigger_intervals_is_a_stale_warning(store):
    stored = datetime.now(UTC).replace(microsecond=0, tzinfo=None) - timedelta(minutes=10)
    _batches_stored(store, stored, ("keyed_windows",))
    at = AppTest.from_file(SESSIONS_PAGE, default_timeout=30).run()
    assert not at.exception and not _freshness_lines(at)
    [warning] = [w.value for w in at.warning]
    assert warning.startswith(f"Stale: data as of {_as_shown(stored)} UTC · 10 min behind")
    assert f"no newer batch for over {3 * store.stream.trigger_interval_s:g} s" in warning


@pytest.fixture
def served_on_loopback() -> Iterator[None]:
    """The whole app (``app.py``) as ``eventide dashboard`` serves it: on loopback, where no sign-in is asked."""
    from streamlit import config as streamlit_config

    before = streamlit_config.get_option("server.address")
    streamlit_config.set_option("server.address", "127.0.0.1")
    yield
    streamlit_config.set_option("server.address", before)


def test_the_refresh_interval_is_picked_in_the_sidebar_kept_in_the_url_and_across_pages(store, served_on_loopback):
    _batches_stored(store, datetime.now(UTC).replace(microsecond=0, tzinfo=None))
    at = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=30).run()
    assert not at.exception
    picker = at.sidebar.selectbox(key="url_refresh")
    assert picker.value == "2 s" and at.query_params["refresh"] == "2"           # dashboard.refresh_s
    assert picker.options == ["1 s", "2 s", "5 s", "10 s", "30 s", "off"]
    picker.set_value("10 s").run()
    assert _freshness_lines(at)[0].endswith(" · refreshes every 10 s") and at.query_params["refresh"] == "10"
    at.switch_page("views/sessions.py").run()
    assert at.sidebar.selectbox(key="url_refresh").value == "10 s"              # the session's choice
    assert _freshness_lines(at)[0].endswith(" · refreshes every 10 s")
    at.sidebar.selectbox(key="url_refresh").set_value("off").run()
    assert _freshness_lines(at)[0].endswith(" · refresh off") and at.query_params["refresh"] == "off"


def test_a_link_with_a_refresh_interval_opens_with_it_and_an_unoffered_one_is_ignored(store):
    at = AppTest.from_file(SESSIONS_PAGE, default_timeout=30)
    at.query_params["refresh"] = "30"
    at.run()
    assert at.sidebar.selectbox(key="url_refresh").value == "30 s"
    hostile = AppTest.from_file(SESSIONS_PAGE, default_timeout=30)
    hostile.query_params["refresh"] = "0.001"          # a refresh every millisecond would load the server
    hostile.run()
    assert not hostile.exception and hostile.sidebar.selectbox(key="url_refresh").value == "2 s"
