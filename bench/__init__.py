"""Benchmarks that print JSON with their command: ``.venv/bin/python -m bench.<name>`` from the checkout.

``pipeline`` is the headline one; ``harness`` is what the benches share (a stack of their own, the event mix, timed
drains). Each remaining module measures a standing goal of docs/performance.md ("Goals"); ``probes`` holds the
one-off investigations that answered a past question.
"""
