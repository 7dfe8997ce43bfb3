"""The CLI refuses a bad configuration before it starts anything, naming the field."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.stack import REPO


def test_bad_config_stops_the_cli_with_the_field_name():
    done = subprocess.run([sys.executable, "-m", "stack.cli", "stack", "status"],
                          env={**os.environ, "EVENTIDE_KAFKA__PORT": "70000"}, capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert done.returncode == 2
    assert "kafka.port" in done.stderr
