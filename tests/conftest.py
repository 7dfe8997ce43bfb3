"""The suite's layout: ``tests/unit`` (no broker, no Spark session, no store process: ``pytest tests/unit`` is the
fast loop), ``tests/integration`` (every test marked ``integration``: it runs on the real stack) and
``tests/support`` (shared helpers). The fixtures that start the real stack live in ``tests/support/stack.py``."""

pytest_plugins = ["tests.support.stack"]
