"""What an open dashboard tab costs the machine the stack runs on: cores busy by part of the demo stack, with no tab
and with one headless Chromium tab on a page at a refresh interval.

Starts the whole local stack as ``./run demo`` does (on free ports and a new data directory, as
``bench.page_freshness``), lets the demo run ``--warmup`` seconds, then samples ``/proc`` for ``--seconds`` per case.
On a laptop the browser runs beside the stack, as here; in production only the dashboard server's and the store's
share lands on the servers.

    .venv/bin/python -m bench.tab_cost --warmup 180 --seconds 40

Prints JSON: per case, the cores each part kept busy (chromium, dashboard, store, job JVM, job Python workers, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

from bench.page_freshness import demo_config, wait_for_job
from bench.process_counts import CHROMIUM, CHROMIUM_ARGS
from stack import cli

CASES = (("overview, refresh 2 s", "/?refresh=2"), ("overview, refresh off", "/?refresh=off"),
         ("logs following, refresh 1 s", "/logs?minutes=15&refresh=1&follow=1&q=error"))
PARTS = (("chromium", "chromium"), ("streamlit", "dashboard"), ("store.server", "store"), ("SparkSubmit", "job JVM"),
         ("python_daemon", "job Python workers"), ("analytics.job", "job driver Python"), ("kafka", "broker"),
         ("demo_load", "demo load"), ("alerting", "alerting"), ("gateway", "gateway"))


def _cpu_ticks() -> dict[int, tuple[int, str]]:
    """Every process's user + system CPU ticks and its part of the stack."""
    ticks = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat_file, open(f"/proc/{entry}/cmdline") as command_file:
                stat, command = stat_file.read(), command_file.read().replace("\0", " ")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        part = next((name for key, name in PARTS if key in command), "other")
        ticks[int(entry)] = (int(fields[11]) + int(fields[12]), part)
    return ticks


def busy_cores(seconds: float) -> dict[str, float]:
    """Cores each part kept busy over the next ``seconds`` (processes alive at both ends)."""
    before = _cpu_ticks()
    time.sleep(seconds)
    after = _cpu_ticks()
    per_second = os.sysconf("SC_CLK_TCK") * seconds
    cores: dict[str, float] = {}
    for pid, (ticks, part) in after.items():
        if pid in before:
            cores[part] = cores.get(part, 0.0) + (ticks - before[pid][0]) / per_second
    return {part: round(c, 2) for part, c in sorted(cores.items(), key=lambda pc: -pc[1]) if c >= 0.005}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warmup", type=float, default=180.0, help="seconds of demo before the first sample")
    parser.add_argument("--seconds", type=float, default=40.0, help="sampling time per case")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds a tab is open before its sample")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    config = demo_config()
    results: dict[str, dict[str, float]] = {}
    try:
        cli.demo(config)
        wait_for_job(config, timeout_s=300)
        time.sleep(args.warmup)
        results["no tab"] = busy_cores(args.seconds)
        url = cli.dashboard_url(config)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            for name, path in CASES:
                page.goto(url + path)
                page.wait_for_selector('[data-testid="stSidebar"]', timeout=60_000)
                time.sleep(args.settle)
                results[name] = busy_cores(args.seconds)
            browser.close()
    finally:
        cli.stack_down(config)
        shutil.rmtree(config.data_dir, ignore_errors=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
