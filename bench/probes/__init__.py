"""One-off investigations: each answered a question behind a decision of docs/performance.md ("Decisions"), and
is kept so the question can be asked again (e.g. after a Spark upgrade), not to track a goal.
``.venv/bin/python -m bench.probes.<name>``.

- ``accept_stages``: where ``accept``'s Spark time goes, stage by stage (which step of the validation to attack;
  "Validation: one parse and a fast path").
- ``dedup_cost``: what the driver's dedup costs per batch against a large horizon ("Dedup in the driver"; the
  goal itself, dedup's share of the job's throughput, is ``bench.pipeline --phases full,nodedup``).
- ``session_bucket``: loading and saving one session bucket's state row per key and batch, lazily and key by key,
  by the bucket's size ("The trigger: no shorter than the readers' batch").
- ``stateful_overhead``: the floor of Spark's Python stateful operators with a processor that does nothing,
  ``transformWithStateInPandas`` against ``applyInPandasWithState`` ("The Python stateful operator").
- ``tws_input``: PySpark's input loader for ``transformWithStateInPandas`` against ours
  (``analytics.spark.tws_input``; "The Python stateful operator").
"""
