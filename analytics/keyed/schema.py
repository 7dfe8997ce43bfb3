"""What the ``keyed_windows`` query's processor reads and writes: its key, its output rows and the columns that carry
a session run. Shared by the driver-side query (``analytics.keyed.query``) and the worker-side logic
(``analytics.keyed.logic``); pure."""

from __future__ import annotations

from analytics.vocabulary import LEVEL_COLUMNS, LEVEL_FIELDS

SLIDING, SESSION = "sliding", "session"
# The grouping key is one column, a JSON array [family, app, kind, name, series_tags] (a session bucket's: its number
# as the name, and its app empty when the buckets are shared by the apps, analytics.keyed.layout), and the payload is as
# narrow as the logic allows: every column crosses into Python row by row in PySpark's transformWithStateInPandas
# serializer, so every column is paid per row (docs/performance.md#the-python-stateful-operator).
KEY = "key"
OUTPUT_SCHEMA = ", ".join([
    "row_type string", "window_kind string", "app string", "kind string", "name string", "series_tags string",
    "window_start_ms long", "window_end_ms long", "event_time_ms long", "source_partition int",
    "source_offset long", "event_id string", "device string", "watermark_ms long", "lateness_ms long",
    "event_count long", "value_count long", "sum double", "min double", "max double", "metric_count long",
    "log_count long", *[f"{c} long" for c in LEVEL_FIELDS], "run_last_ms long",
])
# A session row stands for a run of its key's events (analytics.keyed.runs); these input columns carry the run.
RUN_LAST, RUN_EVENTS = "run_last_ms", "run_events"
RUN_LEVELS = tuple(f"run_{level}" for level in LEVEL_COLUMNS)
DROPPED_RUN = "dropped_run"   # output row: a run of session events dropped whole, expanded by the writer
# Output rows of sessions in progress (analytics.keyed.sessions.OpenSessions): an open session as it stands after the
# batch, and the start of one that is no longer open under that start (merged into a run that starts earlier).
OPEN_SESSION, OPEN_SESSION_GONE = "open_session", "open_session_gone"
SESSION_KEY = "\x1e"   # joins key kind (user | device) and key in a bucket's session keys
ID_SEPARATOR = "\x1f"
