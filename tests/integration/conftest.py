"""Every test here runs on the real stack (Kafka broker, Spark session, store server or a child process of one of
them), so every test here is marked ``integration`` (``pytest -m "not integration"`` leaves them out)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A conftest's hook sees the whole session's items, not only this folder's.
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)
