"""``eventide store serve``: the one process that owns the embedded chDB directory and serves ClickHouse's HTTP
interface (the subset clickhouse-connect's ``http://`` client uses) on loopback.

Why a process of its own: chDB allows one process per data directory and has no server. Opening it per unit of
work was slow and left threads and descriptors behind at every open (docs/architecture.md, "Store access";
docs/performance.md#one-store-server-dashboard-queries).
Here the engine starts once, kept alive by an anchor connection held for the life of the process, and the job,
the dashboard, the evaluator, the tests and the benches all use the code path of a production ClickHouse server.

chDB is clickhouse-local in-process: ClickHouse's access control does not apply, so this server enforces what a
ClickHouse server would (its HTTP interface, users and profiles):

- HTTP from uvicorn/h11 (request parsing, chunked bodies, keep-alive); a request's head must arrive within
  ``http_headers_timeout_s`` and its body within ``http_receive_timeout_s``; connections, concurrent queries,
  the head, the statement and the (decompressed) body are bounded (``StoreConfig``).
- Two users (``store/credentials.py``, which the clients read too): the writer ``default`` and a read-only reader
  (``readonly = 2``). The password is checked on the headers, before a byte of the body is read. GET runs with
  ``readonly = 1``.
- Requests a browser could send for a web page are refused: an ``Origin`` header, ``Sec-Fetch-Site`` cross-site
  or same-site, a ``Host`` other than the address served (DNS rebinding).
- Every statement passes ``store.server.guard`` (decided by ClickHouse's own parser): one statement, no table
  function or clause that reaches the host, no ``USE``/``SET``/temporary table; SETTINGS within the caps.
- Every query runs under ``max_execution_time``, ``max_memory_usage`` and ``max_result_bytes`` a client cannot
  raise. chDB calls block, so they run on a bounded thread pool, never on the event loop.

Requests run on chDB connection handles from a small pool. Handles to the running engine are cheap (~1 ms) and
carry session state (database, settings): a handle is reused only by requests asking for the same database and
settings, and carries only what the pool applied when it opened it, since the guard lets no statement that
changes session state through. An acknowledged insert has been committed by chDB as a part on disk.

The parts, one job each, are beside this module in ``store/server/`` (its ``__init__`` lists them); this module
puts them together and runs them.

    python -m store.server            (or: eventide store serve)
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from eventide.config import Config, load_config_or_exit
from store import credentials
from store.server.asgi import StoreApp
from store.server.connections import StoreServer, protocol
from store.server.engine import Engine
from store.server.limits import READER, WRITER, Limits

log = logging.getLogger("eventide.store.server")
DRAIN_S = 20.0
"""On SIGTERM: longest wait for requests in progress before chDB is closed."""


def users_of(config: Config) -> dict[str, tuple[str, str]]:
    """User → (password, role) of the embedded store."""
    creds = credentials.load(config)
    if creds.reader_user == credentials.WRITER_USER:
        raise RuntimeError("store.reader_user cannot be 'default' (the writer)")
    return {credentials.WRITER_USER: (creds.writer_password, WRITER),
            creds.reader_user: (creds.reader_password, READER)}


def serve(config: Config, ready: threading.Event | None = None) -> int:
    """Serve the embedded store until SIGTERM/SIGINT; then finish requests in progress and close chDB cleanly."""
    if not config.store.embedded:
        print(f"store.url is set ({config.store_url}): nothing to serve here", file=sys.stderr)
        return 2
    users = users_of(config)
    engine = Engine(config.store_data_dir)
    store = config.store
    app = StoreApp(engine, users, Limits.of(store))
    server = StoreServer(uvicorn.Config(
        app, host=store.host, port=store.port, http=protocol(store), lifespan="off", log_config=None,
        access_log=False, timeout_keep_alive=int(max(1, store.keep_alive_timeout_s)),
        h11_max_incomplete_event_size=store.http_max_field_value_size + 1024,
        timeout_graceful_shutdown=int(DRAIN_S), server_header=False, date_header=False,
        # a listen backlog of ClickHouse's size: a burst of connections queues rather than being refused
        backlog=4096), ready)
    logging.getLogger("uvicorn.error").setLevel(logging.ERROR)

    def stop(signum: int, _frame: Any) -> None:
        if not server.should_exit:
            log.info("signal %d: stopping", signum)
        server.should_exit = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("serving chDB %s (%s) at %s on http://%s:%d (pid %d)", engine.version, engine.path,
             config.store_data_dir, store.host, store.port, os.getpid())
    try:
        server.run()
    finally:
        app.shutdown()
        if not app.drain(DRAIN_S):
            log.warning("queries still running after %.0f s; closing chDB anyway", DRAIN_S)
        engine.close()
        log.info("stopped; chDB closed")
    if not server.started:
        return 1
    return 0


def _stop_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies, so a killed test run or bench leaves no server."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@contextlib.contextmanager
def child(config: Config, log: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m store.server`` over ``config``'s embedded store as a child process, until the block ends
    (then SIGTERM: chDB closes cleanly). For tests and benches that need a store of their own."""
    from eventide.config import to_environ
    from store.client import wait_until_up

    log = log or config.data_dir / "logs" / "store.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("EVENTIDE_")}, **to_environ(config)}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "store.server"], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2],
                                preexec_fn=_stop_with_parent)
    try:
        if not wait_until_up(config, config.store.start_timeout_s):
            raise RuntimeError(f"the store did not answer at {config.store_url}; see {log}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=DRAIN_S + 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run(config: Config) -> int:
    """``eventide store serve``: log to stderr (the service's log file) and serve."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return serve(config)


def main(argv: list[str] | None = None) -> int:
    """``python -m store.server [--config FILE]``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config")
    args = parser.parse_args(argv)
    return run(load_config_or_exit(args.config))
