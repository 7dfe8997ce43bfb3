"""A page script only draws: every query a page runs is in its data function (``dashboard/data/``), and the
benchmark times those same functions, so what it measures cannot drift from what the pages run (it had: its copy of
the Overview lacked the records-lost-to-retention query, its Alerts the failed deliveries, every page the freshness
batches).

Checked on the source: a page script and the helpers the pages share never name a function that takes or gives a
store client, nor a way to open one (``store.client.connect``, ``queries.concurrently``, ``dashboard.data``'s
``Reader``): they reach the store only through ``common.page_data`` and a data function.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dashboard import queries
from dashboard.data.reader import Reader
from store.client import connect

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "dashboard"
VIEWS = sorted((DASHBOARD / "views").glob("*.py"))
DRAWING = [*VIEWS, *(DASHBOARD / name for name in ("common.py", "live.py", "app.py", "sign_in.py",
                                                    "auth_secrets.py"))]
"""The dashboard's drawing side: everything but its query layer (``queries``, ``log_search``, ``data/``)."""
BENCHES = [ROOT / "bench" / "dashboard_pages.py", ROOT / "bench" / "log_search.py"]
OPENERS = (connect, queries.concurrently, Reader)
ALLOWED = {("common.py", "Reader"), ("live.py", "Reader")}
"""``common.page_data`` hands a page's data function its reader; ``live.read_when_changed`` takes a data function,
typed by the reader it is given."""
_CLIENT = re.compile(r"\bClient\b")
_missing = object()


def _bound(tree: ast.AST) -> dict[str, Any]:
    """The names the source's imports bind (at any depth), and what each is."""
    bound: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)     # ``import a.b`` binds ``a``, with ``a.b`` loaded
                name = alias.asname or alias.name.split(".")[0]
                bound[name] = sys.modules[alias.name if alias.asname else name]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            module = importlib.import_module(node.module)
            for alias in node.names:
                try:
                    bound[alias.asname or alias.name] = getattr(module, alias.name)
                except AttributeError:
                    bound[alias.asname or alias.name] = importlib.import_module(f"{node.module}.{alias.name}")
    return bound


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None for anything else (a call's result, a subscript)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def named(source: str) -> dict[str, Any]:
    """Every imported object the source names (``queries.app_rates``, ``connect``, ``common.page_data``), by the
    dotted name it uses. A name the imported module lacks is left out (it would fail when the page runs)."""
    tree = ast.parse(source)
    bound = _bound(tree)
    found: dict[str, Any] = {}
    for node in ast.walk(tree):
        parts = _dotted(node) if isinstance(node, ast.Attribute | ast.Name) else None
        if not parts or parts[0] not in bound:
            continue
        obj = bound[parts[0]]
        for part in parts[1:]:
            obj = getattr(obj, part, _missing)
            if obj is _missing:
                break
        else:
            found[".".join(parts)] = obj
    return found


def reaches_store(obj: Any) -> bool:
    """Whether ``obj`` runs or opens a store query: one of :data:`OPENERS`, a ClickHouse client class, or a function
    taking or giving a client (as every query of ``dashboard.queries``, ``dashboard.log_search`` and
    ``store.pipeline`` does)."""
    if isinstance(obj, ModuleType) or (isinstance(obj, type) and issubclass(obj, BaseException)):
        return False
    if any(obj is opener for opener in OPENERS) or (getattr(obj, "__module__", None) or "").startswith(
            "clickhouse_connect"):
        return True
    if not callable(obj):
        return False
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return False
    annotations = [p.annotation for p in signature.parameters.values()] + [signature.return_annotation]
    return any(_CLIENT.search(str(a)) for a in annotations if a is not inspect.Parameter.empty)


def store_calls(path: Path, source: str | None = None) -> list[str]:
    """The names in ``path``'s source (or ``source``) that reach the store, but for :data:`ALLOWED`."""
    return sorted(name for name, obj in named(source if source is not None else path.read_text()).items()
                  if reaches_store(obj) and (path.name, name) not in ALLOWED)


def data_functions(source: str) -> set[str]:
    """The ``dashboard.data`` functions the source names, as module.function."""
    return {f"{obj.__module__}.{obj.__name__}" for obj in named(source).values()
            if inspect.isfunction(obj) and obj.__module__.startswith("dashboard.data.")
            and obj.__module__ != "dashboard.data.reader"}


def test_the_check_recognises_each_way_to_the_store():
    page = Path("overview.py")
    assert store_calls(page, "from dashboard import queries\ndef f(c):\n    return queries.app_rates(c, 1, 2, 3, 4)"
                       ) == ["queries.app_rates"]
    assert store_calls(page, "from store import pipeline\nx = pipeline.watermarks") == ["pipeline.watermarks"]
    assert store_calls(page, "from dashboard.log_search import count_lines\ncount_lines") == ["count_lines"]
    assert store_calls(page, "from store.client import connect\nwith connect(config) as c: pass") == ["connect"]
    assert store_calls(page, "import dashboard.queries\ndashboard.queries.concurrently(config, {})") == [
        "dashboard.queries.concurrently"]
    assert store_calls(page, "from dashboard.data.reader import Reader\nReader(config).one('x', f)") == ["Reader"]
    assert store_calls(page, "from clickhouse_connect.driver.client import Client\nc: Client") == ["Client"]
    # Through a data function, or with constants and pure helpers of the query layer: no store call here.
    assert store_calls(page, "from dashboard import common, queries\nfrom dashboard.data.overview import "
                             "overview_data\ncommon.page_data(config, overview_data, 1, 2)\nqueries.DISTRIBUTION_ROWS"
                             "\nqueries.resolutions_s([60000])") == []


@pytest.mark.parametrize("path", DRAWING, ids=lambda p: str(p.relative_to(DASHBOARD)))
def test_the_drawing_side_runs_no_query_of_its_own(path: Path):
    """A query added to a page without its data function fails here: the benchmark would not see it."""
    assert store_calls(path) == [], f"{path.relative_to(ROOT)} reaches the store itself: move it to dashboard/data/"


@pytest.mark.parametrize("path", VIEWS, ids=lambda p: p.name)
def test_every_page_reads_through_its_data_functions(path: Path):
    source = path.read_text()
    # Directly, or through dashboard.live, which hands the data function to common.page_data.
    reads = "common.page_data(" in source or "last_minutes_when_new(" in source
    assert reads and data_functions(source), f"{path.name} calls no dashboard.data function"


def test_the_benchmark_times_every_data_function_a_page_calls():
    pages = set().union(*(data_functions(path.read_text()) for path in VIEWS))
    timed = set().union(*(data_functions(path.read_text()) for path in BENCHES))
    assert len(pages) >= 10, pages     # the harness found the pages' calls
    assert pages <= timed, f"not in the benchmark: {sorted(pages - timed)}"
