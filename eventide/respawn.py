"""Run a command again each time it exits asking to be restarted; any other exit ends the supervisor with it.

``python -m eventide.respawn <argv...>``: the local stack runs the stream job, the alert evaluator and the dashboard
under it so they can shed what the embedded store leaks (``store.client.recycle_due``) by exiting with
``RECYCLE_EXIT``. The Spark job resumes from its checkpoints, the evaluator from its stored states and the dashboard's
browser tabs reconnect with their view in the URL, so a restart loses nothing.
``stack down`` signals the whole process group, supervisor and child together.
"""

from __future__ import annotations

import os
import subprocess
import sys

RECYCLE_EXIT = 75     # EX_TEMPFAIL: "try again"
SUPERVISED_ENV = "EVENTIDE_RESPAWN"
"""Set to "1" in the child's environment: a process that may exit only when restarted asks :func:`supervised`."""


def supervised() -> bool:
    """Whether this process runs under :func:`supervise`, i.e. exiting with ``RECYCLE_EXIT`` starts it again."""
    return os.environ.get(SUPERVISED_ENV) == "1"


def supervise(argv: list[str]) -> int:
    """Run ``argv`` until it exits with anything but ``RECYCLE_EXIT``; return that exit code."""
    env = {**os.environ, SUPERVISED_ENV: "1"}
    while True:
        code = subprocess.call(argv, env=env)
        if code != RECYCLE_EXIT:
            return code
        print(f"respawn: {argv[0]} asked to be restarted; starting it again", file=sys.stderr, flush=True)


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: python -m eventide.respawn <command> [args...]", file=sys.stderr)
        return 2
    return supervise(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
