"""The stream job's tree is its architecture (docs/architecture.md): ``analytics/`` holds one folder per stage —
``accept/`` → ``windows/`` and ``keyed/`` — the engine patches behind ``spark/``, and at its top what the stages
share (``vocabulary``, ``event_time``, ``checkpoint``, ``accepted_log``, ``sinks``) and the ``job`` that joins them.

Checked on the project's own import graph: no import circle, the stages meet only through the shared modules (and
the accepted-events log), and the rule modules import no pyspark, so they run and are tested without a JVM.

Across the whole tree: nothing in the product imports the launcher (``stack/``), the ground floor (``eventide/``)
imports no component, and ``alerting/`` has no import circle.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ANALYTICS = Path(__file__).resolve().parents[2] / "analytics"
ROOT = ANALYTICS.parent
STAGES = ("accept", "windows", "keyed")
RULES = (
    "analytics.vocabulary", "analytics.spark.checkpoint", "analytics.accepted_log", "analytics.accept.dedup",
    "analytics.accept.pacing",
    "analytics.windows.stragglers", "analytics.windows.partials", "analytics.keyed.events", "analytics.keyed.sliding",
    "analytics.keyed.sessions", "analytics.keyed.runs", "analytics.keyed.schema", "analytics.keyed.logic",
)
"""Pure rules and file formats: numpy, pyarrow, datasketches; never pyspark."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ANALYTICS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """Whether the dotted ``name`` is a module or a package of this tree."""
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imported_by(node: ast.ImportFrom) -> set[str]:
    """What ``from M import a, b`` names: ``M.a`` where that is a module or package of the tree, else ``M``."""
    return {f"{node.module}.{alias.name}" if is_module(f"{node.module}.{alias.name}") else str(node.module)
            for alias in node.names}


def within(module: str, package: str) -> bool:
    """Whether ``module`` is ``package`` or inside it."""
    return module == package or module.startswith(f"{package}.")


def imports(path: Path) -> set[str]:
    """The analytics modules ``path`` imports when it is loaded: its top-level imports, not those inside functions
    (loaded where they are used) or under ``TYPE_CHECKING`` (annotations only)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("analytics"):
            found |= imported_by(node)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("analytics")}
    return found - {"analytics"}


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in ANALYTICS.rglob("*.py")}


def assert_no_circle(graph: dict[str, set[str]]) -> None:
    """Fails naming the first import circle of ``graph`` (module -> the modules it imports)."""
    visiting: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> None:
        assert module not in visiting, f"import circle: {' -> '.join([*visiting[visiting.index(module):], module])}"
        if module in done:
            return
        visiting.append(module)
        for imported in sorted(graph.get(module, ())):
            visit(imported)
        visiting.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_the_analytics_imports_have_no_circle():
    assert_no_circle(import_graph())


def test_the_stages_meet_only_through_the_shared_modules():
    """``accept`` writes what ``windows`` and ``keyed`` read (the accepted-events log), so it may use their file
    formats (``windows.partials``, ``keyed.rows``, ``keyed.runs``); ``windows`` and ``keyed`` never import each
    other's queries or writers, and no stage imports ``job``."""
    allowed = {("accept", "windows.partials"), ("accept", "keyed.rows"), ("accept", "keyed.runs"),
               ("keyed", "windows.stragglers")}   # the straggler table's columns, shared by both queries' writers
    for module, imported in import_graph().items():
        stage = module.split(".")[1] if module.count(".") >= 2 else None
        for target in imported:
            assert target != "analytics.job", f"{module} imports the job"
            target_stage = target.split(".")[1] if target.count(".") >= 2 else None
            if stage in STAGES and target_stage in STAGES and target_stage != stage:
                assert (stage, target.removeprefix("analytics.")) in allowed, f"{module} imports {target}"


@pytest.mark.parametrize("module", RULES)
def test_a_rule_module_imports_no_pyspark(module: str):
    loaded = subprocess.run([sys.executable, "-c", f"import sys, {module}; print('pyspark' in sys.modules)"],
                            capture_output=True, text=True, check=True, cwd=ANALYTICS.parent)
    assert loaded.stdout.strip() == "False", f"{module} pulls in pyspark"


PRIVATE_SPARK_API = re.compile(
    r"\.(_jvm|_jsc|_gateway|_jlistener|_jdf|_jspark|_jconf|_jsparkSession)\b"   # the JVM behind PySpark's objects
    r"|\bJStreamingQueryListener\b|\bPythonStreamingQueryListenerWrapper\b"    # the JVM side of listeners
    r"|pyspark\.sql\.pandas\.serializers|pyspark\.java_gateway")                # workers' wire, py4j's gateway
"""What reaches into PySpark's private API: attributes holding JVM handles, the listener bridge's Java classes, the
Python workers' serializers and py4j's gateway."""


def private_spark_api(source: str) -> list[str]:
    """The private-API uses in ``source``, one per line that has any."""
    return [line.strip() for line in source.splitlines() if PRIVATE_SPARK_API.search(line)]


def test_the_private_api_check_recognises_every_marker():
    uses = ["sc._jvm.java.lang.System", "spark.sparkContext._jsc.sc()", "ensure(sc._gateway)", "self._jlistener",
            "class X(JStreamingQueryListener):", "SparkContext._jvm.PythonStreamingQueryListenerWrapper(x)",
            "from pyspark.sql.pandas.serializers import ArrowStreamSerializer",
            "from pyspark.java_gateway import ensure_callback_server_started", "df._jdf.queryExecution()"]
    assert [private_spark_api(use) for use in uses] == [[use] for use in uses]
    assert private_spark_api("from ingest import gateway\nstart_gateway(config)\nself.jvm_options = 1") == []


def test_every_engine_patch_is_behind_the_spark_fence():
    """A PySpark upgrade touches one folder: the modules that reach into Spark's internals (its Python worker
    daemon, the transformWithState input reader and output writer, the checkpoint files, the listener bridge, the
    launcher and logging) live in ``analytics/spark/``, and nothing else in the product uses Spark's private API."""
    names = {p.name for p in (ANALYTICS / "spark").iterdir()}
    assert {"settings.py", "python_daemon.py", "python.sh", "tws_input.py", "tws_output.py", "log4j2.properties",
            "checkpoint.py", "listener.py"} <= names
    fence = ANALYTICS / "spark"
    outside = {str(p.relative_to(ROOT)): uses for package in ("eventide", *COMPONENTS, LAUNCHER)
               for p in (ROOT / package).rglob("*.py")
               if fence not in p.parents and (uses := private_spark_api(p.read_text()))}
    assert not outside, f"Spark's private API used outside analytics/spark/: {outside}"


# The whole house ------------------------------------------------------------------------------------------------
# ``eventide/`` is the ground floor (configuration, jars, durable files, HTTP deadlines, redaction) that every
# component stands on; ``stack/`` is the launcher that starts them all. Imports anywhere in a file count here, also
# those inside functions: a lazy import is still a dependency.
COMPONENTS = ("ingest", "analytics", "store", "alerting", "dashboard")
LAUNCHER = "stack"


def every_import(path: Path) -> set[str]:
    """The modules ``path`` names in any import statement, at any depth (functions, ``TYPE_CHECKING`` blocks)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= imported_by(node)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def package_of(module: str) -> str:
    return module.split(".")[0]


def modules_under(package: str) -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts): p for p in (ROOT / package).rglob("*.py")}


@pytest.mark.parametrize("package", ["eventide", *COMPONENTS])
def test_nothing_in_the_product_imports_the_launcher(package: str):
    """The launcher starts the components as processes; none of them depends on how it is started."""
    offenders = {module: imported for module, path in modules_under(package).items()
                 if (imported := sorted(m for m in every_import(path) if package_of(m) == LAUNCHER))}
    assert not offenders, f"the product imports the launcher: {offenders}"


def test_the_ground_floor_imports_no_component():
    """``eventide/`` is what every component shares, so it imports none of them (nor the launcher)."""
    upward = {module: imported for module, path in modules_under("eventide").items()
              if (imported := sorted(m for m in every_import(path) if package_of(m) in (*COMPONENTS, LAUNCHER)))}
    assert not upward, f"eventide/ imports a component: {upward}"


def test_the_alerting_modules_import_no_circle():
    """Delivery schedules what notify encodes and sends: ``alerting.delivery`` imports ``alerting.notify``, never the
    reverse (also not from inside a function)."""
    modules = modules_under("alerting")
    assert_no_circle({module: {m for m in every_import(path) if m in modules and m != module}
                      for module, path in modules.items()})


STORE_SERVER = "store.server"
STORE_CLIENT_PATH = ("store.client", "store.credentials", "store.migrations", "store.pipeline", "store.range_query")
"""What the job, the dashboard and the evaluator use to reach the store: over HTTP, never the server's code."""


def test_only_the_launcher_starts_the_store_server():
    """The embedded server is a process of its own: the launcher (and the tests and benches) start it; every other
    component, and the store's own client path, reaches it over HTTP and imports nothing of ``store/server/``."""
    offenders = sorted(module for package in ("eventide", *COMPONENTS)
                       for module, path in modules_under(package).items()
                       if not within(module, STORE_SERVER)
                       and any(within(imported, STORE_SERVER) for imported in every_import(path)))
    assert not offenders, f"outside store/server/, these import the store's server: {offenders}"


def test_the_store_client_path_loads_no_engine():
    """Importing the client path loads neither chDB nor the server's HTTP stack, as a ClickHouse client would not."""
    probe = (f"import sys, {', '.join(STORE_CLIENT_PATH)}; "
             f"print(sorted(m for m in ('chdb', 'uvicorn', '{STORE_SERVER}') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert loaded.stdout.strip() == "[]", f"the store's client path loads {loaded.stdout.strip()}"


def test_ingest_and_analytics_meet_only_through_the_envelope_and_the_sdk_needs_no_gateway():
    """Kafka is the seam between the first two stages: ``ingest`` and ``analytics`` never import each other (the v1
    envelope they share is ``eventide.envelope``). Within ``ingest``, an app's SDK imports nothing of the gateway
    (a server: FastAPI, protobuf), so ``ingest.sdk`` stays light."""
    crossing = {module: imported for source, target in (("ingest", "analytics"), ("analytics", "ingest"))
                for module, path in modules_under(source).items()
                if (imported := sorted(m for m in every_import(path) if package_of(m) == target))}
    assert not crossing, f"ingest and analytics import each other: {crossing}"
    sdk_to_gateway = {module: imported for module, path in modules_under("ingest/sdk").items()
                      if (imported := sorted(m for m in every_import(path) if within(m, "ingest.gateway")))}
    assert not sdk_to_gateway, f"the SDK imports the gateway: {sdk_to_gateway}"


def test_the_dashboard_data_modules_import_no_streamlit():
    """A page's data (``dashboard/data/``) is read without drawing it: the benchmark loads it without Streamlit."""
    modules = sorted(m for m in modules_under("dashboard") if m.startswith("dashboard.data"))
    first = subprocess.run([sys.executable, "-c", "import importlib, sys\nfor m in sys.argv[1:]:\n"
                            "    importlib.import_module(m)\n    if 'streamlit' in sys.modules:\n"
                            "        print(m)\n        break", *modules],
                           capture_output=True, text=True, check=True, cwd=ROOT)
    assert len(modules) >= 7 and first.stdout.strip() == "", f"{first.stdout.strip()} pulls in streamlit"


# Floors and the test tree ---------------------------------------------------------------------------------------
FLOORS = {"eventide": 0, "ingest": 1, "store": 1, "analytics": 2, "alerting": 2, "dashboard": 3, LAUNCHER: 4}
"""The house by floors: a part imports only parts on lower floors. The ground floor is what all share; ingest (the
SDK and gateway) and the store's client path stand on it; the job and the alert evaluator write and read through the
store; the dashboard reads the store and alerting's rules; the launcher starts everything. (The data walks ingest ->
Kafka -> analytics -> store -> dashboard; the imports follow who calls whom, which is why the store's client sits
below the job.)"""


def part_imports() -> dict[str, dict[str, list[str]]]:
    """Per part of the house, the other parts it imports and from which of its modules."""
    found: dict[str, dict[str, list[str]]] = {part: {} for part in FLOORS}
    for part in FLOORS:
        for module, path in modules_under(part).items():
            for imported in every_import(path):
                other = package_of(imported)
                if other in FLOORS and other != part:
                    found[part].setdefault(other, []).append(module)
    return found


def test_every_part_of_the_house_imports_only_parts_on_lower_floors():
    upward = {f"{part} -> {other}": sorted(set(modules))
              for part, imported in part_imports().items() for other, modules in imported.items()
              if FLOORS[other] >= FLOORS[part]}
    assert not upward, f"imports that do not go down a floor: {upward}"


def test_the_whole_house_has_no_import_circle():
    modules = {module: path for part in FLOORS for module, path in modules_under(part).items()}
    assert_no_circle({module: {m for m in every_import(path) if m in modules and m != module}
                      for module, path in modules.items()})


def test_the_unit_tests_mirror_the_tree():
    """A folder of tests/unit per part of the house (and per sub-package, where the part has them), so a part's
    pure tests sit where its code does; only this file, which checks the whole house, sits at the top."""
    unit = Path(__file__).resolve().parent
    folders = [p.relative_to(unit) for p in unit.rglob("*") if p.is_dir() and p.name != "__pycache__"]
    astray = [str(f) for f in folders if not (ROOT / f).is_dir() or f.parts[0] not in FLOORS]
    assert not astray, f"tests/unit folders that are no part of the house: {astray}"
    flat = sorted(p.name for p in unit.glob("test_*.py") if p.name != Path(__file__).name)
    assert not flat, f"unit tests outside their part's folder: {flat}"
