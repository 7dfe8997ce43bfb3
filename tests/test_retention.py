"""Retention: every table of the store has the TTL the configuration gives its family, set by the one migration
runner (``store.migrations.apply_migrations``) on the real store server; a changed retention takes effect at the
next run, and running again changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from eventide.config import Config, load_config
from store.client import connect
from store.migrations import KEPT_WHOLE, TTL_TABLES, apply_migrations, apply_retention, current_ttl, ttl_expression
from tests.conftest import own_database


def _ttls(config: Config) -> dict[str, str | None]:
    """Every table of the database (views excluded) and its TTL expression as ClickHouse reports it."""
    with connect(config) as client:
        tables = [r[0] for r in client.query(
            "SELECT name FROM system.tables WHERE database = {d:String} AND engine LIKE '%MergeTree'",
            parameters={"d": config.store.database}).result_rows]
        return {t: current_ttl(client, config.store.database, t) for t in tables}


@pytest.fixture
def configured(tmp_path, store_url):
    """A config on the test session's store server: database and retention as given."""
    def make(database: str, **retention: float) -> Config:
        return load_config(environ={}, root=str(tmp_path), store={"url": store_url, "database": database},
                           retention=retention)
    return make


def test_given_fresh_migrations_then_every_table_has_its_familys_configured_ttl(configured):
    config = configured(own_database("ret"), window_results_days=120, keyed_windows_days=20, rejected_days=10,
                        progress_days=7, alerts_days=60, clocks_days=3)
    apply_migrations(config)
    ttls = _ttls(config)
    assert set(ttls) - set(KEPT_WHOLE) <= set(TTL_TABLES)          # no table of sql/ forgotten by the map
    for table in set(ttls) - set(KEPT_WHOLE):
        family, column = TTL_TABLES[table]
        days = getattr(config.retention, f"{family}_days")
        assert ttls[table] == f"toDateTime({column}) + toIntervalDay({int(days)})", table
    for table in KEPT_WHOLE:
        assert ttls.get(table) is None, f"{table} is kept whole: {KEPT_WHOLE[table]}"
    # The families as documented: e.g. window results 120 days, clocks 3 days.
    assert ttls["window_aggregates"] == "toDateTime(window_start) + toIntervalDay(120)"
    assert ttls["device_clocks"] == "toDateTime(last_received) + toIntervalDay(3)"
    assert ttls["device_clocks_per_minute"] == "toDateTime(minute) + toIntervalDay(3)"
    assert ttls["dead_letters"] == "toDateTime(kafka_timestamp) + toIntervalDay(10)"


def test_given_a_changed_retention_then_the_next_run_changes_the_ttl_and_a_repeat_changes_nothing(configured):
    database = own_database("ret")
    assert apply_migrations(configured(database)) != []
    default = _ttls(configured(database))
    assert default["window_aggregates"] == "toDateTime(window_start) + toIntervalDay(90)"   # the default

    changed = configured(database, window_results_days=0.25, clocks_days=45)
    assert apply_migrations(changed) == []                     # no file applied again
    after = _ttls(changed)
    assert after["window_aggregates"] == "toDateTime(window_start) + toIntervalSecond(21600)"   # 6 hours
    assert after["corrections"] == "toDateTime(window_start) + toIntervalSecond(21600)"
    assert after["device_clocks"] == "toDateTime(last_received) + toIntervalDay(45)"
    assert {t: v for t, v in after.items() if t not in {"window_aggregates", "corrections", "device_clocks",
                                                         "device_clocks_per_minute"}} == \
           {t: v for t, v in default.items() if t not in {"window_aggregates", "corrections", "device_clocks",
                                                           "device_clocks_per_minute"}}

    # Idempotent: the same config again alters nothing (no ALTER, so no TTL re-materialized).
    with connect(changed) as client:
        assert apply_retention(changed, client) == []
    assert apply_migrations(changed) == [] and _ttls(changed) == after


def test_given_rows_past_their_retention_then_a_merge_deletes_them_and_keeps_recent_ones(configured):
    config = configured(own_database("ret"), rejected_days=1)
    apply_migrations(config)
    with connect(config) as client:
        now = datetime.now(UTC)
        client.insert("dead_letters", [["t", 0, 1, now - timedelta(days=2), "old", "", 0, now],
                                       ["t", 0, 2, now - timedelta(hours=1), "recent", "", 0, now]],
                      column_names=["source_topic", "source_partition", "source_offset", "kafka_timestamp",
                                    "reason", "raw", "raw_bytes", "detected_at"])
        client.command("OPTIMIZE TABLE dead_letters FINAL")
        reasons = [r[0] for r in client.query("SELECT reason FROM dead_letters ORDER BY source_offset").result_rows]
    assert reasons == ["recent"]


def test_ttl_expression_counts_whole_days_as_days_and_fractions_as_seconds(tmp_path):
    retention = load_config(environ={}, root=str(tmp_path), retention={"clocks_days": 1.5}).retention
    assert ttl_expression(retention, "clocks", "minute") == "toDateTime(minute) + toIntervalSecond(129600)"
    assert ttl_expression(retention, "window_results", "window_start") == \
        "toDateTime(window_start) + toIntervalDay(90)"


def test_given_a_retention_shorter_than_a_day_then_the_dashboard_range_cannot_ask_for_more(
        tmp_path, monkeypatch, store_url):
    from streamlit.testing.v1 import AppTest

    from eventide.config import to_environ
    from tests.conftest import REPO

    config = load_config(environ={}, root=str(tmp_path), store={"url": store_url, "database": own_database("ret")},
                         retention={"rejected_days": 0.25})            # 6 hours: the shortest family
    apply_migrations(config)
    for key, value in to_environ(config).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("EVENTIDE_CONFIG", raising=False)
    at = AppTest.from_file(str(REPO / "dashboard" / "views" / "alerts.py"), default_timeout=30)
    at.query_params["minutes"] = "1440"                                   # a shared link asking for a whole day
    at.run()
    assert not at.exception
    slider = at.sidebar.slider[0]
    assert slider.max == 360 and slider.value == 360 and at.query_params["minutes"] == "360"
    assert any("Ranges up to 360 min" in c.value and "0.25 days" in c.value for c in at.sidebar.caption)
