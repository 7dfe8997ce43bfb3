"""How long after an app sends something a user sees it on the dashboard (issue 50's "on the page" figure).

Starts the whole local stack as ``./run demo`` does (broker, store, stream job, demo load, alerting, gateway,
dashboard) on free ports and a new data directory, waits until the job has stored its first batches, then every
``--every`` seconds (on a page left open, plus a random part of its refresh interval) sends one probe through the
SDK, and measures in a headless Chromium tab the seconds from the SDK call until the page shows it (``--page``):

- ``logs``: a line with a word never sent before; the Logs page searching that word (opened anew for each probe,
  the search following new lines, refreshing every second) lists it;
- ``overview``: one metric event of an app never seen before; the Overview, left open and refreshing at the
  configured ``dashboard.refresh_s``, lists the app in its "Events/s per app" chart (a tumbling window row).

Kafka's acknowledgement of each probe (the SDK's ``flush``) is reported too, and when a query of the store first
finds it (polled between the page's checks): the pipeline's part is until stored, the dashboard's (its refresh,
queries and drawing) the rest.

    .venv/bin/python -m bench.page_freshness --page overview --probes 30 --every 10

Prints JSON: each probe's seconds (acknowledged, stored, shown), and p50 / p95 / max of each. A probe not shown within
``--timeout`` seconds counts as missing (reported, never as a figure).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.harness import REPO
from bench.process_counts import CHROMIUM, CHROMIUM_ARGS
from eventide.config import Config, load_config, to_environ
from ingest.sdk import Client
from stack import cli
from stack.services import free_port

if TYPE_CHECKING:
    from playwright.sync_api import Page

PROBE_APP = "freshness-probe"
SETTLE_MS = 10_000
"""How long a page left open is given to load and draw before its first probe."""


def demo_config() -> Config:
    """A new data directory and free ports for every service, also in this process's environment: the services
    the launcher starts read their configuration from it."""
    data = Path(tempfile.mkdtemp(prefix="eventide-page-freshness-"))
    config = load_config(environ={}, root=str(REPO), paths={"data_dir": str(data), "cache_dir": str(REPO / ".cache")},
                         kafka={"port": free_port(), "controller_port": free_port()}, store={"port": free_port()},
                         dashboard={"port": free_port()}, gateway={"port": free_port()}, otlp={"port": free_port()})
    os.environ.update(to_environ(config))
    return config


def _stored_batches(config: Config) -> int:
    from store.client import connect

    with connect(config) as client:
        return int(client.query("SELECT count() FROM pipeline_progress").result_rows[0][0])


def _stored(config: Config, word: str) -> bool:
    """Whether the store's ``logs`` table has the probe's line (the query a user's search would run, simplified)."""
    from store.client import connect

    with connect(config) as client:
        return bool(client.query("SELECT count() FROM logs WHERE app = {app:String} AND hasToken(message, {w:String})",
                                 parameters={"app": PROBE_APP, "w": word}).result_rows[0][0])


def wait_for_job(config: Config, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if _stored_batches(config) >= 3:
                return
        except Exception:   # the store or its tables not there yet
            pass
        time.sleep(2)
    raise SystemExit(f"the job stored no batches within {timeout_s:.0f} s")


def _percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {"n": len(ordered), "p50": round(statistics.median(ordered), 2),
            "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2), "max": round(ordered[-1], 2)}


@dataclass(frozen=True)
class Watched:
    """A page a probe is watched on: what it sends, and how the store and the page show it."""

    url: str
    """Path and query, ``{word}`` standing for the probe's distinctive word."""
    opened_per_probe: bool
    """Whether the page is opened anew for each probe (a search) or stays open, refreshing, as a user leaves it."""
    app: Callable[[str], str]
    """The app a probe is sent as, from its word."""
    send: Callable[[Client, int, str], None]
    stored: Callable[[Config, str], bool]
    shown: Callable[[Page, str], bool]


def _app_in_windows(config: Config, word: str) -> bool:
    """Whether a tumbling window row of the probe's app is stored (what the Overview's rates chart reads)."""
    from store.client import connect

    with connect(config) as client:
        return bool(client.query("SELECT count() FROM window_aggregates WHERE window_kind = 'tumbling' "
                                 "AND app = {app:String}", parameters={"app": word}).result_rows[0][0])


PAGES = {
    # The search follows new lines, refreshing every second; the table is drawn on a canvas, and its caption says
    # how many lines match the word: none until the line is stored.
    "logs": Watched("/logs?minutes=15&refresh=1&follow=1&q={word}", True, lambda word: PROBE_APP,
                    lambda client, i, word: client.log("info", f"freshness probe {i} {word}"), _stored,
                    lambda page, word: page.get_by_text("lines match · newest", exact=False).count() > 0),
    # An app never seen before: the "Events/s per app" chart's legend lists it once its tumbling row is read. The
    # page refreshes at the configured interval (dashboard.refresh_s).
    "overview": Watched("/overview?minutes=15", False, lambda word: word,
                        lambda client, i, word: client.metric("freshness_probe", float(i)), _app_in_windows,
                        lambda page, word: page.locator("text.legendtext", has_text=word).count() > 0),
}


def measure(config: Config, watched: Watched, probes: int, every_s: float, timeout_s: float) -> dict[str, Any]:
    """Send ``probes`` distinct probes ``every_s`` apart and time each until the ``watched`` page shows it."""
    from playwright.sync_api import sync_playwright

    url = cli.dashboard_url(config)
    results: list[dict[str, Any]] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        words = [f"probe{uuid.uuid4().hex[:12]}" for _ in range(probes)]

        # No health reports: nothing but the probe may be sent under its app (the Overview watches for the app).
        quiet = config.model_copy(update={"sdk": config.sdk.model_copy(update={"health_interval_s": 0.0})})

        def client_of(word: str) -> Client:
            return Client(watched.app(word), "probe-device", config=quiet)

        # Each probe's client is made a probe ahead: a new idempotent producer spends its first ~0.5 s connecting
        # and getting its producer id, which an app pays once, not per event.
        ahead = client_of(words[0])
        for i, word in enumerate(words):
            if watched.opened_per_probe or i == 0:
                page.goto(url + watched.url.format(word=word))
                page.wait_for_selector('[data-testid="stSidebar"]', timeout=30_000)
                if not watched.opened_per_probe:
                    page.wait_for_timeout(SETTLE_MS)   # the first load's drawing is over: the page is left open
            client, ahead = ahead, client_of(words[i + 1]) if i + 1 < probes else None
            sent = time.monotonic()
            watched.send(client, i, word)
            client.flush(timeout_s=30)
            acknowledged = time.monotonic() - sent
            shown = stored = None
            deadline = sent + timeout_s
            while time.monotonic() < deadline:
                if stored is None and watched.stored(config, word):
                    stored = time.monotonic() - sent
                if watched.shown(page, word):
                    shown = time.monotonic() - sent
                    break
                page.wait_for_timeout(100)
            client.close()
            results.append({"probe": i, "acknowledged_s": round(acknowledged, 2),
                            "stored_s": None if stored is None else round(stored, 2),
                            "shown_s": None if shown is None else round(shown, 2)})
            print(json.dumps(results[-1]), flush=True)
            # A page left open refreshes on its own clock: a probe at a random point of its interval samples every
            # phase, where probes exactly every_s apart (a multiple of it) would all wait the same.
            jitter_s = 0.0 if watched.opened_per_probe else random.uniform(0.0, config.dashboard.refresh_s)
            time.sleep(max(0.0, every_s + jitter_s - (time.monotonic() - sent)))
        browser.close()
    shown_s = [r["shown_s"] for r in results if r["shown_s"] is not None]
    return {"probes": results, "acknowledged": _percentiles([r["acknowledged_s"] for r in results]),
            "stored": _percentiles([r["stored_s"] for r in results if r["stored_s"] is not None]),
            "shown": _percentiles(shown_s), "missing": sum(r["shown_s"] is None for r in results),
            "trigger_interval_s": config.stream.trigger_interval_s,
            "accept_interval_s": config.stream.accept_interval,
            "refresh_s": 1 if watched.opened_per_probe else config.dashboard.refresh_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--page", choices=sorted(PAGES), default="logs")
    parser.add_argument("--probes", type=int, default=30)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between probes")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a probe may take before it is missing")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds of demo load before the first probe")
    args = parser.parse_args()
    config = demo_config()
    try:
        cli.demo(config)
        wait_for_job(config, timeout_s=300)
        time.sleep(args.warmup)
        summary = measure(config, PAGES[args.page], args.probes, args.every, args.timeout)
    finally:
        cli.stack_down(config)
        shutil.rmtree(config.data_dir, ignore_errors=True)
    print(json.dumps({"page": args.page} | {k: v for k, v in summary.items() if k != "probes"}, indent=1))


if __name__ == "__main__":
    main()
