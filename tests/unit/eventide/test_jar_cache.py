"""Processes resolving the same jars into one cache at once (``./run test``'s side-by-side workers on a fresh clone, a
demo started beside the tests): one of them downloads, the others wait for it and take its jars."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from eventide import jars
from eventide.config import Config, load_config

ARTIFACTS = [jars.Artifact("org.example", "thing", "1.0")]


def test_given_four_callers_at_once_on_an_empty_cache_then_one_downloads_and_all_get_its_jars(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = load_config(environ={}, root=str(tmp_path), paths={"cache_dir": str(tmp_path / "cache")})
    downloads: list[str] = []
    at_once = {"now": 0, "most": 0}
    counting = threading.Lock()

    def download(config: Config, name: str, artifacts: list[jars.Artifact]) -> list[Path]:
        with counting:
            at_once["now"] += 1
            at_once["most"] = max(at_once["most"], at_once["now"])
        time.sleep(0.2)   # Ivy takes its time: every caller is waiting by now
        target = jars._target(config, name, artifacts)
        target.mkdir(parents=True)
        (target / "thing-1.0.jar").write_bytes(b"jar")
        (target / jars.MANIFEST).write_text(json.dumps({"jars": ["thing-1.0.jar"]}))
        downloads.append(name)
        with counting:
            at_once["now"] -= 1
        return [target / "thing-1.0.jar"]

    monkeypatch.setattr(jars, "_download", download)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: jars.resolve(config, "thing", ARTIFACTS), range(4)))

    assert downloads == ["thing"] and at_once["most"] == 1
    assert all(found == results[0] for found in results)
    assert results[0][0].read_bytes() == b"jar"
