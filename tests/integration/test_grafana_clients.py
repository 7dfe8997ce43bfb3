"""Grafana and other ClickHouse clients read the local store as they read a ClickHouse server, as its read-only user.

clickhouse-go v2 (the client inside Grafana's ClickHouse data source, in its HTTP mode: every request a POST with the
SQL in the body, ``default_format=Native`` with its protocol revision) runs the plugin's connection sequence, its
schema queries and a time-series query with the plugin's macros expanded; every value it reads equals what
clickhouse-connect reads for the same SQL. As the reader it is refused DDL, writes, table functions that reach the host,
raised settings and the system tables that show the host.
"""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from dashboard import queries
from eventide.config import Config
from store import credentials
from store.client import connect
from store.migrations import apply_migrations
from tests.support.browser import populate
from tests.support.grafana import comparable, expand_macros, go_client
from tests.support.stack import REPO, served_store

DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "eventide.json"

GRAFANA_HELLO = ["SELECT displayName(), version(), revision(), timezone()", "SELECT 1"]
# The data source's schema pickers and query editor (grafana/clickhouse-datasource src/data/CHDatasource.ts,
# CHVariableSupport.tsx).
SCHEMA = [
    "SHOW DATABASES", 'SHOW TABLES FROM "eventide"', 'DESC TABLE "eventide"."window_aggregates"',
    "SELECT name FROM system.databases ORDER BY name",
    "SELECT name FROM system.tables WHERE database = 'eventide' ORDER BY name",
    "SELECT name FROM system.columns WHERE database = 'eventide' AND table = 'sessions' ORDER BY name",
    "SELECT name, type, table FROM system.columns WHERE database IN ('eventide') ORDER BY table, name",
    "SELECT name, is_aggregate, case_insensitive, alias_to, origin FROM system.functions ORDER BY name LIMIT 200",
]
TIME_SERIES = [
    # events/s per app, as the dashboard's Overview: $__timeInterval and $__timeFilter
    "SELECT $__timeInterval(window_start) AS time, app, sum(event_count) / $__interval_s AS events_per_s "
    "FROM window_aggregates FINAL WHERE window_kind = 'tumbling' AND $__timeFilter(window_start) "
    "GROUP BY time, app ORDER BY time, app",
    # the millisecond forms
    "SELECT $__timeInterval_ms(window_start) AS time, max(max) AS worst FROM window_aggregates FINAL "
    "WHERE $__timeFilter_ms(window_start) AND window_end <= $__toTime_ms GROUP BY time ORDER BY time",
]
TYPES = [
    "SELECT toLowCardinality(toString(number % 3)) AS lc, [toLowCardinality('x'), 'y'] AS lcs, "
    "if(number % 2, NULL, number) AS maybe, map('k', number, 'l', number * 2) AS m, toDecimal64(number / 4, 3) AS d, "
    "toUUID('61f0c404-5cb3-11e7-907b-a6006ad3dba0') AS u, toDateTime64('2026-11-29 10:00:00.125', 3, 'UTC') AS t64, "
    "toDateTime('2026-11-29 10:00:00', 'UTC') AS t, toDate('2026-11-29') AS day, 18446744073709551615 AS big, "
    "nan AS n, [[1, 2], [], [3]] :: Array(Array(UInt16)) AS nested, toFixedString('ab', 2) AS fixed, "
    "repeat('long ', 40) AS text, "
    "CAST('b', 'Enum8(\\'a\\' = 1, \\'b\\' = 2)') AS e, toIPv4('10.0.0.1') AS ip, [] :: Array(LowCardinality(String)) "
    "AS none FROM numbers(5)",
    "SELECT number FROM numbers(0)",
]
REFUSED = {
    "CREATE TABLE grafana_made (a UInt8) ENGINE = Memory": "code: 164",
    "INSERT INTO sessions SELECT * FROM sessions": "code: 164",
    "SELECT * FROM file('/etc/passwd', 'LineAsString')": "code: 497",
    "SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')": "code: 497",
    "SELECT 1 SETTINGS max_execution_time = 100000": "code: 452",
    "SELECT 1 SETTINGS readonly = 0": "code: 164",
    "SELECT query FROM system.processes": "code: 497",
    "SELECT name, data_paths FROM system.tables": "code: 497",
    # a column whose Native data the store cannot lay out for the client's revision: a clear error, not bad bytes
    "SELECT uniqState(number) AS state FROM numbers(10)": "code: 48",
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Config]:
    """A store server of its own (its reader has a password of its own) with the demo-like tables of the browser
    tests: ten minutes of two apps."""
    with served_store(tmp_path_factory.mktemp("grafana-store")) as (config, _):
        apply_migrations(config)
        now = populate(config)
        lines = [[now - timedelta(seconds=7 * k), now - timedelta(seconds=7 * k), now, ("shop", "search")[k % 2],
                  ("info", "error")[k % 3 == 0], "app.server", "d", f"u{k}", f"request {k} served", {"route": "/"},
                  f"line-{k}", 0, k] for k in range(40)]
        with connect(config) as client:
            client.insert("logs", lines, column_names=[
                "corrected_event_time", "event_time", "received_time", "app", "level", "name", "device", "user",
                "message", "tags", "event_id", "source_partition", "source_offset"])
        yield config


def _python(config: Config, sql: str) -> tuple[list[str], list[list]]:
    with connect(config, role="reader") as client:
        result = client.query(sql)
        return list(result.column_names), [list(row) for row in result.result_rows]


def _same_as_python(config: Config, results: list[dict]) -> None:
    for result in results:
        assert result["error"] is None, result
        columns, rows = _python(config, result["query"])
        types = result["types"]
        assert result["columns"] == columns, result["query"]
        assert [[comparable(v, t) for v, t in zip(row, types, strict=True)] for row in result["rows"]] == \
            [[comparable(v, t) for v, t in zip(row, types, strict=True)] for row in rows], result["query"]


def test_grafanas_client_connects_as_the_reader_and_reads_the_schema_as_clickhouse_connect_does(store: Config) -> None:
    hello, results = go_client(store, GRAFANA_HELLO + SCHEMA)
    assert hello["ping"] is None and hello["server_version"]["timezone"]
    _same_as_python(store, results)
    tables = {row[0] for row in results[len(GRAFANA_HELLO) + 1]["rows"]}
    assert {"window_aggregates", "sessions", "open_sessions", "logs"} <= tables


def test_a_panel_query_with_the_plugins_macros_reads_the_same_values_as_clickhouse_connect(store: Config) -> None:
    until = datetime.now(UTC)
    queries = [expand_macros(sql, until - timedelta(minutes=15), until, 30) for sql in TIME_SERIES]
    _, results = go_client(store, queries)
    _same_as_python(store, results)
    assert all(result["rows"] for result in results)
    assert {row[1] for row in results[0]["rows"]} == {"shop", "search"}


def test_every_column_type_reads_the_same_through_native_as_through_clickhouse_connect(store: Config) -> None:
    _, results = go_client(store, TYPES)
    _same_as_python(store, results)
    assert len(results[0]["rows"]) == 5 and results[1]["rows"] == []


def test_the_reader_is_refused_ddl_writes_host_access_raised_settings_and_host_system_tables(store: Config) -> None:
    _, results = go_client(store, list(REFUSED))
    for result in results:
        assert result["error"] and REFUSED[result["query"]] in result["error"], result
    _, [count] = go_client(store, ["SELECT count() FROM system.tables WHERE name = 'grafana_made'"], role="writer")
    assert count["rows"] == [[0]]


def test_every_panel_of_the_grafana_dashboard_runs_as_the_reader_and_shows_what_the_pages_show(store: Config) -> None:
    until = datetime.now(UTC).replace(microsecond=0)
    since = until - timedelta(minutes=15)
    panels = json.loads(DASHBOARD.read_text())["panels"]
    sql = [expand_macros(target["rawSql"], since, until, 30) for panel in panels for target in panel["targets"]]
    _, results = go_client(store, sql)
    for panel, result in zip(panels, results, strict=True):
        assert result["error"] is None and result["rows"], (panel["title"], result)
    # Events per second: the numbers of the Overview's own query, bucket by bucket (the last bucket, which the page
    # reads up to the range's end and Grafana through it, aside).
    with connect(store, role="reader") as client:
        page = queries.app_rates(client, since, until, 30, 10_000)
    shown = {(datetime.fromisoformat(t).astimezone(UTC), app): rate for t, app, rate in results[0]["rows"]}
    expected = {(t.to_pydatetime(), app): rate for t, app, rate in page[["t", "app", "events_per_s"]].itertuples(
        index=False)}
    last = max(t for t, _ in expected)
    assert {k: v for k, v in shown.items() if k[0] < last} == {k: v for k, v in expected.items() if k[0] < last}
    assert len(expected) > 20


JS_CLIENT = REPO / "tests" / "integration" / "clickhouse_js" / "read.mjs"


def test_clickhouses_javascript_client_reads_the_same_rows_in_json_formats_as_the_reader(store: Config) -> None:
    creds = credentials.load(store)
    sql = ("SELECT app, name, toString(window_start) AS start, event_count, p99 FROM window_aggregates FINAL "
           "WHERE kind = 'metric' ORDER BY app, window_start LIMIT 50")
    request = {"url": f"http://{store.store.host}:{store.store.port}", "username": creds.reader_user,
               "password": creds.reader_password, "database": store.store.database,
               "queries": [{"query": sql, "format": "JSONEachRow"}, {"query": sql, "format": "JSONCompactEachRow"},
                           {"query": "INSERT INTO sessions SELECT * FROM sessions", "format": "JSON"}]}
    done = subprocess.run(["node", str(JS_CLIENT)], input=json.dumps(request), capture_output=True, text=True,
                          timeout=120, check=True, cwd=JS_CLIENT.parent)
    each_row, compact, insert = [json.loads(line) for line in done.stdout.splitlines()]
    columns, rows = _python(store, sql)

    def plain(row: list) -> list:   # 64-bit integers as JSON numbers or strings, as the client's settings ask
        return [int(v) if isinstance(v, str) and v.isdigit() else v for v in row]

    assert len(rows) == 50
    assert [plain([r[c] for c in columns]) for r in each_row["data"]] == rows
    assert [plain(r) for r in compact["data"]] == rows
    assert "readonly" in insert["error"]


def test_a_protocol_revision_that_is_not_a_number_is_a_clear_client_error(store: Config) -> None:
    creds = credentials.load(store)
    conn = http.client.HTTPConnection(store.store.host, store.store.port, timeout=30)
    auth = base64.b64encode(f"{creds.reader_user}:{creds.reader_password}".encode()).decode()
    conn.request("POST", "/?default_format=Native&client_protocol_version=54460%3BDROP", body=b"SELECT 1",
                 headers={"Authorization": f"Basic {auth}"})
    response = conn.getresponse()
    assert response.status == 400 and b"client_protocol_version must be a number" in response.read()
