"""Long-running processes on the embedded store restart themselves before chDB's per-open leak adds up.

chDB leaves threads and descriptors behind with every open (bench/store_opens.py); the stream job and the alert
evaluator exit with ``RECYCLE_EXIT`` after ``store.recycle_after_opens`` opens and ``eventide.respawn`` starts them
again, while any other exit ends the supervisor with the same code. (The dashboard's recycling, seen from an open
browser tab, is in tests/test_dashboard_browser.py.)
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from alerting.service import run as run_evaluator
from eventide.config import Config, load_config
from eventide.respawn import RECYCLE_EXIT, supervise
from store import client as store_client
from store.client import connect, recycle_due
from tests.conftest import fresh_stack


def test_the_supervisor_restarts_a_command_that_asks_for_it_and_ends_with_any_other_exit(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    child = tmp_path / "child.py"
    child.write_text(
        "import sys, pathlib\n"
        f"runs = pathlib.Path({str(runs)!r})\n"
        "n = len(runs.read_text()) if runs.exists() else 0\n"
        "runs.write_text('x' * (n + 1))\n"
        f"sys.exit({RECYCLE_EXIT} if n < 2 else 3)\n")
    assert supervise([sys.executable, str(child)]) == 3
    assert runs.read_text() == "xxx"           # asked twice to be restarted, then failed with 3: ran three times


def test_recycling_is_due_after_the_configured_number_of_embedded_opens(tmp_path: Path) -> None:
    opened = store_client._embedded_opens
    config = load_config(environ={}, root=str(tmp_path), store={"recycle_after_opens": opened + 2})
    with connect(config, database=None) as client:
        client.query("SELECT 1")
    assert not recycle_due(config)
    with connect(config, database=None) as client:
        client.query("SELECT 1")
    assert recycle_due(config)
    assert not recycle_due(config.model_copy(update={"store": config.store.model_copy(
        update={"recycle_after_opens": 0})}))
    server = load_config(environ={}, root=str(tmp_path), store={"url": "http://localhost:8123",
                                                                  "recycle_after_opens": 1})
    assert not recycle_due(server)             # a ClickHouse server leaks nothing


@pytest.mark.integration
def test_the_evaluator_exits_for_a_restart_once_its_opens_are_used_up(kafka: Config, tmp_path: Path) -> None:
    config = fresh_stack(kafka, "evaluator_recycle")
    rules = tmp_path / "alerts.toml"
    rules.write_text('[[rule]]\nname = "dead letters"\nwindow_s = 60\nstatistic = "dead_letters"\n'
                     'comparator = ">"\nthreshold = 10\n')
    config = config.model_copy(update={
        "alerting": config.alerting.model_copy(update={"rules_file": rules, "evaluation_interval_s": 0.1,
                                                       "alerts_topic": "alerts.evaluator_recycle"}),
        "store": config.store.model_copy(update={"recycle_after_opens": store_client._embedded_opens + 1}),
    })
    result: list[int] = []
    evaluator = threading.Thread(target=lambda: result.append(run_evaluator(config)), daemon=True)
    evaluator.start()
    evaluator.join(60)
    assert result == [RECYCLE_EXIT]
