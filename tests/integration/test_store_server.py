"""``eventide store serve``: one process owns the chDB directory and serves ClickHouse's HTTP interface, so every
component uses clickhouse-connect's ``http://`` client, as against a ClickHouse server.

Real chDB, real HTTP, real clickhouse-connect; the server runs as its own process (``python -m store.server``).
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import clickhouse_connect
import pytest
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError
from datasketches import kll_doubles_sketch

from eventide.config import Config, load_config, to_environ
from stack.services import free_port
from store.client import connect
from store.migrations import apply_migrations
from tests.support.pipeline import wait_until
from tests.support.stack import REPO, own_database, served_store, writer_url

TABLE = "CREATE TABLE IF NOT EXISTS {name} (key UInt64, batch UInt32, sketch String) ENGINE = MergeTree ORDER BY key"


@pytest.fixture
def config(tmp_path: Path, store_url: str) -> Config:
    return load_config(environ={}, root=str(tmp_path), store={"url": store_url, "database": own_database("srv")})


@pytest.fixture
def client(config: Config) -> Iterator[Client]:
    with connect(config, database=None) as admin:
        admin.command(f"CREATE DATABASE {config.store.database}")
    with connect(config) as c:
        c.command(TABLE.format(name="t"))
        yield c


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_query_and_insert_round_trip_keeps_sketch_bytes(client: Client) -> None:
    sketch = kll_doubles_sketch(200)
    for v in range(1, 1001):
        sketch.update(float(v))
    raw = sketch.serialize()
    assert b"\x00" in raw or any(b > 127 for b in raw)          # not text: it must survive as bytes
    summary = client.insert("t", [[1, 7, raw], [2, 7, b"\xff\xfe"]], column_names=["key", "batch", "sketch"])
    assert summary.written_rows == 2

    rows = client.query("SELECT key, sketch FROM t ORDER BY key", column_formats={"sketch": "bytes"}).result_rows
    assert rows == [(1, raw), (2, b"\xff\xfe")]
    assert kll_doubles_sketch.deserialize(rows[0][1]).get_quantile(0.5) == pytest.approx(500, abs=15)
    assert client.command("SELECT count() FROM t WHERE batch = {b:UInt32}", parameters={"b": 7}) == 2
    assert client.query_df("SELECT key FROM t ORDER BY key")["key"].tolist() == [1, 2]
    assert client.query_arrow("SELECT key FROM t WHERE key > 1").num_rows == 1


def test_settings_apply_to_their_request_only(client: Client) -> None:
    default = client.command("SELECT getSetting('max_threads')")
    assert client.command("SELECT getSetting('max_threads')", settings={"max_threads": 3}) == 3
    assert client.command("SELECT getSetting('max_threads')") == default
    with pytest.raises(DatabaseError) as refused:   # SET would change a pooled handle for later requests: refused
        client.command("SET max_threads = 2")
    assert refused.value.code == 497
    assert client.command("SELECT getSetting('max_threads')") == default


def test_a_malformed_query_gets_clickhouses_error_text_and_code(client: Client, store_url: str) -> None:
    with pytest.raises(DatabaseError) as syntax:
        client.query("SELEC key FROM t")
    assert syntax.value.code == 62
    assert "Code: 62. DB::Exception: Syntax error" in str(syntax.value) and "(SYNTAX_ERROR)" in str(syntax.value)
    with pytest.raises(DatabaseError) as missing:
        client.query("SELECT * FROM no_such_table")
    assert missing.value.code == 60 and "(UNKNOWN_TABLE)" in str(missing.value)

    # The HTTP status is ClickHouse's for the code (exceptionCodeToHTTPStatus), with the code in a header.
    for sql, status, code in (("SELEC 1", 400, "62"), ("SELECT * FROM system.no_such_table", 404, "60"),
                              ("SELECT throwIf(1)", 500, "395")):
        request = _authorized(store_url, sql.encode())
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(request, timeout=10)
        assert (answer.value.code, answer.value.headers["X-ClickHouse-Exception-Code"]) == (status, code)
        assert answer.value.read().decode().startswith(f"Code: {code}. DB::Exception: ")
    assert client.command("SELECT 1") == 1


def _authorized(url: str, body: bytes) -> urllib.request.Request:
    """A POST of ``body`` to ``url`` with the credentials the URL carries sent as Basic auth (urllib sends none)."""
    parsed = urlparse(url)
    token = base64.b64encode(f"{parsed.username}:{parsed.password}".encode()).decode()
    return urllib.request.Request(f"http://{parsed.hostname}:{parsed.port}/", data=body, method="POST",
                                  headers={"Authorization": f"Basic {token}"})


def _half_request(url: str, database: str, chunked: bool) -> bytes:
    """Send the headers and half of the body of an insert, then close the sending side; returns what the server
    answered before it closed the connection (waiting for that close is the barrier: the request is over)."""
    parsed = urlparse(url)
    statement = b"INSERT INTO t (key, batch, sketch) FORMAT TabSeparated\n"
    head = f"Host: {parsed.hostname}:{parsed.port}\r\nX-ClickHouse-User: {parsed.username}\r\n" \
           f"X-ClickHouse-Key: {parsed.password}\r\nX-ClickHouse-Database: {database}\r\n"
    with socket.create_connection((parsed.hostname, parsed.port), timeout=10) as sock:
        if chunked:
            sock.sendall(b"POST / HTTP/1.1\r\n" + head.encode() + b"Transfer-Encoding: chunked\r\n\r\n"
                         + f"{len(statement):x}\r\n".encode() + statement + b"\r\n" + b"400\r\n1\t1\tabc\n")
        else:
            sock.sendall(b"POST / HTTP/1.1\r\n" + head.encode() + b"Content-Length: 100000\r\n\r\n" + statement
                         + b"2\t1\t")
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def test_a_client_that_disconnects_mid_request_changes_nothing(tmp_path: Path) -> None:
    with served_store(tmp_path / "store") as (config, _):
        config = config.model_copy(update={"store": config.store.model_copy(update={"database": "gone"})})
        apply_migrations(config)
        with connect(config) as client:
            client.command(TABLE.format(name="t"))
            for chunked in (False, True):
                answer = _half_request(writer_url(config), "gone", chunked)
                assert not answer.startswith(b"HTTP/1.1 200"), answer
            # Not a sleep: wait until both requests are over, which shows either as the line the server logs once
            # the handler of a request whose client left has ended, or as a row written.

            def gone() -> int:
                return (tmp_path / "store" / "store.log").read_text().count("went away mid-request")

            def written() -> int:
                return client.command("SELECT count() FROM t")

            wait_until(lambda: gone() == 2 or written() > 0, timeout_s=10)
            assert (written(), gone()) == (0, 2)                     # nothing of the half-sent inserts was written
            client.insert("t", [[3, 1, b"ok"]], column_names=["key", "batch", "sketch"])
            assert client.command("SELECT count() FROM t") == 1


def test_concurrent_readers_and_writers(client: Client, config: Config) -> None:
    writers, batches, rows = 4, 25, 200
    errors: list[BaseException] = []
    done = threading.Event()
    reads: list[int] = []

    def write(w: int) -> None:
        try:
            with connect(config) as c:
                for b in range(batches):
                    base = (w * batches + b) * rows
                    c.insert("t", [[base + i, w * batches + b, b"x"] for i in range(rows)],
                             column_names=["key", "batch", "sketch"])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def read() -> None:
        try:
            last = 0
            with connect(config) as c:
                while not done.is_set():
                    count, batches_seen = c.query("SELECT count(), uniqExact(batch) FROM t").result_rows[0]
                    assert count == batches_seen * rows, "an insert was seen half written"
                    assert count >= last, "a row that was seen disappeared"
                    last = count
                    reads.append(count)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers + threads:
        t.start()
    for t in threads:
        t.join(120)
    done.set()
    for t in readers:
        t.join(30)
    assert errors == []
    total = writers * batches * rows
    assert client.query("SELECT count(), uniqExact(key), uniqExact(batch) FROM t").result_rows == [
        (total, total, writers * batches)]
    assert len(set(reads)) > 1           # the readers ran while the writers wrote


def test_an_acknowledged_insert_survives_a_crash(tmp_path: Path) -> None:
    data = tmp_path / "store"
    with served_store(data) as (config, proc):
        config = config.model_copy(update={"store": config.store.model_copy(update={"database": "crash"})})
        apply_migrations(config)
        with connect(config) as c:
            c.command(TABLE.format(name="t"))
            c.insert("t", [[42, 1, b"acknowledged"]], column_names=["key", "batch", "sketch"])
        proc.send_signal(signal.SIGKILL)            # no clean shutdown: right after the answer
        proc.wait(10)
    with served_store(data) as (again, _):
        again = again.model_copy(update={"store": again.store.model_copy(update={"database": "crash"})})
        with connect(again) as c:
            assert c.query("SELECT key, sketch FROM t", column_formats={"sketch": "bytes"}).result_rows == [
                (42, b"acknowledged")]
            assert "0001" in c.command("SELECT min(name) FROM schema_migrations")


def test_a_configured_password_is_required(tmp_path: Path) -> None:
    with served_store(tmp_path / "store", password="s3cret") as (config, _):
        for wrong in ("", "guess"):
            with pytest.raises(DatabaseError) as denied:
                clickhouse_connect.get_client(dsn=config.store_url, password=wrong)
            assert denied.value.code == 516 and "(AUTHENTICATION_FAILED)" in str(denied.value)
        request = urllib.request.Request(config.store_url, data=b"SELECT 1", method="POST")
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(request, timeout=10)
        assert answer.value.code == 403
        with connect(config, database=None) as c:          # store.password from the config
            assert c.command("SELECT 1") == 1


def test_threads_and_descriptors_stay_flat_and_sigterm_closes_chdb_cleanly(tmp_path: Path) -> None:
    with served_store(tmp_path / "store") as (config, proc):
        config = config.model_copy(update={"store": config.store.model_copy(update={"database": "flat"})})
        apply_migrations(config)

        def work(rounds: int) -> None:
            for _ in range(rounds):
                with connect(config) as c:       # a client per unit of work, as the components do
                    c.insert("t", [[time.monotonic_ns(), 1, b"x"]], column_names=["key", "batch", "sketch"])
                    c.query("SELECT count(), max(key) FROM t")

        with connect(config) as c:
            c.command(TABLE.format(name="t"))
        work(50)                                  # warm-up: chDB's pools, the server's keep-alive threads
        threads, descriptors = _threads(proc.pid), _descriptors(proc.pid)
        work(300)
        assert _threads(proc.pid) <= threads + 4, (threads, _threads(proc.pid))
        assert _descriptors(proc.pid) <= descriptors + 8, (descriptors, _descriptors(proc.pid))

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert "chDB closed" in (tmp_path / "store" / "store.log").read_text()


def test_a_second_server_on_the_same_directory_refuses_to_start(tmp_path: Path) -> None:
    with served_store(tmp_path / "store") as (config, _):
        second = config.model_copy(update={"store": config.store.model_copy(update={"port": free_port()})})
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("EVENTIDE_")}, **to_environ(second)}
        done = subprocess.run([sys.executable, "-m", "store.server"], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode != 0 and "already served by another process" in done.stderr
