"""Retention: every table of the store has the TTL the configuration gives its family, set by the one migration
runner (``store.migrations.apply_migrations``) on the real store server; a changed retention takes effect at the
next run, and running again changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from eventide.config import Config, load_config
from store.client import connect
from store.migrations import KEPT_WHOLE, TTL_TABLES, apply_migrations, apply_retention, current_ttl, ttl_expression
from tests.support.stack import own_database


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
    from tests.support.stack import REPO

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


# The job on a full disk, and records Kafka deleted before the job read them ------------------------------------
def test_given_a_full_disk_then_a_writer_stops_with_disk_full_naming_the_directory(tmp_path):
    from analytics.disk_full import DiskFull, failure_message, stop_on_disk_full

    config = load_config(environ={}, root=str(tmp_path))
    full = config.accepted_events_dir / "_meta"
    full.mkdir(parents=True)
    (full / "0.json").symlink_to("/dev/full")          # every write there: ENOSPC, from the kernel

    def writer(batch, batch_id):
        (full / f"{batch_id}.json").write_text("{}")

    # A failed write() names no file: the message names the directory everything the job writes is under.
    with pytest.raises(DiskFull, match=rf"disk full: no space left in {config.checkpoint_dir} .*No space left on "
                                       rf"device.*micro-batch 0, uncommitted"):
        stop_on_disk_full(config, "accept", writer)(None, 0)
    # Spark's own checkpoint write failing in the JVM: the same one line, naming the checkpoint directory.
    jvm = "java.io.IOException: No space left on device\n\tat org.apache.hadoop.fs..."
    assert failure_message(config, "windows", jvm).startswith(
        f"query windows stopped, disk full: no space left writing its checkpoint under {config.checkpoint_dir}")
    assert failure_message(config, "windows", "boom") == "query windows failed: boom"


def test_given_the_disk_fills_during_accept_then_the_job_stops_and_the_batch_runs_again_whole(spark, kafka, request):
    from tests.support.pipeline import Metric, minute_in_past, produce, rows, run_job
    from tests.support.stack import fresh_stack

    config = fresh_stack(kafka, request.node.name, partitions=1)
    t0 = minute_in_past(30)
    produce(config, [Metric(t0 + 100 * i, float(i)) for i in range(20)])
    meta = config.accepted_events_dir / "_meta"
    meta.mkdir(parents=True)
    (meta / "0.json").symlink_to("/dev/full")           # batch 0's metadata write finds the disk full
    with pytest.raises(RuntimeError) as info:
        run_job(spark, config)
    assert str(info.value).startswith(f"query accept stopped, disk full: no space left in {config.checkpoint_dir} ")
    assert not (config.checkpoint_dir / "accept" / "commits" / "0").exists()     # not committed, not skipped
    assert rows(config, "SELECT count() AS n FROM dedup_state")[0]["n"] == 0

    (meta / "0.json").unlink()                          # space again: restart
    run_job(spark, config)
    assert rows(config, "SELECT sum(accepted) AS n FROM dedup_state FINAL")[0]["n"] == 20
    assert rows(config, "SELECT sum(event_count) AS n FROM window_aggregates FINAL "
                        "WHERE window_kind = 'tumbling' AND window_length_ms = 10000")[0]["n"] == 20


def test_given_kafka_deleted_records_before_the_job_read_them_then_the_gap_is_recorded(spark, kafka, request):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from tests.support.pipeline import Metric, minute_in_past, produce, rows, run_job
    from tests.support.stack import fresh_stack

    config = fresh_stack(kafka, request.node.name, partitions=1)
    t0 = minute_in_past(30)
    produce(config, [Metric(t0 + 100 * i, float(i)) for i in range(10)])        # offsets 0-9: read
    run_job(spark, config)
    produce(config, [Metric(t0 + 100 * i, float(i)) for i in range(10, 20)])   # offsets 10-19
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
    for future in admin.delete_records([TopicPartition(config.kafka.events_topic, 0, 15)]).values():
        assert future.result().low_watermark == 15     # offsets 10-14 gone, as retention would delete them
    run_job(spark, config)
    assert rows(config, "SELECT partition, from_offset, to_offset, skipped_offsets FROM kafka_data_loss FINAL") == [
        {"partition": 0, "from_offset": 10, "to_offset": 15, "skipped_offsets": 5}]
    assert rows(config, "SELECT sum(accepted) AS n FROM dedup_state FINAL")[0]["n"] == 15   # 10 + the 5 left
