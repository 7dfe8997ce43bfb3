"""One way to talk to ClickHouse for every component: clickhouse-connect's HTTP client.

The URL is a ClickHouse server's or, by default, the embedded store's: a chDB directory that one long-lived
process (``eventide store serve``, ``store/server.py``) keeps open and serves over ClickHouse's HTTP interface.
So the SQL, the client code and the error handling are those of production, and no process but that one ever
opens chDB (docs/architecture.md, "Store access").

Every request carries a user and password: the writer ``default`` (the job, migrations, the CLI) or, with
``connect(..., role="reader")``, the read-only user (the dashboard, the evaluator's reads). For the embedded store
both passwords come from ``store/credentials.py`` (generated on its first start) unless configured.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal
from urllib.parse import urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from eventide.config import Config

log = logging.getLogger(__name__)

PING_TIMEOUT_S = 2.0
DEFAULT_PORTS = {"http": 8123, "https": 8443}
"""ClickHouse's ports when a URL names none (as clickhouse-connect assumes)."""


class StoreUnavailable(RuntimeError):
    """The store could not be reached; the message names the URL that was tried (password redacted)."""


Role = Literal["writer", "reader"]
_warned_reader = False


def credentials_for(config: Config, url: str, role: Role) -> tuple[str | None, str]:
    """(user, password) to connect as ``role``; user None: the URL's own (or ClickHouse's ``default``).

    Embedded store: the writer ``default`` and the reader, with the configured passwords or else the ones generated
    on its first start (``store/credentials.py``). A server URL: its own user and password (or ``store.password``)
    for the writer; for the reader ``store.reader_user``/``store.reader_password``, or the writer's when no reader
    password is configured (a warning is logged once)."""
    global _warned_reader
    parsed = urlparse(url)
    if config.store.embedded and url == config.store_url and parsed.password is None:
        from store import credentials

        creds = credentials.load(config)
        if role == "reader":
            return creds.reader_user, creds.reader_password
        return credentials.WRITER_USER, creds.writer_password
    if role == "reader" and config.store.reader_password:
        return config.store.reader_user, config.store.reader_password
    if role == "reader" and not _warned_reader:
        _warned_reader = True
        log.warning("store.reader_password is empty: reading as the writer user of %s (set "
                    "EVENTIDE_STORE__READER_PASSWORD for a read-only user)", redact(url))
    return None, parsed.password if parsed.password is not None else config.store.password


IDLE_CLIENTS = 8
"""Clients kept for reuse per process: setting one up costs three queries (version, settings, protocol probe)."""
_idle: dict[tuple[str, str | None, str | None, str], list[Client]] = {}
_idle_lock = threading.Lock()


@contextmanager
def connect(config: Config, database: str | None = "", url: str | None = None,
            role: Role = "writer") -> Iterator[Client]:
    """A clickhouse-connect client for one unit of work, used by this caller alone until the block ends.

    ``database=""`` means the configured database; ``None`` means no default database (for ``CREATE DATABASE``).
    ``role="reader"``: the store's read-only user (the dashboard, the evaluator), see :func:`credentials_for`.
    Clients are reused across units of work (HTTP requests carry no session state; the connection pool is shared).
    """
    url = url or config.store_url
    db = config.store.database if database == "" else database
    user, password = credentials_for(config, url, role)
    key = (url, db, user, password)
    with _idle_lock:
        client = _idle[key].pop() if _idle.get(key) else None
    if client is None:
        try:
            client = clickhouse_connect.get_client(dsn=url, database=db, password=password,
                                                   **({"username": user} if user else {}))
        except Exception as exc:
            raise StoreUnavailable(f"cannot reach ClickHouse at {redact(url)}: {exc}") from exc
    try:
        yield client
    except BaseException:   # not reused: a failure may have left a half-read response behind
        client.close()
        raise
    with _idle_lock:
        idle = _idle.setdefault(key, [])
        if len(idle) < IDLE_CLIENTS:
            idle.append(client)
            return
    client.close()


def wait_until_up(config: Config, timeout_s: float, url: str | None = None) -> bool:
    """Whether the store answers ``/ping`` within ``timeout_s`` (e.g. just after ``store serve`` was started)."""
    import urllib.request

    parsed = urlparse(url or config.store_url)
    target = f"{parsed.scheme}://{parsed.hostname}:{parsed.port or DEFAULT_PORTS[parsed.scheme]}/ping"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(target, timeout=PING_TIMEOUT_S) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def redact(url: str) -> str:
    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url
