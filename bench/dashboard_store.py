"""What the dashboard benches share: a temporary store served as the dashboard meets it, and the deployment they
fill it with (its apps' loggers and the share of log lines at each level).

``bench.dashboard_pages`` times each page's data, ``bench.log_search`` the Logs page's searches; both call the
pages' own data functions (``dashboard.data``), so they time what a page waits for.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa

from eventide.config import Config, load_config
from stack.services import free_port
from store.migrations import apply_migrations
from store.server import child as served_store

REPO = Path(__file__).resolve().parent.parent
LOGS = ("app.server", "app.worker")
"""The logger names of every app (its log series)."""
LEVEL_P = (0.10, 0.70, 0.12, 0.07, 0.01)       # debug … critical: a fifth of log lines at warning or above
TS = pa.timestamp("ms", tz="UTC")


def ms(t: np.ndarray) -> pa.Array:
    """Milliseconds since the epoch as a UTC timestamp column."""
    return pa.array(t.astype(np.int64), TS)


@contextmanager
def temporary_store(keep: bool = False) -> Iterator[tuple[Config, Path]]:
    """A store served on a free port (``python -m store.server``) over a fresh chDB directory, migrated: (its
    config, its data directory). ``keep``: the directory is left behind (its path printed) instead of removed."""
    data = Path(tempfile.mkdtemp(prefix="eventide-bench-dash-"))
    try:
        config = load_config(environ={}, root=str(REPO), paths={"data_dir": str(data)},
                             store={"database": "bench", "port": free_port()})
        with served_store(config):
            apply_migrations(config)
            yield config, data
        if keep:
            print(f"\nstore kept at {data} (serve it with EVENTIDE_PATHS__DATA_DIR={data} eventide store serve)")
    finally:
        if not keep:
            shutil.rmtree(data, ignore_errors=True)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
