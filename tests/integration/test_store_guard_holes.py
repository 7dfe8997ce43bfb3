"""The embedded store against the guard's holes of issue 49, each tried on a real ``python -m store.server`` child as
an attacker holding the reader's (or the writer's) password would: a database name that carries statements, setting
values that try to leave their quotes, refreshable views and ``format()`` data that run outside the request's
settings, writes into the engine's own databases, a format read from a comment, and the data directory's modes.

A sentinel file outside the data directory holds a secret: no answer may ever contain it, and no file may appear
beside it.
"""

from __future__ import annotations

import base64
import http.client
import os
import stat
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventide.config import Config
from store import credentials
from tests.support.stack import served_store

SECRET = "eventide-guard-holes-secret-5f2c"


class Store:
    """A store server child and raw HTTP requests to it."""

    def __init__(self, config: Config, outside: Path) -> None:
        self.config, self.outside = config, outside
        creds = credentials.load(config)
        self.writer = ("default", creds.writer_password)
        self.reader = (creds.reader_user, creds.reader_password)
        self.sentinel = outside / "sentinel.txt"

    def request(self, statement: str, user: tuple[str, str], headers: dict[str, str] | None = None,
                **params: str) -> tuple[int, dict[str, str], str]:
        """POST ``statement`` with URL ``params``: (status, headers, body text)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.config.store.port, timeout=30)
        sent = {"Authorization": "Basic " + base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode(),
                **(headers or {})}
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        try:
            conn.request("POST", "/" + query, body=statement.encode(), headers=sent)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode(errors="replace")
        finally:
            conn.close()

    def sql(self, statement: str, user: tuple[str, str] | None = None, **params: str) -> tuple[int, str]:
        status, _, text = self.request(statement, user or self.writer, **params)
        assert SECRET not in text, (statement, text)
        return status, text

    def outside_files(self) -> set[str]:
        return {p.name for p in self.outside.iterdir()}


def _store(tmp: Path) -> Iterator[Store]:
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "sentinel.txt").write_text(SECRET + "\n")
    with served_store(tmp / "data") as (config, _):
        store = Store(config, outside)
        for statement in ("CREATE DATABASE IF NOT EXISTS sec",
                          "CREATE TABLE IF NOT EXISTS sec.t (x UInt64) ENGINE = MergeTree ORDER BY x",
                          "CREATE TABLE IF NOT EXISTS sec.sink (s String) ENGINE = MergeTree ORDER BY s"):
            assert store.sql(statement)[0] == 200
        yield store
        assert store.outside_files() == {"sentinel.txt"}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    yield from _store(tmp_path_factory.mktemp("guard-holes"))


@pytest.fixture
def own_store(tmp_path: Path) -> Iterator[Store]:
    """A store of its own, for attacks that would break the shared one if they got through."""
    yield from _store(tmp_path)


def _file_sql(store: Store, name: str) -> str:
    return f"INSERT INTO FUNCTION file('{store.outside / name}', 'LineAsString') SELECT 'pwned'"


# ---------------------------------------------------------------------------------- 1. the database name

def test_a_database_name_cannot_carry_statements(store: Store) -> None:
    """``USE `odd\\``;<anything>;--``: a backslash escape in backquotes, then whatever follows ran as further
    statements before ``readonly`` was applied. Once a database name ending in a backtick existed, the reader could
    write host files. Now such a database cannot be created, and such a name is never used."""
    store.sql("CREATE DATABASE IF NOT EXISTS `odd\\``")    # refused now; created by the old code
    payload = f"odd\\`;{_file_sql(store, 'by-param.txt')};--"
    status, headers, text = store.request("SELECT 1", store.reader, database=payload)
    assert (status, headers["x-clickhouse-exception-code"]) == (404, "81"), text
    assert "(UNKNOWN_DATABASE)" in text
    payload = f"odd\\`;{_file_sql(store, 'by-header.txt')};--"
    status, headers, text = store.request("SELECT 1", store.reader, {"X-ClickHouse-Database": payload})
    assert (status, headers["x-clickhouse-exception-code"]) == (404, "81"), text
    assert store.outside_files() == {"sentinel.txt"}
    assert store.sql("SELECT count() FROM system.databases WHERE name LIKE 'odd%'") == (200, "0\n")


@pytest.mark.parametrize("database", ["no_such_database", "a b", "sec;", "sec`", "sec\\", "1sec", "é", "x" * 129])
def test_only_existing_plain_database_names_are_accepted(store: Store, database: str) -> None:
    status, headers, text = store.request("SELECT 1", store.reader, database=database)
    assert (status, headers["x-clickhouse-exception-code"]) == (404, "81"), text
    assert store.sql("SELECT currentDatabase()", store.reader, database="sec") == (200, "sec\n")


@pytest.mark.parametrize("value", ["x\\", "x'", "x\\'; SELECT 1; --", "';" + "INSERT INTO sec.t VALUES (9); --",
                                   "\\\\'; DROP TABLE sec.t; --", "a`b\"c", "line\nbreak"])
def test_a_setting_value_stays_a_value(store: Store, value: str) -> None:
    """URL settings reach chDB as ``SET name = '<value>'``: quotes, backslashes and ``;`` stay inside the value."""
    assert store.sql("SELECT getSetting('log_comment') FORMAT TSVRaw", store.reader, log_comment=value) == (
        200, value + "\n")
    status, text = store.sql("SELECT 1", store.reader, max_threads=f"1{value}")
    assert 400 <= status < 500, text
    assert store.sql("SELECT count() FROM sec.t WHERE x = 9") == (200, "0\n")
    assert store.sql("EXISTS TABLE sec.t") == (200, "1\n")


@pytest.mark.parametrize(("statement", "params"), [
    ("SELECT {d:String}", {}), ("SELECT {d:UInt8}", {"param_d": "not a number"})])
def test_a_missing_or_mistyped_query_parameter_is_the_clients_error(
        store: Store, statement: str, params: dict[str, str]) -> None:
    status, text = store.sql(statement, store.reader, **params)
    assert status == 400, text


def test_a_setting_value_with_a_nul_is_refused(store: Store) -> None:
    status, text = store.sql("SELECT 1", store.reader, log_comment="x\0'; SELECT 2")
    assert status == 400 and "(BAD_ARGUMENTS)" in text, text


# ---------------------------------------------------------------------- 2. background work and format()

def test_a_refreshable_view_is_refused_and_nothing_runs_in_the_background(store: Store) -> None:
    """A refresh ran where the request's settings did not apply: ``format(Values, ...)`` data evaluated as
    expressions read a host file (and anything past ``max_execution_time``)."""
    data = f"(file(\\'{store.sentinel}\\'))"
    for statement in (
            f"CREATE MATERIALIZED VIEW sec.mv REFRESH EVERY 1 SECOND TO sec.sink AS SELECT s FROM "
            f"format(Values, 's String', '{data}')",
            "CREATE MATERIALIZED VIEW sec.mv2 REFRESH AFTER 1 SECOND ENGINE = Memory AS SELECT 1 AS x"):
        status, text = store.sql(statement)
        assert status == 403 and "refreshable materialized view" in text, text
    time.sleep(2.5)     # two refresh periods
    assert store.sql("SELECT count() FROM system.view_refreshes") == (200, "0\n")
    assert store.sql("SELECT count() FROM system.tables WHERE database = 'sec' AND name LIKE 'mv%'") == (200, "0\n")
    assert store.sql("SELECT count() FROM sec.sink") == (200, "0\n")


@pytest.mark.parametrize(("statement", "params"), [
    ("SELECT * FROM format(Values, 's String', {d:String})", {"param_d": "(file('{sentinel}'))"}),
    ("SELECT * FROM format(Values, {d:String})", {"param_d": "(file('{sentinel}'))"}),
    ("SELECT * FROM format({f:String}, 's String', 'x')", {"param_f": "Protobuf"}),
    ("SELECT * FROM format(LineAsString, (SELECT 'x'))", {}),
    ("CREATE VIEW sec.fv AS SELECT * FROM format(Values, 's String', '(1)')", {}),
    ("ALTER TABLE sec.t DELETE WHERE x IN (SELECT number FROM numbers(10))", {}),
])
def test_format_data_and_background_expressions_the_guard_cannot_read_are_refused(
        store: Store, statement: str, params: dict[str, str]) -> None:
    params = {k: v.format(sentinel=store.sentinel) for k, v in params.items()}
    status, text = store.sql(statement, **params)
    assert status == 403 and "(ACCESS_DENIED)" in text, text


# ---------------------------------------------------------------------- 3. the engine's own databases

@pytest.mark.parametrize("statement", [
    "DROP DATABASE system", "DROP TABLE system.one", "TRUNCATE TABLE system.one", "RENAME TABLE system.one TO sec.one",
    "CREATE TABLE system.x (a UInt8) ENGINE = Memory", "DROP DATABASE INFORMATION_SCHEMA", "DROP DATABASE sec",
    "DETACH TABLE system.one", "OPTIMIZE TABLE system.one", "ALTER TABLE system.one ADD COLUMN y UInt8",
])
def test_the_engines_own_databases_and_the_data_cannot_be_dropped(own_store: Store, statement: str) -> None:
    """``DROP DATABASE system`` was accepted and broke every later request, the guard's own parse included."""
    status, text = own_store.sql(statement)
    assert status == 403 and "(ACCESS_DENIED)" in text, text
    assert own_store.sql("SELECT count() FROM system.one") == (200, "1\n")
    assert own_store.sql("SELECT count() FROM system.tables WHERE database = 'system' AND name = 'one'") \
        == (200, "1\n")
    assert own_store.sql("EXISTS TABLE sec.t") == (200, "1\n")


@pytest.mark.parametrize("database", ["system", "INFORMATION_SCHEMA", "information_schema"])
def test_unqualified_writes_in_the_engines_own_databases_are_refused(store: Store, database: str) -> None:
    status, text = store.sql("CREATE TABLE planted (a UInt8) ENGINE = Memory", database=database)
    assert status == 403 and "(READONLY)" in text, text
    status, text = store.sql("INSERT INTO one SELECT 0", database=database)   # (only system has a table one)
    assert (status, "(READONLY)" in text) == (403, True) if database == "system" else status == 404, text
    assert store.sql("SELECT count() FROM system.tables WHERE name = 'planted'") == (200, "0\n")
    assert store.sql("SELECT count() FROM system.one") == (200, "1\n")


def test_the_writer_still_runs_what_the_product_sends(store: Store) -> None:
    for statement in ("CREATE DATABASE IF NOT EXISTS sec2", "CREATE TABLE IF NOT EXISTS sec2.w (x UInt64, "
                      "t DateTime) ENGINE = ReplacingMergeTree ORDER BY x",
                      "ALTER TABLE sec2.w ADD COLUMN IF NOT EXISTS y UInt64 AFTER x, MODIFY ORDER BY (x, y)",
                      "ALTER TABLE sec2.w ADD INDEX IF NOT EXISTS ti t TYPE minmax GRANULARITY 1",
                      "ALTER TABLE sec2.w MATERIALIZE INDEX ti", "ALTER TABLE sec2.w MODIFY TTL t + toIntervalDay(30)",
                      "CREATE VIEW IF NOT EXISTS sec2.v AS SELECT x FROM sec2.w",
                      "CREATE OR REPLACE VIEW sec2.v AS SELECT x, y FROM sec2.w",
                      "CREATE MATERIALIZED VIEW IF NOT EXISTS sec2.mv TO sec.t AS SELECT x FROM sec2.w",
                      "INSERT INTO sec2.w (x, t) SELECT number, now() FROM numbers(3)",
                      "OPTIMIZE TABLE sec2.w FINAL",
                      "ALTER TABLE sec2.w DELETE WHERE x = 2 SETTINGS mutations_sync = 1"):
        assert store.sql(statement) == (200, ""), statement
    assert store.sql("SELECT count() FROM sec2.v") == (200, "2\n")


def test_an_inserts_comments_stay_comments(store: Store) -> None:
    """The insert run is the statement checked, FROM INFILE added: a comment ending its target or its SETTINGS
    swallowed the FROM INFILE and FORMAT the server appends."""
    for n, head in enumerate(("INSERT INTO sec.t -- c\nFORMAT CSV", "INSERT INTO sec.t # c\nFORMAT CSV",
                              "INSERT INTO sec.t SETTINGS max_threads = 1 -- c\nFORMAT CSV")):
        assert store.sql(f"{head}\n{7000 + n}\n") == (200, ""), head
    assert store.sql("SELECT groupArray(x) FROM (SELECT x FROM sec.t WHERE x >= 7000 ORDER BY x)") \
        == (200, "[7000,7001,7002]\n")


# --------------------------------------------------------------------------------------- 9. formats

def test_the_format_is_the_parsers_not_a_comments(store: Store) -> None:
    """``-- FORMAT <name>`` counted as the statement's format: a Python-only format answered 500 with a traceback
    logged per request."""
    log = store.config.data_dir / "store.log"
    before = log.read_text(errors="replace").count("Traceback")
    for _ in range(25):
        for comment in ("-- FORMAT DataFrame", "-- FORMAT Protobuf", "/* FORMAT ArrowTable */"):
            status, headers, text = store.request(f"SELECT 1 {comment}", store.reader)
            assert (status, text) == (200, "1\n"), text
            assert headers.get("x-clickhouse-format") == "TabSeparated"
    status, text = store.sql("SELECT 1 FORMAT DataFrame", store.reader)
    assert 400 <= status < 500 and "(UNKNOWN_FORMAT)" in text, text
    assert store.sql("SELECT 1 FORMAT JSONEachRow", store.reader) == (200, '{"1":1}\n')
    time.sleep(0.2)
    assert log.read_text(errors="replace").count("Traceback") == before


# ------------------------------------------------------------------------------------ 12. file modes

def test_the_data_directory_and_its_files_are_private(store: Store) -> None:
    assert store.sql("INSERT INTO sec.t SELECT number FROM numbers(10)") == (200, "")
    data = store.config.store_data_dir
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    parts = [p for p in data.rglob("*") if p.is_file() and p.parent.name.startswith("all_")]
    assert parts, "no part file found"
    for path in parts:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (path, oct(path.stat().st_mode))
    for path in data.rglob("*"):
        if path.is_dir() and not path.is_symlink():
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (path, oct(path.stat().st_mode))
    assert os.access(data, os.R_OK)
