"""One way to talk to ClickHouse for every component: an embedded chDB directory or a ClickHouse server.

Both go through clickhouse-connect (``chdb:///path`` or ``http(s)://…``), so the SQL and the calling code are the
same. chDB locks its data directory per process, so a chDB client is opened for one unit of work at a time under
an inter-process file lock (``<dir>.lock``) and closed afterwards; other processes (the job, the dashboard, a test)
take turns. A server client needs no lock.
"""

from __future__ import annotations

import fcntl
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from urllib.parse import urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from eventide.config import Config

log = logging.getLogger(__name__)


class StoreUnavailable(RuntimeError):
    """The store could not be opened; the message names the URL that was tried."""


# flock() locks belong to an open file description, so two threads of one process opening the lock file
# separately already exclude each other; the thread lock just avoids busy-polling between them.
_in_process = threading.Lock()


_embedded_opens = 0      # chDB opens by this process; each one leaks (see ``recycle_due``)


def recycle_due(config: Config) -> bool:
    """Whether this long-running process has opened the embedded store ``store.recycle_after_opens`` times and
    should exit with ``eventide.respawn.RECYCLE_EXIT`` at its next safe point to be started afresh.

    chDB (4.4) leaves 5 threads and ~8 descriptors behind per open of a directory with MergeTree tables, and only
    the end of the process gives them back. A ClickHouse server URL never needs this."""
    limit = config.store.recycle_after_opens
    due = bool(limit) and is_embedded(config.store_url) and _embedded_opens >= limit
    if due:
        log.info("recycling: the embedded store was opened %d times by this process", _embedded_opens)
    return due


def is_embedded(url: str) -> bool:
    return url.startswith("chdb:")


def _chdb_path(url: str) -> Path:
    return Path(urlparse(url).path)


@contextmanager
def _chdb_lock(path: Path, timeout_s: float) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    if not _in_process.acquire(timeout=timeout_s):
        raise StoreUnavailable(f"timed out after {timeout_s}s waiting for chDB at {path} (this process)")
    try:
        with open(path.with_name(path.name + ".lock"), "a+") as fh:
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise StoreUnavailable(
                            f"timed out after {timeout_s}s waiting for the chDB lock on {path}") from None
                    time.sleep(0.01)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
    finally:
        _in_process.release()


@contextmanager
def connect(config: Config, database: str | None = "", url: str | None = None) -> Iterator[Client]:
    """A clickhouse-connect client for one unit of work.

    ``database=""`` means the configured database; ``None`` means no default database (for ``CREATE DATABASE``).
    """
    url = url or config.store_url
    db = config.store.database if database == "" else database
    embedded = is_embedded(url)
    # chDB: one process at a time per directory; a server needs no lock.
    guard = _chdb_lock(_chdb_path(url), config.store.lock_timeout_s) if embedded else nullcontext()
    with guard:
        if embedded:
            _chdb_path(url).mkdir(parents=True, exist_ok=True)
            global _embedded_opens
            _embedded_opens += 1
        try:
            client = clickhouse_connect.get_client(dsn=url, database=db)
        except Exception as exc:
            what = f"chDB store {url}" if embedded else f"ClickHouse at {_redact(url)}"
            raise StoreUnavailable(f"cannot open {what}: {exc}") from exc
        try:
            yield client
        finally:
            client.close()


def _redact(url: str) -> str:
    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url
