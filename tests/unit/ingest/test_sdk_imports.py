"""An app that imports the SDK pays for the client only: no web server, no protobuf, no Spark, no store, no
dashboard (as ``prometheus_client`` keeps its client light). Checked in a fresh interpreter, so what the test
runner itself has loaded does not hide an import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SERVER_PACKAGES = ("fastapi", "starlette", "uvicorn", "google.protobuf", "pyspark", "chdb", "streamlit", "pandas",
                   "ingest.gateway")
"""What the gateway, the stream job, the store and the dashboard run on; none of it belongs in an app's process."""

LOADED_BY_AN_APP = """
import json, sys
import ingest.sdk
client = ingest.sdk.Client(app="light", device="d-1")   # no event recorded: nothing to send
loaded = sorted({p for p in SERVER_PACKAGES for m in sys.modules if m == p or m.startswith(p + ".")})
client.close(timeout_s=1)
print(json.dumps(loaded))
"""


def server_packages_loaded_by_an_app(data_dir: Path) -> list[str]:
    """The server packages in ``sys.modules`` after ``import ingest.sdk`` and making a ``Client`` (its sender
    started against a port where no broker listens), in a new interpreter."""
    env = {**os.environ, "EVENTIDE_PATHS__DATA_DIR": str(data_dir),
           "EVENTIDE_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9"}   # the discard port: nothing answers
    script = f"SERVER_PACKAGES = {SERVER_PACKAGES!r}\n{LOADED_BY_AN_APP}"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_sdk_and_making_a_client_loads_no_server_package(tmp_path: Path) -> None:
    assert server_packages_loaded_by_an_app(tmp_path) == []
