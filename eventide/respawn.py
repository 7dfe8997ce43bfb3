"""Run a command again each time it exits asking to be restarted; any other exit ends the supervisor with it.

``python -m eventide.respawn <argv...>``: the local stack runs the stream job and the alert evaluator under it so
they can shed what the embedded store leaks (``store.client.recycle_due``) by exiting with ``RECYCLE_EXIT``. The
Spark job resumes from its checkpoints and the evaluator from its stored states, so a restart loses nothing.
``stack down`` signals the whole process group, supervisor and child together.
"""

from __future__ import annotations

import subprocess
import sys

RECYCLE_EXIT = 75     # EX_TEMPFAIL: "try again"


def supervise(argv: list[str]) -> int:
    """Run ``argv`` until it exits with anything but ``RECYCLE_EXIT``; return that exit code."""
    while True:
        code = subprocess.call(argv)
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
