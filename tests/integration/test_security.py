"""The embedded store against hostile local clients and web pages: every attack of issue 36's store list is tried
against a real ``python -m store.server`` child and refused, with the refusal's status and message asserted.

The store runs with lower limits than the defaults (short deadlines, small caps) so each bound is reached quickly.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import os
import socket
import stat
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from eventide.config import Config, load_config
from store import credentials
from store.client import connect
from tests.support.pipeline import assert_connection_over_the_cap_is_closed
from tests.support.stack import served_store

# Deadlines, timeouts and time budgets measured on the wall clock: run alone (./run test), not beside other tests.
pytestmark = pytest.mark.serial

LIMITS = {"max_execution_time": 2, "max_result_bytes": 8 * 1024**2, "max_insert_bytes": 32 * 1024**2,
          "max_concurrent_queries": 6, "http_headers_timeout_s": 2, "http_receive_timeout_s": 4,
          "max_connections": 700}


class Store:
    """The store under attack: its config, process, and ways to talk to it in raw HTTP."""

    def __init__(self, config: Config, pid: int) -> None:
        self.config, self.pid = config, pid
        self.port = config.store.port
        creds = credentials.load(config)
        self.writer = ("default", creds.writer_password)
        self.reader = (creds.reader_user, creds.reader_password)
        self.host = f"127.0.0.1:{self.port}"

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def request(self, method: str, path: str = "/", body: bytes = b"", user: tuple[str, str] | None = None,
                headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, dict[str, str], str]:
        """One request on a fresh connection: (status, headers, body text)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        sent = dict(headers or {})
        if user is not None:
            sent["Authorization"] = "Basic " + base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
        try:
            conn.request(method, path, body=body if method != "GET" else None, headers=sent)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode(errors="replace")
        finally:
            conn.close()

    def sql(self, statement: str, user: tuple[str, str] | None = None, **params: str) -> tuple[int, str]:
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        status, _, text = self.request("POST", "/" + query, statement.encode(), user or self.writer)
        return status, text

    def raw(self, data: bytes, timeout: float = 10) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        sock.sendall(data)
        return sock

    def auth_head(self, user: tuple[str, str] | None = None) -> str:
        user = user or self.writer
        return f"Host: {self.host}\r\nX-ClickHouse-User: {user[0]}\r\nX-ClickHouse-Key: {user[1]}\r\n"


def _answer(sock: socket.socket) -> tuple[int, str]:
    resp = http.client.HTTPResponse(sock)
    resp.begin()
    return resp.status, resp.read().decode(errors="replace")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with served_store(tmp_path_factory.mktemp("security"), **LIMITS) as (config, proc):
        target = Store(config, proc.pid)
        status, text = target.sql("CREATE DATABASE IF NOT EXISTS sec")
        assert status == 200, text
        status, text = target.sql("CREATE TABLE IF NOT EXISTS sec.t (x UInt64) ENGINE = MergeTree ORDER BY x")
        assert status == 200, text
        yield target


# ------------------------------------------------------------------------------------------------ passwords

def test_the_generated_password_file_is_private_and_not_empty(store: Store) -> None:
    file = credentials.path(store.config)
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert store.writer[1] and store.reader[1] and store.writer[1] != store.reader[1]
    assert len(store.writer[1]) >= 24


@pytest.mark.parametrize("user", [None, ("default", ""), ("default", "guess"), ("nobody", "x")])
def test_no_or_a_wrong_password_is_refused(store: Store, user: tuple[str, str] | None) -> None:
    status, headers, text = store.request("POST", "/", b"SELECT 1", user)
    assert status == 403 and headers["x-clickhouse-exception-code"] == "516"
    assert "Authentication failed" in text and "(AUTHENTICATION_FAILED)" in text
    # the URL parameters ClickHouse accepts work the same way
    status, _, text = store.request("POST", "/?user=default&password=guess", b"SELECT 1", None)
    assert status == 403 and "(AUTHENTICATION_FAILED)" in text


@pytest.mark.parametrize("chunked", [False, True])
def test_a_huge_body_with_a_wrong_password_is_refused_before_it_is_read(store: Store, chunked: bool) -> None:
    """Given a 1 GB body announced with a wrong password, the answer (403) comes after the head alone, the
    connection is closed, and the server's memory does not grow."""
    rss = store.rss_mb()
    framing = "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {1024**3}\r\n"
    started = time.monotonic()
    sock = store.raw(f"POST / HTTP/1.1\r\n{store.auth_head(('default', 'wrong'))}{framing}\r\n".encode())
    piece = (b"100000\r\n" + b"x" * 0x100000 + b"\r\n") if chunked else b"x" * 0x100000
    sent = 0
    with sock:
        status, text = _answer(sock)
        answered = time.monotonic() - started
        with pytest.raises(OSError):             # the server closed the connection: the body goes nowhere
            for _ in range(1024):
                sock.sendall(piece)
                sent += 1
    assert status == 403 and "(AUTHENTICATION_FAILED)" in text
    assert answered < 1.0, answered
    assert sent < 1024
    assert store.rss_mb() - rss < 16, (rss, store.rss_mb())


# ------------------------------------------------------------------------------------------- malformed framing

def test_a_negative_content_length_is_refused_at_once(store: Store) -> None:
    started = time.monotonic()
    with store.raw(f"POST / HTTP/1.1\r\n{store.auth_head()}Content-Length: -1\r\n\r\nSELECT 1".encode()) as sock:
        status, text = _answer(sock)
    assert status == 400 and "Invalid HTTP request" in text
    assert time.monotonic() - started < 1.0


def test_a_huge_chunk_size_is_bounded_by_the_statement_limit(store: Store) -> None:
    """A chunk announced at 2^80 bytes is read as a stream: the statement limit ends it (413), memory stays flat."""
    rss = store.rss_mb()
    head = f"POST / HTTP/1.1\r\n{store.auth_head()}Transfer-Encoding: chunked\r\n\r\n"
    with store.raw(head.encode() + b"ffffffffffffffffffff\r\nSELECT '" + b"x" * 400_000) as sock:
        status, text = _answer(sock)
    assert status == 413 and "(QUERY_IS_TOO_LARGE)" in text and "max_query_size" in text
    assert store.rss_mb() - rss < 16
    with store.raw(head.encode() + b"f" * 100 + b"\r\nSELECT 1") as sock:       # not a chunk size at all
        status, text = _answer(sock)
    assert status == 400 and "Invalid HTTP request" in text


def test_an_oversize_statement_is_refused(store: Store) -> None:
    status, text = store.sql("SELECT " + "1+" * 200_000 + "1")
    assert status == 413 and "(QUERY_IS_TOO_LARGE)" in text and "262144" in text


def test_an_oversize_head_is_refused(store: Store) -> None:
    status, _, text = store.request("POST", "/?x_filler=" + "a" * 200_000, b"SELECT 1", store.writer)
    assert status == 431 and "http_max_field_value_size" in text


def test_a_head_that_never_ends_is_cut_off_by_its_deadline(store: Store) -> None:
    started = time.monotonic()
    with store.raw(b"POST / HTTP/1.1\r\nHost: " + store.host.encode() + b"\r\nX-Slow: ") as sock:
        status, text = _answer(sock)
    assert status == 408 and "http_headers_timeout_s" in text
    assert 1.5 < time.monotonic() - started < 4


def test_a_body_that_never_ends_is_cut_off_by_its_deadline(store: Store) -> None:
    started = time.monotonic()
    with store.raw(f"POST / HTTP/1.1\r\n{store.auth_head()}Content-Length: 100\r\n\r\nSELECT".encode()) as sock:
        status, text = _answer(sock)
    assert status == 408 and "http_receive_timeout_s" in text
    assert 3.5 < time.monotonic() - started < 7


def test_a_decompression_bomb_is_capped(store: Store) -> None:
    bomb = gzip.compress(b"INSERT INTO sec.t FORMAT TSV\n" + b"1\n" * (40 * 1024**2), compresslevel=1)
    assert len(bomb) < 1024**2
    rss = store.rss_mb()
    status, _, text = store.request("POST", "/", bomb, store.writer, {"Content-Encoding": "gzip"})
    assert status == 413 and "(LIMIT_EXCEEDED)" in text and "max_insert_bytes" in text
    assert store.rss_mb() - rss < 32
    assert store.sql("SELECT count() FROM sec.t WHERE x = 1") == (200, "0\n")


# -------------------------------------------------------------------------------------------------- web pages

@pytest.mark.parametrize("headers", [
    {"Origin": "http://evil.example", "Content-Type": "text/plain"},
    {"Origin": "null", "Content-Type": "text/plain"},
    {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"},
    {"Sec-Fetch-Site": "same-site"},
    {"Host": "evil.example:18123"},
    {"Host": "127.0.0.1:1"},
])
def test_requests_a_web_page_can_make_are_refused(store: Store, headers: dict[str, str]) -> None:
    """A form POST (text/plain, no preflight) from a web page, even one that knew the password, or a DNS-rebound
    name in Host: 403 before anything runs."""
    status, _, text = store.request("POST", "/", b"DROP TABLE sec.t", store.writer, headers)
    assert status == 403 and "(ACCESS_DENIED)" in text
    assert "web pages" in text or "is not the address this store serves" in text
    assert store.sql("EXISTS TABLE sec.t") == (200, "1\n")


def test_localhost_names_the_loopback_store_too(store: Store) -> None:
    status, _, text = store.request("POST", "/", b"SELECT 1", store.writer, {"Host": f"localhost:{store.port}"})
    assert (status, text) == (200, "1\n")


# ------------------------------------------------------------------------------------------------ read-only

@pytest.mark.parametrize("statement", ["DROP TABLE sec.t", "INSERT INTO sec.t VALUES (7)",
                                       "CREATE TABLE sec.g (x UInt8) ENGINE = Memory"])
def test_get_is_read_only(store: Store, statement: str) -> None:
    status, headers, text = store.request("GET", "/?" + urllib.parse.urlencode({"query": statement}),
                                          user=store.writer)
    assert status == 403 and headers["x-clickhouse-exception-code"] in ("164", "497"), text
    assert store.sql("EXISTS TABLE sec.t") == (200, "1\n")
    assert store.sql("SELECT count() FROM sec.t WHERE x = 7") == (200, "0\n")


@pytest.mark.parametrize("statement", ["INSERT INTO sec.t VALUES (8)", "DROP TABLE sec.t",
                                       "CREATE TABLE sec.r (x UInt8) ENGINE = Memory", "TRUNCATE TABLE sec.t"])
def test_the_reader_cannot_write(store: Store, statement: str) -> None:
    status, text = store.sql(statement, user=store.reader)
    assert status == 403 and ("(READONLY)" in text or "(ACCESS_DENIED)" in text), text
    assert store.sql("SELECT count() FROM sec.t WHERE x = 8", user=store.reader) == (200, "0\n")
    status, text = store.sql("SELECT 1", user=store.reader, readonly="0")
    assert status == 403 and "(READONLY)" in text


def test_the_reader_reads_through_the_client(store: Store) -> None:
    """``connect(role="reader")`` signs in as the read-only user: it reads what the writer wrote, and its writes are
    refused as READONLY (a writer's client would have inserted)."""
    status, _, text = store.request("POST", "/?" + urllib.parse.urlencode(
        {"query": "INSERT INTO sec.t FORMAT TabSeparated"}), b"31\n31\n", store.writer)
    assert status == 200, text
    config = store.config.model_copy(update={"store": store.config.store.model_copy(update={"database": "sec"})})
    try:
        with connect(config, role="reader") as client:
            assert client.command("SELECT count() FROM t WHERE x = 31") == 2
            with pytest.raises(DatabaseError, match=r"\(READONLY\)"):
                client.command("INSERT INTO t SELECT 32")
        assert store.sql("SELECT count() FROM sec.t WHERE x = 32") == (200, "0\n")
    finally:   # the module's other tests count the rows of sec.t
        store.sql("ALTER TABLE sec.t DELETE WHERE x IN (31, 32) SETTINGS mutations_sync = 1")


# ------------------------------------------------------------------------------------------ the host's files

@pytest.mark.parametrize(("statement", "reason"), [
    ("SELECT * FROM file('/etc/hostname', 'LineAsString')", "table function file is not allowed: it reaches the host"),
    ("SELECT 'x' INTO OUTFILE '/tmp/eventide-outfile-attack.txt'",
     "INTO OUTFILE is not allowed: it writes a host file"),
    ("INSERT INTO FUNCTION file('/tmp/eventide-attack.pth', 'LineAsString') SELECT 'import os'",
     "INSERT INTO FUNCTION is not allowed"),
    ("SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')",
     "table function url is not allowed: it reaches the host"),
    ("INSERT INTO sec.t FROM INFILE '/etc/hostname' FORMAT LineAsString",
     "FROM INFILE is not allowed: it reads a host file"),
    ("SELECT * FROM python(x)", "table function python is not allowed: it reaches the host"),
])
def test_statements_that_reach_the_host_are_refused(store: Store, statement: str, reason: str) -> None:
    """For the writer as for the reader: 403 ACCESS_DENIED, what ClickHouse answers a user without the grant, with
    the guard's reason (not some other error on the way, such as a parse error or the statement failing in chDB)."""
    for user in (store.writer, store.reader):
        status, text = store.sql(statement, user=user)
        assert status == 403 and text.startswith("Code: 497.") and "(ACCESS_DENIED)" in text and reason in text, (
            statement, user[0], status, text)
    assert not Path("/tmp/eventide-outfile-attack.txt").exists()
    assert not Path("/tmp/eventide-attack.pth").exists()


def test_an_insert_into_a_table_function_with_data_in_the_body_is_refused(store: Store) -> None:
    status, _, text = store.request("POST", "/?" + urllib.parse.urlencode(
        {"query": "INSERT INTO FUNCTION file('/tmp/eventide-attack2.pth', 'LineAsString') FORMAT LineAsString"}),
        b"import os\n", store.writer)
    assert status == 403 and "(ACCESS_DENIED)" in text and "INSERT INTO FUNCTION is not allowed" in text, text
    assert not Path("/tmp/eventide-attack2.pth").exists()


# ------------------------------------------------------------------------------------------- no state leaks

@pytest.mark.parametrize("attack", [
    "USE system", "/* x */ USE system", "-- c\nUSE system", "SET max_threads = 1", "-- c\nSET readonly = 1",
    "SELECT 1; USE system", "CREATE TEMPORARY TABLE leak (x UInt8)",
])
def test_no_state_survives_a_request(store: Store, attack: str) -> None:
    """Whatever the attacker's statement does to its own request, the next requests on the same pooled handles (same
    database and settings) run against the database, settings and tables they asked for."""
    def probe() -> tuple[int, str]:
        return store.sql("SELECT currentDatabase(), getSetting('max_threads'), getSetting('readonly'), "
                         "(SELECT count() FROM system.tables WHERE is_temporary)", database="sec")

    before = probe()
    assert before[0] == 200
    for _ in range(3):
        store.sql(attack, database="sec")
        assert probe() == before
    config = store.config.model_copy(update={"store": store.config.store.model_copy(update={"database": "sec"})})
    with connect(config) as client:          # the job's unqualified inserts land in their own database
        client.insert("t", [[424242]], column_names=["x"])
    assert store.sql("SELECT count() FROM sec.t WHERE x = 424242") == (200, "1\n")
    store.sql("ALTER TABLE sec.t DELETE WHERE x = 424242 SETTINGS mutations_sync = 1")


# ------------------------------------------------------------------------------------------- slow statements

def _latencies(store: Store, seconds: float) -> list[float]:
    out: list[float] = []
    conn = http.client.HTTPConnection("127.0.0.1", store.port, timeout=30)
    auth = {"Authorization": "Basic " + base64.b64encode(":".join(store.writer).encode()).decode()}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        conn.request("POST", "/", b"SELECT 1", auth)
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b"1\n"
        out.append(time.monotonic() - started)
    conn.close()
    return out


def test_a_pathological_statement_is_answered_quickly_and_does_not_stall_others(store: Store) -> None:
    """``INSERT INTO t`` + 40,000 spaces + ``x`` (a quadratic regex took seconds on it) and a 4 MB one."""
    results: dict[str, tuple[int, str, float]] = {}

    def attack() -> None:
        for name, body in (("40k", "INSERT INTO t" + " " * 40_000 + "x"),
                           ("4M", "INSERT INTO t" + " " * 4_000_000 + "x")):
            started = time.monotonic()
            status, text = store.sql(body)
            results[name] = (status, text, time.monotonic() - started)

    thread = threading.Thread(target=attack)
    thread.start()
    latencies = _latencies(store, 1.5)
    thread.join(30)
    assert results["40k"][0] == 400 and "(SYNTAX_ERROR)" in results["40k"][1] and results["40k"][2] < 1.0
    assert results["4M"][0] == 413 and "(QUERY_IS_TOO_LARGE)" in results["4M"][1] and results["4M"][2] < 2.0
    assert max(latencies) < 0.5 and sorted(latencies)[len(latencies) // 2] < 0.05, max(latencies)


def test_slow_connections_do_not_slow_a_select(store: Store) -> None:
    """500 connections that send half a head and stop: a concurrent SELECT 1 stays fast, and the server closes
    them at the head deadline."""
    socks = []
    try:
        for _ in range(500):
            sock = socket.create_connection(("127.0.0.1", store.port), timeout=10)
            sock.sendall(b"POST / HTTP/1.1\r\nHost: " + store.host.encode() + b"\r\n")
            socks.append(sock)
        latencies = _latencies(store, 1.0)
        assert sorted(latencies)[int(len(latencies) * 0.99)] < 0.1, max(latencies)
        time.sleep(LIMITS["http_headers_timeout_s"] + 1.5)
        closed = 0
        for sock in socks:
            sock.settimeout(0.5)
            try:
                data = sock.recv(65536)
                closed += data == b"" or data.startswith(b"HTTP/1.1 408")
            except OSError:
                closed += 1
        assert closed == 500
    finally:
        for sock in socks:
            sock.close()


# --------------------------------------------------------------------------------------------------- limits

def test_a_long_query_is_stopped_by_max_execution_time(store: Store) -> None:
    started = time.monotonic()
    status, text = store.sql("SELECT sleepEachRow(0.5) FROM numbers(20) SETTINGS max_block_size = 1")
    assert status == 408 and "(TIMEOUT_EXCEEDED)" in text
    assert time.monotonic() - started < 4


def test_a_huge_result_is_stopped_by_max_result_bytes(store: Store) -> None:
    rss = store.rss_mb()
    status, text = store.sql("SELECT number, toString(number) FROM numbers(100000000)")
    assert status == 500 and "(TOO_MANY_ROWS_OR_BYTES)" in text
    assert store.rss_mb() - rss < 200


@pytest.mark.parametrize("setting,value", [("max_execution_time", "100000"), ("max_execution_time", "0"),
                                           ("max_result_bytes", "0"), ("max_memory_usage", "99999999999999"),
                                           ("result_overflow_mode", "break")])
def test_a_url_setting_cannot_raise_a_cap(store: Store, setting: str, value: str) -> None:
    status, text = store.sql("SELECT 1", **{setting: value})
    assert status == 403 and "(SETTING_CONSTRAINT_VIOLATION)" in text and setting in text
    assert store.sql("SELECT 1", max_execution_time="1") == (200, "1\n")      # lower is fine


def test_a_settings_clause_cannot_raise_a_cap(store: Store) -> None:
    status, text = store.sql("SELECT sleepEachRow(0.5) FROM numbers(20) SETTINGS max_block_size = 1, "
                             "max_execution_time = 100000")
    assert status == 400 and "(SETTING_CONSTRAINT_VIOLATION)" in text and "max_execution_time" in text, text


def test_queries_over_the_concurrency_cap_are_answered_503_at_once(store: Store) -> None:
    statuses: list[int] = []

    def slow() -> None:
        statuses.append(store.sql("SELECT sleepEachRow(0.25) FROM numbers(6) SETTINGS max_block_size = 1")[0])

    threads = [threading.Thread(target=slow) for _ in range(LIMITS["max_concurrent_queries"])]
    for t in threads:
        t.start()
    time.sleep(0.5)
    started = time.monotonic()
    status, headers, text = store.request("POST", "/", b"SELECT 1", store.writer)
    assert status == 503 and headers["x-clickhouse-exception-code"] == "202"
    assert "(TOO_MANY_SIMULTANEOUS_QUERIES)" in text and time.monotonic() - started < 0.5
    for t in threads:
        t.join(30)
    assert statuses == [200] * LIMITS["max_concurrent_queries"]
    assert store.sql("SELECT 1") == (200, "1\n")


def test_connections_over_the_cap_are_closed_without_hurting_others(tmp_path: Path) -> None:
    with served_store(tmp_path / "capped", max_connections=8) as (config, proc):
        store = Store(config, proc.pid)
        assert_connection_over_the_cap_is_closed(store.port, cap=8)
        assert store.sql("SELECT 1") == (200, "1\n")


def test_credentials_are_created_once_and_shared(tmp_path: Path) -> None:
    config = load_config(environ={}, root=str(tmp_path), paths={"data_dir": str(tmp_path)})
    first = credentials.load(config)
    assert credentials.load(config) == first
    assert stat.S_IMODE(os.stat(credentials.path(config)).st_mode) == 0o600


def test_values_data_is_data_not_sql(store: Store) -> None:
    """An ``INSERT … VALUES`` is split at VALUES: what follows is data in the Values format, read with expressions
    off, so neither a function in it nor a statement after a ``;`` runs."""
    assert store.sql("INSERT INTO sec.t VALUES (11), (12)")[0] == 200
    assert store.sql("SELECT count() FROM sec.t WHERE x IN (11, 12)") == (200, "2\n")
    status, text = store.sql("INSERT INTO sec.t VALUES (length(file('/etc/hostname')))")
    assert status == 400 and "(SUPPORT_IS_DISABLED)" in text, text
    assert store.sql("SELECT count() FROM sec.t WHERE x NOT IN (11, 12)") == (200, "0\n")
    store.sql("INSERT INTO sec.t VALUES (13); DROP TABLE sec.t")
    assert store.sql("EXISTS TABLE sec.t") == (200, "1\n")
    store.sql("ALTER TABLE sec.t DELETE WHERE x IN (11, 12, 13) SETTINGS mutations_sync = 1")


def test_a_read_is_cancelled_when_its_client_leaves(store: Store) -> None:
    """A Native read (what clickhouse-connect asks for) whose client closes the connection is cancelled at the next
    block, not run to its end; other formats run until they end or max_execution_time stops them."""
    statement = b"SELECT sleepEachRow(0.25) FROM numbers(7) SETTINGS max_block_size = 1 FORMAT Native"
    head = f"POST / HTTP/1.1\r\n{store.auth_head()}Content-Length: {len(statement)}\r\n\r\n".encode()
    log = store.config.data_dir / "store.log"
    seen = log.read_text().count("while its query ran")
    with store.raw(head + statement):
        time.sleep(0.4)
    deadline = time.monotonic() + 5
    while log.read_text().count("while its query ran") == seen and time.monotonic() < deadline:
        time.sleep(0.1)
    line = [x for x in log.read_text().splitlines() if "while its query ran" in x][-1]
    later = float(line.split("the query ended ")[1].split(" s later")[0])
    assert later < 0.5, line
    assert store.sql("SELECT 1") == (200, "1\n")


# ------------------------------------------------------------------------- the statement split (pure, linear)

def test_the_insert_split_follows_clickhouses_rule() -> None:
    from store.server.statements import InsertSplit, split_insert

    head = b"/* c */ INSERT INTO db.t (a, b) SETTINGS async_insert = 0 FORMAT TabSeparated  \n1\t2\n"
    split = split_insert(head)
    assert isinstance(split, InsertSplit)
    assert (split.target, split.settings, split.fmt) == ("db.t (a, b)", "SETTINGS async_insert = 0", "TabSeparated")
    assert head[split.data_start:] == b"1\t2\n"
    values = split_insert(b"insert into t values (1), (2)")
    assert isinstance(values, InsertSplit) and values.fmt == "Values"
    assert split_insert(b"INSERT INTO t SELECT 1 FORMAT Native\n") is None
    assert split_insert(b"SELECT 'INSERT INTO t FORMAT TSV\n'") is None
    assert split_insert(b"INSERT INTO t (`FORMAT`, 'FORMAT') FORMAT CSV\nx") .fmt == "CSV"   # type: ignore[union-attr]
    assert split_insert(b"INSERT INTO t FORMAT TSV") is False      # the head ends inside the statement


# Texts of n units that would make a backtracking scan quadratic in n (n near max_query_size and well over it).
HOSTILE_TEXTS = {
    "spaces": lambda n: b"INSERT INTO t" + b" " * (13 * n) + b"x",
    "open parens": lambda n: b"INSERT INTO t " + b"(" * n,
    "escaped quotes": lambda n: b"INSERT INTO t '" + b"\\'" * (3 * n),
    "unclosed escapes": lambda n: b"INSERT INTO t '\\" * n,
    "comment openers": lambda n: b"INSERT INTO t " + b"/*" * (3 * n) + b"*/",
    "nested comments": lambda n: b"INSERT INTO t " + b"/*" * (3 * n) + b"*/" * (3 * n),
    "list items": lambda n: b"INSERT INTO t " + b"a," * n,
    "line comments": lambda n: b"INSERT INTO t " + b"-- x\n" * n,
}


def _scan_seconds(text: bytes) -> float:
    from store.server.errors import _error_code
    from store.server.statements import split_insert

    started = time.perf_counter()
    split_insert(text)
    _error_code("Code: 62. DB::Exception: " + text.decode() + " (SYNTAX_ERROR)")
    return time.perf_counter() - started


@pytest.mark.parametrize("shape", HOSTILE_TEXTS)
def test_the_statement_scan_is_linear(shape: str) -> None:
    """Doubling a text that would make a backtracking scan quadratic doubles the scan's time (a quadratic scan
    would quadruple it). Compared on the machine itself, so a slower machine does not fail it."""
    make = HOSTILE_TEXTS[shape]
    single = min(_scan_seconds(make(75_000)) for _ in range(2))
    double = min(_scan_seconds(make(150_000)) for _ in range(2))
    assert double < 2.5 * single + 0.05, (shape, single, double)


def test_slow_bodies_hold_no_query_slot(store: Store) -> None:
    """More clients than max_concurrent_queries send a head with the right password and then trickle their body:
    they hold connections until the body deadline (408), never a query slot, so a SELECT 1 still runs at once."""
    socks = []
    try:
        for _ in range(4 * LIMITS["max_concurrent_queries"]):
            head = f"POST / HTTP/1.1\r\n{store.auth_head()}Content-Length: 1000000\r\n\r\n"
            socks.append(store.raw(head.encode() + b"INSERT INTO sec.t FORMAT TSV\n"))
        latencies = _latencies(store, 1.0)
        assert max(latencies) < 0.5 and sorted(latencies)[len(latencies) // 2] < 0.05
        for sock in socks:
            sock.settimeout(LIMITS["http_receive_timeout_s"] + 3)
        assert {_answer(sock)[0] for sock in socks} == {408}
    finally:
        for sock in socks:
            sock.close()


def test_each_component_gets_its_roles_credentials(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from store.client import credentials_for

    embedded = load_config(environ={}, root=str(tmp_path), paths={"data_dir": str(tmp_path)})
    creds = credentials.load(embedded)
    assert credentials_for(embedded, embedded.store_url, "writer") == ("default", creds.writer_password)
    assert credentials_for(embedded, embedded.store_url, "reader") == ("reader", creds.reader_password)
    explicit = load_config(environ={"EVENTIDE_STORE__PASSWORD": '"s3cret"'}, root=str(tmp_path),
                           paths={"data_dir": str(tmp_path)})
    assert credentials_for(explicit, explicit.store_url, "writer") == ("default", "s3cret")

    server = load_config(environ={}, root=str(tmp_path), store={"url": "http://w:wpw@127.0.0.1:8123"})
    assert credentials_for(server, server.store_url, "writer") == (None, "wpw")
    with caplog.at_level("WARNING"):
        assert credentials_for(server, server.store_url, "reader") == (None, "wpw")    # no reader configured
    reader = load_config(environ={}, root=str(tmp_path), store={"url": "http://w:wpw@127.0.0.1:8123",
                                                                "reader_user": "ro", "reader_password": "rpw"})
    assert credentials_for(reader, reader.store_url, "reader") == ("ro", "rpw")
