"""The store's statement guard (store/server/guard/) against real chDB in process: every way SQL reaches the host,
the network or another request's state is refused with a named reason, and every statement the project itself
sends (migrations, dashboard, alerting, range queries, clickhouse-connect's own) is allowed for its role."""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import chdb
import pytest

import alerting.dispatch
import alerting.evaluator
import alerting.silences
import dashboard.queries
import store.log_query
import store.pipeline
import store.range_query
from alerting.rules import AlertRule, LogSearch
from eventide.config import Config, SeriesSelector
from store.log_query import LogQuery
from store.migrations import _LEDGER, TTL_TABLES, migration_files, statements, ttl_expression
from store.range_query import SeriesKey
from store.server.guard import (
    ENFORCED_SETTINGS,
    Refused,
    Verdict,
    check,
    check_format,
    check_settings,
)

CAPS = {"max_execution_time": 60, "max_memory_usage": 4_000_000_000, "max_result_bytes": 1_000_000_000}


@pytest.fixture(scope="module")
def parse() -> Iterator[Callable[[str], str]]:
    """Runs SQL on a real chDB session and returns its TabSeparatedRaw text, as the server's pooled handles do."""
    conn = chdb.connect(":memory:")

    def run(sql: str) -> str:
        return conn.query(sql, "TabSeparatedRaw").bytes().decode("utf-8", "replace")

    yield run
    conn.close()


def refused(statement: str, parse: Callable[[str], str], role: str = "writer", **kwargs: Any) -> Refused:
    with pytest.raises(Refused) as caught:
        check(statement, role=role, parse=parse, caps=CAPS, **kwargs)  # type: ignore[arg-type]
    return caught.value


# --- attacks ----------------------------------------------------------------------------------------------------

HOST_ATTACKS = [
    # (statement, what the refusal names)
    ("SELECT * FROM file('/etc/hostname', 'LineAsString')", "table function file is not allowed: it reaches the host"),
    ("SELECT * FROM FiLe('/etc/hostname', 'LineAsString')", "table function FiLe is not allowed: it reaches the host"),
    ("SELECT /* file */ * FROM /* x */ file /* y */ ('/etc/hostname')", "table function file is not allowed"),
    ("SELECT * FROM (SELECT * FROM (SELECT * FROM file('/etc/passwd')))", "table function file is not allowed"),
    ("WITH a AS (SELECT * FROM url('http://127.0.0.1:1/')) SELECT * FROM a", "table function url is not allowed"),
    ("SELECT 1 UNION ALL SELECT count() FROM s3('http://x/y.csv')", "table function s3 is not allowed"),
    ("SELECT * FROM numbers(1) AS n JOIN remote('127.0.0.1', system.one) AS r ON 1",
     "table function remote is not allowed"),
    ("SELECT * FROM view(SELECT * FROM url('http://x'))", "table function url is not allowed"),
    ("SELECT * FROM executable('id', 'TSV', 'x String')", "table function executable is not allowed"),
    ("SELECT * FROM Python(secret)", "table function Python is not allowed"),
    ("SELECT * FROM python(secret)", "table function python is not allowed"),
    ("SELECT * FROM sqlite('/etc/db.sqlite', 't')", "table function sqlite is not allowed"),
    ("SELECT * FROM mysql('h:3306', 'd', 't', 'u', 'p')", "table function mysql is not allowed"),
    ("SELECT * FROM postgresql('h:5432', 'd', 't', 'u', 'p')", "table function postgresql is not allowed"),
    ("SELECT * FROM hdfs('hdfs://h/x', 'TSV')", "table function hdfs is not allowed"),
    ("SELECT file('/etc/hostname')", "function file is not allowed: it reads a host file"),
    ("SELECT 'x' IN file('/etc/hostname')", "function file is not allowed: it reads a host file"),
    ("SELECT catboostEvaluate('/m.bin', 1)", "function catboostEvaluate is not allowed"),
    ("SELECT aiGenerate('tell me')", "function aiGenerate is not allowed: it calls a network service"),
    ("SELECT 'x' INTO OUTFILE '/tmp/eventide-guard-test'", "INTO OUTFILE is not allowed"),
    ("SELECT 'x' INTO OUTFILE '/tmp/eventide-guard-test' APPEND", "INTO OUTFILE is not allowed"),
    ("INSERT INTO FUNCTION file('/tmp/x.pth', 'LineAsString') SELECT 'import os'",
     "INSERT INTO FUNCTION is not allowed"),
    ("INSERT INTO TABLE FUNCTION url('http://x', 'CSV', 'a String') VALUES ('a')",
     "INSERT INTO FUNCTION is not allowed"),
    ("INSERT INTO t FROM INFILE '/etc/passwd' FORMAT LineAsString", "FROM INFILE is not allowed"),
    ("INSERT INTO t SELECT * FROM file('/etc/passwd', 'LineAsString')", "table function file is not allowed"),
    ("CREATE TABLE t AS file('/etc/passwd', 'LineAsString')", "table function file is not allowed"),
    ("CREATE TABLE t (s String) ENGINE = File(LineAsString)", "table engine File is not allowed"),
    ("CREATE TABLE t (s String) ENGINE = URL('http://x', CSV)", "table engine URL is not allowed"),
    ("CREATE TABLE t (s String) ENGINE = Executable('id', TSV)", "table engine Executable is not allowed"),
    ("CREATE TABLE t (s String) ENGINE = Distributed(c, d, t)", "table engine Distributed is not allowed"),
    ("CREATE TABLE t (s String DEFAULT file('/etc/passwd')) ENGINE = Memory", "function file is not allowed"),
    ("CREATE TABLE t (x Int8) ENGINE = MergeTree ORDER BY x SETTINGS disk = disk(type = local, path = '/tmp/')",
     "table setting disk is not allowed"),
    ("ALTER TABLE t MODIFY SETTING storage_policy = 'x'", "table setting storage_policy is not allowed"),
    ("CREATE DATABASE d ENGINE = Filesystem('/')", "database engine Filesystem is not allowed"),
    ("CREATE DATABASE d ENGINE = SQLite('/etc/x.db')", "database engine SQLite is not allowed"),
    ("CREATE VIEW v AS SELECT * FROM file('/etc/passwd', 'LineAsString')", "table function file is not allowed"),
    ("CREATE MATERIALIZED VIEW mv TO t AS SELECT * FROM url('http://x', 'CSV', 'a String')",
     "table function url is not allowed"),
    ("CREATE MATERIALIZED VIEW mv ENGINE = File(TSV) AS SELECT 1", "table engine File is not allowed"),
    ("CREATE DICTIONARY d (k UInt64, v String) PRIMARY KEY k SOURCE(FILE(path '/etc/passwd' format 'TSV')) "
     "LAYOUT(FLAT()) LIFETIME(0)", "CREATE DICTIONARY is not allowed"),
    ("ATTACH TABLE t FROM '/var/lib/x' (x Int8) ENGINE = MergeTree ORDER BY x", "ATTACH is not allowed"),
    ("ALTER TABLE t FREEZE", "ALTER TABLE FREEZE ALL is not allowed"),
    ("ALTER TABLE t FETCH PARTITION 1 FROM '/zk/path'", "ALTER TABLE FETCH PARTITION is not allowed"),
    ("ALTER TABLE t MOVE PARTITION 1 TO DISK 'd'", "ALTER TABLE MOVE PARTITION is not allowed"),
    ("BACKUP TABLE t TO Disk('default', 'b.zip')", "BACKUP/RESTORE is not allowed"),
    ("RESTORE TABLE t FROM File('/tmp/b.zip')", "BACKUP/RESTORE is not allowed"),
    ("SYSTEM FLUSH LOGS", "SYSTEM is not allowed"),
    ("SYSTEM DROP DNS CACHE", "SYSTEM is not allowed"),
    ("KILL QUERY WHERE 1", "KILL is not allowed"),
    ("GRANT ALL ON *.* TO default", "GrantQuery is not allowed"),
    ("CREATE USER u IDENTIFIED BY 'p'", "is not allowed"),
    ("CREATE FUNCTION f AS x -> x", "CREATE FUNCTION is not allowed"),
    ("DETACH TABLE t", "DETACH is not allowed"),
    ("BEGIN TRANSACTION", "is not allowed"),
    ("SELECT * FROM format(Protobuf, 'x String', '')", "format Protobuf is not allowed: it reads a schema file"),
    ("SELECT 1 FORMAT Protobuf", "format Protobuf is not allowed: it reads a schema file"),
    ("INSERT INTO t FORMAT CapnProto", "format CapnProto is not allowed"),
    ("SELECT 1 SETTINGS format_schema = '/etc/x.proto'", "setting format_schema may not be changed"),
    ("SELECT 1 SETTINGS format_template_row = '/etc/passwd'", "setting format_template_row may not be changed"),
    ("SELECT 1 SETTINGS output_format_schema = '/tmp/x.proto'", "setting output_format_schema may not be changed"),
    ("SELECT 1 SETTINGS additional_table_filters = {'t': 'file(\\'/etc/passwd\\') != \\'\\''}",
     "setting additional_table_filters may not be changed"),
    ("SELECT 1 SETTINGS input_format_values_interpret_expressions = 1",
     "setting input_format_values_interpret_expressions may not be changed"),
    ("SELECT 1 SETTINGS allow_python_table_function = 1", "setting allow_python_table_function may not be changed"),
    ("SELECT 1 SETTINGS dialect = 'prql'", "setting dialect may not be changed"),
]


@pytest.mark.parametrize(("statement", "named"), HOST_ATTACKS)
def test_given_sql_that_reaches_the_host_then_even_the_writer_is_refused_with_the_reason(
        parse: Callable[[str], str], statement: str, named: str) -> None:
    error = refused(statement, parse, role="writer")
    assert (error.code, error.name, error.http_status) == (497, "ACCESS_DENIED", 403), error
    assert named in error.message, error.message


STATE_ATTACKS = [
    ("SELECT 1; USE system", 62, "Multi-statements are not allowed"),
    ("SELECT 1;\nUSE system;", 62, "Multi-statements are not allowed"),
    ("SELECT 1; SELECT * FROM file('/etc/passwd')", 62, "Multi-statements are not allowed"),
    ("SELECT 1 -- x\n; DROP TABLE t", 62, "Multi-statements are not allowed"),
    ("DESCRIBE TABLE t; DROP TABLE t", 62, "Multi-statements are not allowed"),
    ("EXPLAIN AST SELECT 1; USE system", 62, "Multi-statements are not allowed"),
    ("/* x */ USE other", 497, "USE is not allowed"),
    ("use system", 497, "USE is not allowed"),
    ("-- c\nSET readonly = 1", 497, "SET is not allowed"),
    ("SET max_execution_time = 0", 497, "SET is not allowed"),
    ("CREATE TEMPORARY TABLE t (x Int8)", 497, "temporary tables are not allowed"),
    ("CREATE TEMPORARY TABLE t AS SELECT 1", 497, "temporary tables are not allowed"),
    ("SELECT 1 SETTINGS readonly = 0", 164, "Cannot modify 'readonly' setting"),
    ("SELECT 1 SETTINGS readonly = 2", 164, "Cannot modify 'readonly' setting"),
    ("INSERT INTO t SETTINGS readonly = 0 FORMAT Native", 164, "Cannot modify 'readonly' setting"),
]


@pytest.mark.parametrize(("statement", "code", "named"), STATE_ATTACKS)
def test_given_sql_that_would_change_the_pooled_connection_then_it_is_refused(
        parse: Callable[[str], str], statement: str, code: int, named: str) -> None:
    for role in ("reader", "writer"):
        error = refused(statement, parse, role=role)
        assert (error.code, named in error.message) == (code, True), error


@pytest.mark.parametrize("statement", [
    "INSERT INTO eventide.window_aggregates (app) FORMAT Native",
    "INSERT INTO t SELECT 1",
    "CREATE TABLE t (x Int8) ENGINE = Memory",
    "DROP TABLE eventide.window_aggregates",
    "TRUNCATE TABLE t",
    "ALTER TABLE t DELETE WHERE 1",
    "DELETE FROM t WHERE 1",
    "OPTIMIZE TABLE t FINAL",
    "RENAME TABLE a TO b",
    "EXPLAIN PIPELINE INSERT INTO t SELECT 1",
])
def test_given_the_reader_credential_when_it_writes_then_it_is_refused_as_readonly(
        parse: Callable[[str], str], statement: str) -> None:
    error = refused(statement, parse, role="reader")
    assert (error.code, error.name, error.http_status) == (164, "READONLY", 403)
    assert "readonly mode" in error.message
    if statement.split()[0] in ("DROP", "TRUNCATE", "DELETE", "RENAME"):
        assert refused(statement, parse, role="writer").code == 497   # the product never sends these
    else:
        check(statement, role="writer", parse=parse)   # the writer may


def test_given_settings_above_the_caps_then_they_are_refused_and_below_them_they_are_returned(
        parse: Callable[[str], str]) -> None:
    for statement in ("SELECT 1 SETTINGS max_execution_time = 0",        # 0 is unlimited: above every cap
                      "SELECT 1 SETTINGS max_execution_time = 61",
                      "SELECT 1 SETTINGS max_execution_time = '100'",
                      "SELECT 1 SETTINGS max_memory_usage = 0",
                      "SELECT * FROM (SELECT 1 SETTINGS max_result_bytes = 0)",
                      "CREATE VIEW v AS SELECT 1 SETTINGS max_execution_time = 0",
                      "SELECT 1 SETTINGS max_execution_time = 'inf'",
                      "SELECT 1 SETTINGS max_execution_time = {t:UInt64}"):
        error = refused(statement, parse)
        assert error.code in (452, 497), (statement, error)
        assert "max_" in error.message
    verdict = check("SELECT 1 SETTINGS max_execution_time = 30, max_threads = 2, max_memory_usage = '1000000'",
                    role="reader", parse=parse, caps=CAPS)
    assert verdict.settings == {"max_execution_time": 30, "max_threads": 2, "max_memory_usage": "1000000"}


def test_given_url_parameters_then_check_settings_and_check_format_apply_the_same_rules() -> None:
    check_settings({"max_execution_time": "30", "max_threads": "4", "database": "eventide"}, CAPS)
    for settings, code in (({"max_execution_time": "0"}, 452), ({"readonly": "0"}, 164),
                           ({"format_schema": "/etc/x"}, 497), ({"dialect": "kusto"}, 497),
                           ({"input_format_values_deduce_templates_of_expressions": "1"}, 497)):
        with pytest.raises(Refused) as caught:
            check_settings(settings, CAPS)
        assert caught.value.code == code, settings
    assert check_format("JSONEachRow") == "JSONEachRow"
    assert check_format("tsv") == "tsv"
    for name, code in (("Protobuf", 497), ("AvroConfluent", 497), ("NoSuchFormat", 73)):
        with pytest.raises(Refused) as caught:
            check_format(name)
        assert caught.value.code == code


def test_given_data_inside_the_statement_then_it_is_refused_for_a_second_statement_could_follow_it(
        parse: Callable[[str], str]) -> None:
    """chDB runs a text as a script: Values data ends at a `;` and the rest runs as the next statement, which no
    parse of the INSERT sees. The data belongs in the request body, after the statement."""
    parse("CREATE TABLE IF NOT EXISTS guard_smuggled (s String) ENGINE = Memory")
    parse("INSERT INTO guard_smuggled VALUES ('b'); DROP TABLE guard_smuggled")
    assert "guard_smuggled" not in parse("SHOW TABLES")   # what the guard has to stop
    for statement in ("INSERT INTO t VALUES ('b'); DROP TABLE u", "INSERT INTO t (s) VALUES ('ok')",
                      "INSERT INTO t FORMAT CSV 1,2"):
        error = refused(statement, parse, role="writer")
        assert (error.code, error.http_status) == (36, 400), error
        assert "request body" in error.message
        assert refused(statement, parse, role="reader").code == 164
    assert "INSERT INTO FUNCTION" in refused("INSERT INTO FUNCTION file('/tmp/x') VALUES (1)", parse).message
    verdict = check("INSERT INTO t (s) VALUES", role="writer", parse=parse)   # the statement part: allowed
    assert (verdict.insert_table, verdict.format, verdict.expects_data) == ("t", "Values", True)


def test_given_values_data_then_the_enforced_settings_stop_its_expressions_from_reading_files(
        parse: Callable[[str], str]) -> None:
    """The Values format evaluates expressions in its data, which is not in the statement's AST:
    ENFORCED_SETTINGS, which the server adds to every query, stop them."""
    parse("CREATE TABLE IF NOT EXISTS guard_values (s String) ENGINE = Memory")
    enforced = ", ".join(f"{name} = {value}" for name, value in ENFORCED_SETTINGS.items())
    with pytest.raises(Exception, match="SUPPORT_IS_DISABLED"):
        parse(f"INSERT INTO guard_values SETTINGS {enforced} VALUES ('ok'), (file('/etc/hostname'))")
    with pytest.raises(Exception, match="SUPPORT_IS_DISABLED"):
        parse(f"SELECT * FROM format(Values, 's String', '(file(\\'/etc/hostname\\'))') SETTINGS {enforced}")
    assert check("SELECT * FROM format(Values, 's String', '(1)')", role="reader", parse=parse).kind == "select"
    assert parse("SELECT count() FROM guard_values").strip() == "0"


def test_given_a_name_with_a_line_break_when_the_explain_lines_are_read_then_nothing_is_smuggled(
        parse: Callable[[str], str]) -> None:
    """DESCRIBE/EXISTS/SHOW CREATE are read from EXPLAIN AST lines; a quoted name may hold a line break that looks
    like a node, which can only make the statement refused."""
    error = refused("DESCRIBE TABLE `a\n Function file`", parse, role="reader")
    assert error.code == 497
    assert refused("DESC file('/etc/passwd', 'LineAsString')", parse, role="reader").code == 497
    assert refused("DESCRIBE (SELECT * FROM file('/etc/passwd'))", parse, role="reader").code == 497
    assert "INTO OUTFILE" in refused("SHOW CREATE TABLE t INTO OUTFILE '/tmp/x'", parse, role="reader").message


def test_given_quotes_and_backslashes_then_the_statement_checked_is_the_one_sent(parse: Callable[[str], str]) -> None:
    """The statement reaches the parser inside a string literal: no text can close that literal early."""
    verdict = check("SELECT 'it''s', 'a\\'b\\\\', '\\\\', \"c\"\"d\" FROM system.one", role="reader", parse=parse)
    assert verdict.kind == "select"
    for breakout in ("x') , file('/etc/passwd') --", "\\') FROM file('/etc/passwd') --",
                     "1'); SELECT * FROM file('/etc/passwd'); --"):
        assert refused(f"SELECT {breakout}", parse, role="reader").code in (62, 497)
    assert refused("SELECT 1 \0 SELECT 2", parse, role="reader").code == 62
    assert refused("SELECT '\udc80'", parse, role="reader").code == 36
    assert refused("   \n ", parse, role="reader").code == 62


def test_given_bytes_that_are_not_utf8_in_a_literal_then_a_strictly_decoding_parse_still_answers(
        parse: Callable[[str], str]) -> None:
    """The server's parse decodes chDB's answer strictly: '\\xFF' in a literal must not become a 500."""
    conn = chdb.connect(":memory:")
    try:
        def strict(sql: str) -> str:
            return conn.query(sql, "TabSeparatedRaw").bytes().decode()

        assert check("SELECT '\\xFF', 1 SETTINGS log_comment = '\\xFE'", role="reader", parse=strict).kind == "select"
        assert refused("DESCRIBE TABLE `a\\xFFb`", strict, role="reader").code == 36
    finally:
        conn.close()


def test_given_a_statement_above_max_query_size_then_it_is_refused_before_any_parse() -> None:
    def no_parse(sql: str) -> str:
        raise AssertionError("parsed a statement that is too large")

    for statement in ("SELECT " + " " * 300_000 + "1", "SELECT '" + "é" * 140_000 + "'"):   # chars, then bytes
        with pytest.raises(Refused) as caught:
            check(statement, role="reader", parse=no_parse)
        assert (caught.value.code, caught.value.name, caught.value.http_status) == (229, "QUERY_IS_TOO_LARGE", 413)


@pytest.mark.serial   # a time budget on the wall clock: run alone (./run test)
def test_given_4_mb_of_spaces_then_the_check_takes_well_under_a_second(parse: Callable[[str], str]) -> None:
    statement = "INSERT INTO t" + " " * 4_000_000 + "x"
    started = time.perf_counter()
    assert refused(statement, parse).code == 229
    assert time.perf_counter() - started < 0.2
    started = time.perf_counter()   # and parsed whole under a larger limit: linear in the size
    assert refused(statement, parse, max_query_size=8_000_000).code == 62
    verdict = check("SELECT" + " " * 4_000_000 + "1", role="reader", parse=parse, max_query_size=8_000_000)
    assert verdict.kind == "select"
    assert time.perf_counter() - started < 1.0


def test_given_deep_nesting_then_it_is_refused_with_a_client_error(parse: Callable[[str], str]) -> None:
    for statement in ("SELECT " + "(" * 3000 + "1" + ")" * 3000, "SELECT " + "abs(" * 400 + "1" + ")" * 400):
        error = refused(statement, parse, role="reader")
        assert error.http_status == 400 and error.code in (62, 167, 306), error


def test_given_a_parse_that_fails_for_another_reason_then_that_error_is_not_hidden() -> None:
    def broken(sql: str) -> str:
        raise ConnectionError("the pool is closed")

    with pytest.raises(ConnectionError):
        check("SELECT 1", role="reader", parse=broken)


# --- what the project sends -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "sql"), migration_files())
def test_given_every_migration_statement_then_the_writer_may_run_it(
        parse: Callable[[str], str], name: str, sql: str) -> None:
    for statement in statements(sql):
        verdict = check(statement, role="writer", parse=parse, caps=CAPS)
        assert verdict.kind in ("ddl", "insert"), (name, statement)
        assert refused(statement, parse, role="reader").code == 164


@pytest.mark.parametrize("statement", [
    "CREATE TABLE t (a Int8 CODEC(Delta, ZSTD(1)), b Tuple(x Int8, y String), c Enum8('a' = 1), "
    "d Nested(k String, v Int8), e JSON, f DateTime DEFAULT now(), g String MATERIALIZED toString(a), "
    "h String ALIAS toString(a), i Int8 EPHEMERAL, j Map(String, Int8), k Int8 STATISTICS(tdigest), "
    "l AggregateFunction(argMax, Float64, DateTime64(3, 'UTC')), m SimpleAggregateFunction(max, UInt64), "
    "INDEX bf b.y TYPE bloom_filter(0.01) GRANULARITY 4, PROJECTION p (SELECT a, count() GROUP BY a), "
    "CONSTRAINT c1 CHECK a > 0) ENGINE = ReplacingMergeTree ORDER BY a "
    "TTL f + INTERVAL 1 DAY DELETE WHERE a = 1, f + INTERVAL 3 DAY GROUP BY a SET b = any(b) "
    "SETTINGS index_granularity = 8192 COMMENT 'c'",
    "CREATE TABLE IF NOT EXISTS s (x UInt64) ENGINE = SummingMergeTree PARTITION BY x % 10 ORDER BY x",
    "CREATE TABLE m AS numbers(10)",
    "CREATE TABLE c CLONE AS s",
    "CREATE TABLE r ENGINE = Memory AS SELECT * FROM numbers(3)",
    "CREATE DATABASE IF NOT EXISTS other ENGINE = Atomic", "CREATE DATABASE Other_2",
    "CREATE MATERIALIZED VIEW mv ENGINE = MergeTree ORDER BY x AS SELECT 1 AS x",
    "CREATE MATERIALIZED VIEW IF NOT EXISTS mv2 TO t AS SELECT x FROM s WHERE x IN (SELECT 1)",
    "ALTER TABLE t ADD COLUMN x Int8 DEFAULT 1 FIRST, MODIFY COLUMN z String CODEC(ZSTD), MATERIALIZE TTL",
    "ALTER TABLE t MODIFY TTL toDateTime(x) + toIntervalDay(30)",
    "ALTER TABLE t MODIFY SETTING ttl_only_drop_parts = 1",
    "ALTER TABLE t ADD PROJECTION p2 (SELECT a ORDER BY a), MATERIALIZE PROJECTION p2",
    "ALTER TABLE device_clocks ADD INDEX IF NOT EXISTS m last_received TYPE minmax GRANULARITY 1, MATERIALIZE INDEX m",
    "ALTER TABLE t DELETE WHERE x = 424242", "OPTIMIZE TABLE logs FINAL", "CREATE OR REPLACE VIEW v AS SELECT 1",
    "ALTER TABLE w ADD COLUMN IF NOT EXISTS h UInt64 AFTER l, MODIFY ORDER BY (k, h)",
    "INSERT INTO t (* EXCEPT (a)) SELECT * FROM numbers(1)",
    "INSERT INTO t SELECT * FROM format(JSONEachRow, 'x UInt8', '{\"x\": 1}')",
])
def test_given_ordinary_ddl_then_the_writer_may_run_it(parse: Callable[[str], str], statement: str) -> None:
    assert check(statement, role="writer", parse=parse, caps=CAPS).kind in ("ddl", "insert")


@pytest.mark.parametrize("statement", [
    "SELECT a, sum(x) OVER (PARTITION BY a ORDER BY b ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS w, "
    "arrayMap(x -> x + 1, [1, 2]), map('a', 1)['a'], (1, 'b'), x::String, INTERVAL 1 DAY, COLUMNS('^a') APPLY(sum), "
    "* EXCEPT (b) REPLACE (1 AS c) FROM t FINAL SAMPLE 0.1 ARRAY JOIN arr AS e PREWHERE 1 WHERE x IN (SELECT 1) "
    "GROUP BY GROUPING SETS ((a), (b)) WITH TOTALS HAVING 1 WINDOW ww AS (ORDER BY a) QUALIFY w > 0 "
    "ORDER BY a WITH FILL STEP 1 INTERPOLATE (b AS b + 1) LIMIT 1 BY a LIMIT 10 OFFSET 5",
    "SELECT * FROM a LEFT JOIN b USING (x) GLOBAL ANY JOIN c ON a.x = c.x CROSS JOIN d PASTE JOIN e",
    "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r",
    "SELECT count(DISTINCT a, b) FILTER (WHERE 1), quantileTDigest(0.5)(x), quantilesIf(0.5, 0.9)(x, x > 1), "
    "CASE WHEN 1 THEN 2 ELSE 3 END, x ? 1 : 2, t.1, t.*, dictGet('d', 'v', 1), x ILIKE '%a', now() - INTERVAL 1 HOUR",
    "SELECT 1 EXCEPT SELECT 2 INTERSECT SELECT 3",
    "SELECT * FROM numbers(10) AS n, zeros(3), values('x Int8', 1, 2), generateRandom('a Int8') LIMIT 1",
    "SELECT * FROM view(SELECT 1)", "SELECT dummy FROM system.one CROSS JOIN system.tables",
    "SELECT * FROM system.numbers LIMIT 3", "SELECT * FROM system.functions LIMIT 3",
    "SELECT * FROM format(JSONEachRow, '{\"a\": 1}')",
    "SELECT * FROM {t:Identifier} WHERE x = {x:UInt64} FORMAT JSONCompact",
    "SELECT now() SETTINGS session_timezone = 'UTC', max_threads = 2",
    "SHOW DATABASES", "SHOW COLUMNS FROM t", "SHOW SETTINGS LIKE 'max_%'", "CHECK TABLE t", "EXISTS t",
    "EXPLAIN PIPELINE header = 1 SELECT 1", "EXPLAIN SYNTAX SELECT 1", "EXPLAIN AST SELECT 1",
])
def test_given_ordinary_reads_then_the_reader_may_run_them(parse: Callable[[str], str], statement: str) -> None:
    verdict = check(statement, role="reader", parse=parse, caps=CAPS)
    assert (verdict.kind, verdict.read_only) == ("select", True)


# What Grafana's ClickHouse data source asks when a user picks a database, a table and its columns, or edits a query
# (grafana/clickhouse-datasource: src/data/CHDatasource.ts, CHVariableSupport.tsx), and clickhouse-go's hello.
GRAFANA_SCHEMA_QUERIES = [
    "SELECT displayName(), version(), revision(), timezone()", "SELECT 1", "SELECT version()", "SHOW DATABASES",
    'SHOW TABLES FROM "eventide"', 'DESC TABLE "eventide"."sessions"',
    "SELECT name FROM system.databases ORDER BY name",
    "SELECT name FROM system.tables WHERE database = 'eventide' ORDER BY name",
    "SELECT name FROM system.columns WHERE database = 'eventide' AND table = 'sessions' ORDER BY name",
    "SELECT name, type, table FROM system.columns WHERE database IN ('eventide')",
    "SELECT name, is_aggregate, case_insensitive, alias_to, origin, description, syntax, arguments, returned_value, "
    "examples, categories FROM system.functions LIMIT 10000",
]


@pytest.mark.parametrize("statement", GRAFANA_SCHEMA_QUERIES)
def test_given_grafanas_schema_queries_then_the_reader_may_run_them(
        parse: Callable[[str], str], statement: str) -> None:
    assert check(statement, role="reader", parse=parse, caps=CAPS).read_only


@pytest.mark.parametrize(("statement", "named"), [
    ("SELECT query FROM system.processes", "system.processes"),
    ("SELECT * FROM system.stack_trace", "system.stack_trace"),
    ("SELECT name FROM system.symbols", "system.symbols"),
    ("SELECT path FROM system.disks", "system.disks"),
    ("SELECT name FROM `system`.`parts`", "system.parts"),
    ("SELECT name FROM SYSTEM.query_log", "system.query_log"),
    ("WITH x AS (SELECT message FROM system.text_log) SELECT * FROM x", "system.text_log"),
    ("SELECT * FROM view(SELECT query FROM system.processes)", "system.processes"),
    ("SELECT name FROM system.tables UNION ALL SELECT name FROM system.server_settings", "system.server_settings"),
    ("SELECT * FROM system.tables", "all columns"),
    ("SELECT t.* FROM system.databases AS t", "all columns"),
    ("SELECT COLUMNS('path') FROM system.databases", "all columns"),
    ("SELECT name, data_paths FROM system.tables", "data_paths"),
    ("SELECT t.metadata_path FROM system.databases AS t", "metadata_path"),
    ("SELECT * FROM merge('system', '^processes$')", "merge"),
])
def test_given_a_system_table_that_shows_the_host_then_the_reader_is_refused_and_the_writer_is_not(
        parse: Callable[[str], str], statement: str, named: str) -> None:
    # A system table describes the data (databases, tables, columns, functions) or shows the host and other users'
    # work (queries, stack traces, disks, paths): the reader, which a Grafana instance holds, reads only the former.
    error = refused(statement, parse, role="reader")
    assert (error.code, error.http_status) == (497, 403) and named in error.message
    check(statement, role="writer", parse=parse, caps=CAPS)


def test_given_the_migration_runner_and_clickhouse_connect_then_their_own_statements_are_allowed(
        parse: Callable[[str], str]) -> None:
    retention = Config().retention
    ttls = [f"ALTER TABLE {table} MODIFY TTL {ttl_expression(retention, family, column)}"
            for table, (family, column) in TTL_TABLES.items()]
    for statement in ("CREATE DATABASE IF NOT EXISTS eventide", _LEDGER, *ttls):
        assert check(statement, role="writer", parse=parse).kind == "ddl"
    for statement in ("SELECT engine_full FROM system.tables WHERE database = {d:String} AND name = {t:String}",
                      "SELECT table, name FROM system.columns WHERE database = {d:String}"):
        assert check(statement, role="reader", parse=parse).kind == "select"
    for role in ("reader", "writer"):
        for statement in ("SELECT name FROM schema_migrations FINAL", "SELECT version(), timezone()",
                          "SELECT name, value, readonly FROM system.settings LIMIT 10000",
                          "SELECT name, value, changed, description, type, readonly FROM system.settings LIMIT 10000",
                          "DESCRIBE TABLE eventide.window_aggregates", "DESCRIBE TABLE `eventide`.`alert_states`",
                          "EXISTS TABLE eventide.dead_letters", "SHOW CREATE TABLE eventide.dead_letters",
                          "SHOW TABLES FROM eventide", "EXPLAIN SELECT 1", "SELECT 1 FORMAT JSONEachRow"):
            verdict = check(statement, role=role, parse=parse, caps=CAPS)   # type: ignore[arg-type]
            assert (verdict.kind, verdict.read_only) == ("select", True), statement
    verdict = check("INSERT INTO eventide.window_aggregates (window_kind, app, version) FORMAT Native\n",
                    role="writer", parse=parse)
    assert verdict == Verdict(kind="insert", statement="InsertQuery", read_only=False, insert_database="eventide",
                              insert_table="window_aggregates", format="Native", expects_data=True)
    verdict = check("INSERT INTO `eventide`.`dead_letters` SETTINGS async_insert = 0 FORMAT Arrow",
                    role="writer", parse=parse)
    assert (verdict.insert_table, verdict.format, verdict.settings) == ("dead_letters", "Arrow", {"async_insert": 0})
    assert check("DESC t FORMAT JSON", role="reader", parse=parse).format == "JSON"


class _Stop(Exception):
    """Raised by the recording client once it holds the statement a function sends."""


class _Recorder:
    """A client that records the SQL a query function sends (no store behind it: only the text is wanted)."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def _record(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self.sent.append(sql)
        raise _Stop

    query = query_arrow = query_df = query_np = command = _record


def _arguments(function: Callable[..., Any], client: _Recorder, rule: AlertRule) -> dict[str, Any]:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    by_name: dict[str, Any] = {
        "client": client, "config": Config(), "rule": rule, "series": SeriesKey("shop", "metric", "latency", ""),
        "matches": [SeriesKey("shop", "metric", "latency", "")], "apps": ["shop"],
        "since": now - timedelta(hours=1), "until": now, "start": now - timedelta(hours=1), "end": now,
        "start_ms": 1_700_000_000_000, "end_ms": 1_700_003_600_000, "now": 1_700_003_600_000, "channel": "webhook",
        "lengths_ms": [60_000], "stored_lengths_ms": [60_000], "quantiles": [0.5, 0.99],
        "names": [("metric", "latency"), ("log", "app.server")], "selectors": [("metric", "latency", "*", 60)],
        "query": LogQuery(now - timedelta(hours=1), now, apps=("shop",), levels=("error",), names=("pay",),
                          text='declined "card expired"', tags=(("region", "eu"),)),
    }
    arguments = {}
    for name, parameter in inspect.signature(function).parameters.items():
        if name in by_name:
            arguments[name] = by_name[name]
        elif parameter.default is inspect.Parameter.empty and parameter.kind not in (
                inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            arguments[name] = 60   # lengths, hops, resolutions, limits: any positive number builds the same SQL
    return arguments


def _project_queries() -> tuple[list[str], list[str]]:
    """Every statement the dashboard, alerting and range queries send, from their own functions; and the functions
    that sent none (their statements would go unchecked)."""
    rules = [AlertRule(name=f"r-{statistic}", statistic=statistic, comparator=">", threshold=1,
                       series=SeriesSelector(name="latency") if statistic not in ("dead_letters", "freshness", "lag")
                       else None)
             for statistic in ("p99", "count", "dropped_stragglers", "dead_letters", "freshness", "lag")]
    rules.append(AlertRule(name="r-logs", statistic="count", comparator=">", threshold=1, logs=LogSearch(
        text='declined "card expired"', levels=["error"], names=["pay"], tags={"region": "eu"})))
    sent: list[str] = []
    silent: list[str] = []
    for module in (dashboard.queries, alerting.evaluator, alerting.dispatch, alerting.silences, store.range_query,
                   store.pipeline, store.log_query):
        for _, function in inspect.getmembers(module, inspect.isfunction):
            public = not function.__name__.startswith("_")   # helpers are reached through the public functions
            if function.__module__ != module.__name__ or not public or "client" not in inspect.signature(
                    function).parameters:
                continue
            reached = False
            for rule in rules:
                client = _Recorder()
                # Stops at the first statement. A function refuses a rule of a kind it does not read (an assert on
                # the rule's series, a ValueError naming its statistic); any other error is a broken query function
                # and fails the test where it is raised.
                with contextlib.suppress(_Stop, AssertionError, ValueError):
                    function(**_arguments(function, client, rule))
                reached = reached or bool(client.sent)
                sent.extend(client.sent)   # type: ignore[arg-type]
            if not reached:
                silent.append(f"{module.__name__}.{function.__name__}")
    return sorted(set(sent)), silent


def test_given_every_query_of_the_dashboard_and_alerting_then_the_reader_may_run_it(
        parse: Callable[[str], str]) -> None:
    queries, silent = _project_queries()
    assert not silent, f"these query functions sent no statement, so none was checked: {silent}"
    assert len(queries) >= 20, queries   # the dashboard alone sends more than that: the harness reached them
    for statement in queries:
        try:
            verdict = check(statement, role="reader", parse=parse, caps=CAPS)
        except Refused as error:
            raise AssertionError(f"{error.message}\n{statement}") from None
        assert (verdict.kind, verdict.read_only) == ("select", True), statement


def test_given_one_check_then_it_costs_one_parse_call(parse: Callable[[str], str]) -> None:
    calls: list[str] = []

    def counted(sql: str) -> str:
        calls.append(sql)
        return parse(sql)

    check("SELECT app, count() FROM window_aggregates FINAL WHERE app = {a:String} GROUP BY app",
          role="reader", parse=counted)
    check("INSERT INTO eventide.t (a) FORMAT Native", role="writer", parse=counted)
    assert len(calls) == 2


# --- the writer's statement kinds, the engine's own databases, background work (issue 49) ---------------------

@pytest.mark.parametrize(("statement", "named"), [
    ("DROP DATABASE eventide", "DROP/TRUNCATE is not allowed"),
    ("DROP DATABASE IF EXISTS other SYNC", "DROP/TRUNCATE is not allowed"),
    ("DROP TABLE eventide.window_aggregates", "DROP/TRUNCATE is not allowed"),
    ("TRUNCATE TABLE eventide.logs", "DROP/TRUNCATE is not allowed"),
    ("RENAME TABLE a TO b", "RENAME/EXCHANGE is not allowed"),
    ("EXCHANGE TABLES a AND b", "RENAME/EXCHANGE is not allowed"),
    ("DELETE FROM t WHERE 1", "DELETE is not allowed"),
    ("UPDATE t SET a = 1 WHERE b = 2", "UPDATE is not allowed"),
    ("CREATE INDEX i ON t (x) TYPE minmax", "CREATE INDEX is not allowed"),
    ("DROP INDEX i ON t", "DROP INDEX is not allowed"),
    ("CREATE OR REPLACE TABLE r ENGINE = Memory AS SELECT 1", "CREATE OR REPLACE"),
    ("REPLACE TABLE r ENGINE = Memory AS SELECT 1", "CREATE OR REPLACE"),
    ("CREATE OR REPLACE MATERIALIZED VIEW v TO t AS SELECT 1", "CREATE OR REPLACE"),
    ("ALTER TABLE t DROP COLUMN y", "ALTER TABLE DROP COLUMN is not allowed"),
    ("ALTER TABLE t DROP PARTITION 202401", "ALTER TABLE DROP PARTITION is not allowed"),
    ("ALTER TABLE t REPLACE PARTITION 1 FROM s", "ALTER TABLE REPLACE PARTITION is not allowed"),
    ("ALTER TABLE t UPDATE a = 1 WHERE 1", "ALTER TABLE UPDATE is not allowed"),
    ("ALTER TABLE t RENAME COLUMN a TO b", "ALTER TABLE RENAME COLUMN is not allowed"),
    ("CREATE DATABASE `odd\\``", "database name 'odd`' is not allowed"),
    ("CREATE DATABASE `a;b`", "database name 'a;b' is not allowed"),
    ("CREATE DATABASE `1abc`", "database name '1abc' is not allowed"),
])
def test_given_a_statement_the_product_never_sends_then_the_writer_is_refused(
        parse: Callable[[str], str], statement: str, named: str) -> None:
    error = refused(statement, parse, role="writer")
    assert (error.code, error.http_status) == (497, 403) and named in error.message, error


@pytest.mark.parametrize("statement", [
    "DROP DATABASE system", "DROP TABLE system.one", "TRUNCATE TABLE system.query_cache",
    "CREATE TABLE system.x (a UInt8) ENGINE = Memory", "CREATE DATABASE IF NOT EXISTS system",
    "CREATE VIEW INFORMATION_SCHEMA.v AS SELECT 1", "CREATE MATERIALIZED VIEW mv TO system.x AS SELECT 1",
    "ALTER TABLE system.one ADD COLUMN x UInt8", "ALTER TABLE information_schema.tables DELETE WHERE 1",
    "INSERT INTO system.one FORMAT CSV", "INSERT INTO `System`.one SELECT 1", "OPTIMIZE TABLE system.one",
    "RENAME TABLE system.one TO eventide.one", "RENAME DATABASE eventide TO system",
    "DETACH TABLE system.one", "ATTACH TABLE system.one", "EXCHANGE TABLES system.one AND eventide.t",
])
def test_given_a_write_to_the_engines_own_databases_then_everyone_is_refused(
        parse: Callable[[str], str], statement: str) -> None:
    assert refused(statement, parse, role="writer").code == 497
    assert refused(statement, parse, role="reader").code in (164, 497)


@pytest.mark.parametrize(("statement", "named"), [
    ("CREATE MATERIALIZED VIEW mv REFRESH EVERY 1 SECOND TO t AS SELECT 1", "refreshable materialized view"),
    ("CREATE MATERIALIZED VIEW mv REFRESH AFTER 1 HOUR ENGINE = Memory AS SELECT 1 AS x",
     "refreshable materialized view"),
    ("CREATE MATERIALIZED VIEW mv REFRESH EVERY 1 SECOND APPEND TO t AS SELECT * FROM format(Values, "
     "'s String', '(1)')", "refreshable"),
    ("ALTER TABLE mv MODIFY REFRESH EVERY 1 SECOND", "ALTER TABLE MODIFY REFRESH is not allowed"),
    ("SYSTEM START VIEWS", "SYSTEM is not allowed"), ("SYSTEM REFRESH VIEW mv", "SYSTEM is not allowed"),
    ("SYSTEM START MERGES", "SYSTEM is not allowed"),
    ("CREATE VIEW v AS SELECT * FROM format(Values, 's String', '(1)')", "table function format is not allowed in"),
    ("CREATE TABLE t ENGINE = Memory AS SELECT * FROM format(CSV, 'x String', '1')", "table function format"),
    ("ALTER TABLE t DELETE WHERE x IN (SELECT 1)", "a subquery is not allowed"),
    ("ALTER TABLE t DELETE WHERE x IN numbers(3)", "table function numbers is not allowed"),
    ("ALTER TABLE t ADD COLUMN y UInt64 DEFAULT (SELECT count() FROM numbers(10))", "a subquery is not allowed"),
    ("CREATE TABLE t (x UInt64 DEFAULT (SELECT 1)) ENGINE = MergeTree ORDER BY x", "a subquery is not allowed"),
    ("CREATE TABLE t (x DateTime) ENGINE = MergeTree ORDER BY x TTL x + INTERVAL (SELECT 1) DAY",
     "a subquery is not allowed"),
    ("ALTER TABLE t ADD COLUMN c String DEFAULT {d:String}", "a query parameter is not allowed"),
    ("CREATE TABLE t (x UInt8 DEFAULT {d:UInt8}) ENGINE = Memory", "a query parameter is not allowed"),
])
def test_given_a_statement_that_leaves_background_work_then_it_is_refused(
        parse: Callable[[str], str], statement: str, named: str) -> None:
    error = refused(statement, parse, role="writer")
    assert error.code == 497 and named in error.message, error


@pytest.mark.parametrize(("statement", "named"), [
    ("SELECT * FROM format({f:Identifier}, '1')", "its format must be a name written in the statement"),
    ("SELECT * FROM format({f:String}, 'x String', '1')", "its format must be a name written in the statement"),
    ("SELECT * FROM format(concat('Proto', 'buf'), '1')", "its format must be a name written in the statement"),
    ("SELECT * FROM format(Values, {d:String})", "structure and data must be string literals"),
    ("SELECT * FROM format(Values, 's String', {d:String})", "structure and data must be string literals"),
    ("SELECT * FROM format(Values, 's String', concat('(1', ')'))", "structure and data must be string literals"),
    ("SELECT * FROM format(Values, (SELECT '(1)'))", "structure and data must be string literals"),
    ("SELECT * FROM format(Values, 's String', (SELECT '(1)'))", "structure and data must be string literals"),
    ("SELECT * FROM format(CSV)", "needs its format and its data as literals"),
])
def test_given_format_whose_format_or_data_the_guard_cannot_read_then_it_is_refused(
        parse: Callable[[str], str], statement: str, named: str) -> None:
    for role in ("reader", "writer"):
        error = refused(statement, parse, role=role)
        assert error.code == 497 and named in error.message, error


@pytest.mark.parametrize(("statement", "fmt"), [
    ("SELECT 1 -- FORMAT Protobuf", None), ("SELECT 1 /* FORMAT DataFrame */", None),
    ("SELECT 'FORMAT JSON'", None), ("SELECT 1 FORMAT JSON", "JSON"), ("SHOW TABLES FORMAT CSV", "CSV"),
    ("EXPLAIN SELECT 1 FORMAT JSON", "JSON"), ("CHECK TABLE t FORMAT JSON", "JSON"),
    ("EXISTS TABLE db.t FORMAT Native", "Native"), ("EXISTS db.JSON", None), ("EXISTS JSON", None),
    ("SHOW CREATE TABLE t FORMAT JSON", "JSON"), ("EXISTS DATABASE d FORMAT CSV", "CSV"),
    ("DESCRIBE TABLE db.t FORMAT JSON", "JSON"),
])
def test_given_a_statement_then_its_format_is_the_parsers_not_the_texts_last_words(
        parse: Callable[[str], str], statement: str, fmt: str | None) -> None:
    assert check(statement, role="reader", parse=parse).format == fmt


def test_given_database_names_then_only_plain_identifiers_are_accepted() -> None:
    from store.server.guard import is_database_name

    for name in ("eventide", "_x", "sec_1a2b3c4d", "A" * 128):
        assert is_database_name(name), name
    for name in ("", "1x", "a`", "a\\", "a;b", "a b", "a.b", "a-b", "é", "A" * 129, "sec`; SELECT 1; --"):
        assert not is_database_name(name), name
