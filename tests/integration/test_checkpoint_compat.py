"""A job upgraded in place resumes from the checkpoints the previous version wrote (docs/operations.md, "Upgrading").

Query names, state names and the accepted-events log are the checkpoints' contract; module paths are not (Spark
stores no Python code in a checkpoint). Checked against a real earlier version: the commit before ``analytics/`` was
split into stage packages and the ``logs`` table was added, run from its own tree, then this version on the same
topics, store and checkpoints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import pytest

from eventide.config import to_environ
from tests.support.pipeline import Event, minute_in_past, produce_events, rows, run_job
from tests.support.stack import REPO, fresh_stack

pytestmark = pytest.mark.integration
PREVIOUS_VERSION = "4736cb8"
"""The last commit with the flat ``analytics/`` layout (before the logs table)."""
S = 1000


def previous_tree(target: Path) -> Path:
    """The files of ``PREVIOUS_VERSION`` (from this clone's history) under ``target``."""
    archive = subprocess.run(["git", "archive", "--format=tar", PREVIOUS_VERSION], cwd=REPO, capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target


def run_previous_job(tree: Path, environ: dict[str, str]) -> None:
    """``python -m analytics.job --until-idle`` of the previous version: its own modules first on the path."""
    # The previous configuration model refuses settings it does not know (those added since): only the fields its own
    # sections declare are passed (a field name alone is not enough: `dashboard.password` came after `store.password`).
    known = json.loads(subprocess.run(
        [sys.executable, "-c", "import json\nfrom eventide.config import Config\n"
         "print(json.dumps({n: list(getattr(f.annotation, 'model_fields', {}))\n"
         "                  for n, f in Config.model_fields.items()}))"],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, check=True).stdout)
    prefix = "EVENTIDE_"
    env = {k: v for k, v in environ.items()
           if k.startswith(prefix) and "__" in k
           and k[len(prefix):].split("__", 1)[1].lower() in known.get(k[len(prefix):].split("__", 1)[0].lower(), [])}
    done = subprocess.run([sys.executable, "-m", "analytics.job", "--until-idle"], cwd=tree,
                          env={**os.environ, **env, "PYTHONPATH": str(tree)}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_given_checkpoints_of_the_previous_version_then_this_version_resumes_where_it_stopped(
        kafka, spark, request, tmp_path):
    config = fresh_stack(kafka, request.node.name)
    t0 = minute_in_past()
    before = [Event(t0 + i * S, float(i), user="ann") for i in range(1, 4)]
    produce_events(config, before)
    run_previous_job(previous_tree(tmp_path / "previous"), to_environ(config))
    commits = {q: len(list((config.checkpoint_dir / q / "commits").glob("[0-9]*")))
               for q in ("accept", "windows", "keyed_windows")}
    assert all(commits.values()), commits

    after = [Event(t0 + i * S, float(i), user="ann") for i in range(4, 6)]
    log_line = Event(t0 + 6 * S, None, level="error")
    produce_events(config, [*after, log_line, Event(t0 + 600 * S, 0.0, device="flush")])
    run_job(spark, config)

    # Each event once: the first three from the previous version's batches, the rest from this one's, none again.
    [window] = rows(config, "SELECT sum(event_count) AS n, sum(sum) AS total FROM window_aggregates FINAL "
                            f"WHERE window_kind = 'tumbling' AND window_length_ms = 10000 AND window_start < "
                            f"fromUnixTimestamp64Milli({t0 + 60 * S})")
    assert (window["n"], window["total"]) == (6, 15.0)
    [session] = rows(config, "SELECT event_count FROM sessions FINAL WHERE session_key = 'ann'")
    assert session["event_count"] == 5
    assert [r["message"] for r in rows(config, "SELECT message FROM logs")] == ["m"]
    assert {q: len(list((config.checkpoint_dir / q / "commits").glob("[0-9]*"))) > n
            for q, n in commits.items()} == dict.fromkeys(commits, True)
