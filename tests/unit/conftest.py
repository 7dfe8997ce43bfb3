"""Unit tests start no broker, no Spark session and no store process, so ``pytest tests/unit`` stays a fast loop.
A test here asking for a fixture that starts one fails collection, naming the folder it belongs in."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
STARTERS = frozenset({"kafka", "spark", "stack", "store_url", "base_config"})
"""The fixtures of tests/support/stack.py that start a broker, a Spark session or a store server."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A conftest's hook sees the whole session's items, not only this folder's.
    for item in items:
        if HERE not in item.path.parents:
            continue
        started = STARTERS.intersection(getattr(item, "fixturenames", ()))
        if started or item.get_closest_marker("integration"):
            raise pytest.UsageError(f"{item.nodeid} starts {sorted(started) or 'the stack'}: "
                                    "it belongs in tests/integration")
