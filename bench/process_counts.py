"""Threads and descriptors of every process of a running local stack, sampled over time (issue 11).

Reads the stack's pid files (``<data_dir>/run/*.pid``) and follows each service's child processes (the job's JVM
and Python workers). Prints one JSON line per sample: ``{"at": …, "<service>:<pid>:<program>": [threads, fds]}``.
``--tab URL`` keeps one headless Chromium tab open on the dashboard's Overview (auto-refresh) meanwhile, so the
dashboard queries the store as it does for a user.

    ./run demo        # e.g. with EVENTIDE_PATHS__DATA_DIR and ports of its own
    .venv/bin/python -m bench.process_counts --every 60 --minutes 25 --tab http://127.0.0.1:8501
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
import time
from pathlib import Path

from eventide.config import load_config

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                parent = int(fh.read().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            found.append(int(entry))
    return found


def _counts(pid: int) -> tuple[int, int] | None:
    try:
        return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _program(pid: int) -> str:
    try:
        return Path(open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0].decode()).name
    except (OSError, IndexError):
        return "?"


def sample(run_dir: Path) -> dict[str, object]:
    out: dict[str, object] = {"at": time.strftime("%H:%M:%S")}
    for pid_file in sorted(run_dir.glob("*.pid")):
        todo = [int(pid_file.read_text())]
        while todo:
            pid = todo.pop()
            todo.extend(_children(pid))
            counts = _counts(pid)
            if counts:
                out[f"{pid_file.stem}:{pid}:{_program(pid)}"] = list(counts)
    return out


def _keep_tab_open(url: str, stop: threading.Event) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{url}/overview?minutes=15")
        while not stop.wait(5):
            pass
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=float, default=60, help="seconds between samples")
    parser.add_argument("--minutes", type=float, default=25)
    parser.add_argument("--tab", help="dashboard URL to keep open in a headless browser meanwhile")
    args = parser.parse_args()
    run_dir = load_config().data_dir / "run"
    stop = threading.Event()
    tab = threading.Thread(target=_keep_tab_open, args=(args.tab, stop), daemon=True) if args.tab else None
    if tab:
        tab.start()
    end = time.monotonic() + args.minutes * 60
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            print(json.dumps(sample(run_dir)), flush=True)
            if time.monotonic() + args.every > end:
                break
            time.sleep(args.every)
    stop.set()
    if tab:
        tab.join(30)


if __name__ == "__main__":
    main()
