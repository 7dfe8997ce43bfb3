"""Session runs: a micro-batch's events of one session key joined wherever they are less than G apart.

The session rule (``analytics.keyed.sessions``) joins events of one (app, session key) whose gaps are under G, so the
events of a key within one batch that are less than G apart always end up in one session, or are dropped together. The
``accept`` query's task for each Kafka partition already holds the partition's accepted events of the batch, so it marks
their runs there (sorted by key and time, in array operations) before staging its file: the run's first event (the
**head**) carries the run's last time and its counts, the other events carry ``session_run_events = 0``. The
``keyed_windows`` query then sends one row per run, not per event, through Spark's Python stateful operator, whose rows
are most of its cost
(docs/performance.md#sessions-as-runs-keyed-rows-first). A run it drops is expanded back into its events by
:func:`events_of_runs` from the same batch's files: within its key and partition a run is contiguous in time, so the
key, the head's partition and ``[first, last]`` select exactly its events. Runs of one key formed in different
partitions may overlap in time; ``keyed_windows``' processor joins a key's runs less than G apart all the same
(``analytics.keyed.sessions``), so the sessions are those the events would form.

Files published before these columns existed, or with another gap than the job's, have each event stand for
itself (``keyed_windows`` checks ``session_gap_ms``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analytics.vocabulary import LEVEL_COLUMNS, epoch_ms

GAP = "session_gap_ms"            # the G the runs were formed with (the same on every row of a file)
EVENTS = "session_run_events"     # on a head: the run's events; 0 on every other event
LAST = "session_run_last_ms"      # on a head: the run's latest corrected event time (ms); null elsewhere
LEVEL_COUNTS = tuple(f"session_run_{level}" for level in LEVEL_COLUMNS)   # on a head: its logs per level
RUN_FIELDS: dict[str, pa.DataType] = {GAP: pa.int64(), EVENTS: pa.int32(), LAST: pa.int64(),
                                      **dict.fromkeys(LEVEL_COUNTS, pa.int32())}
SESSION_KINDS = ("user", "device")   # a session is keyed by the user, or by the device for events without one
EVENT_COLUMNS = ("app", "user", "device", "corrected_event_time")
"""The accepted-event columns a run is formed from."""


def session_keys(events: pa.Table) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """Each event's session key kind (``user`` | ``device``) and key (the user, else the device)."""
    user = events["user"]
    kind = pc.if_else(pc.is_valid(user), SESSION_KINDS[0], SESSION_KINDS[1])
    return kind, pc.coalesce(user, events["device"])


def with_runs(events: pa.Table, gap_ms: int) -> pa.Table:
    """``events`` (accepted events, at least :data:`EVENT_COLUMNS` and ``level``) with the run columns
    :data:`RUN_FIELDS` appended, in the same row order."""
    n = events.num_rows
    if not n:
        return _append(events, {name: pa.array([], type) for name, type in RUN_FIELDS.items()})
    t = epoch_ms(events["corrected_event_time"])
    is_user = np.asarray(pc.is_valid(events["user"]), dtype=bool)
    _, key = session_keys(events)
    app_code = _codes(events["app"])
    key_code = _codes(key)
    order = np.lexsort((t, key_code, is_user, app_code))
    t_sorted = t[order]
    starts = np.ones(n, dtype=bool)
    same_key = np.ones(n - 1, dtype=bool)
    for code in (app_code[order], is_user[order], key_code[order]):
        same_key &= code[1:] == code[:-1]
    starts[1:] = ~same_key | (t_sorted[1:] - t_sorted[:-1] >= gap_ms)
    run_start = np.flatnonzero(starts)
    run_end = np.append(run_start[1:], n)
    heads = order[run_start]
    is_head = np.zeros(n, dtype=bool)
    is_head[heads] = True

    def on_heads(values: np.ndarray, dtype: type) -> np.ndarray:
        column = np.zeros(n, dtype=dtype)
        column[heads] = values
        return column

    level = np.asarray(pc.fill_null(pc.index_in(events["level"], value_set=pa.array(LEVEL_COLUMNS)), -1),
                       dtype=np.int64)[order]
    columns = {
        GAP: pa.array(np.full(n, gap_ms, dtype=np.int64)),
        EVENTS: pa.array(on_heads(run_end - run_start, np.int32)),
        # sorted by time within a run, so its last event is its latest
        LAST: pa.array(on_heads(t_sorted[run_end - 1], np.int64), mask=~is_head),
    }
    for code, name in enumerate(LEVEL_COUNTS):
        per_run = np.add.reduceat((level == code).astype(np.int32), run_start)
        columns[name] = pa.array(on_heads(per_run, np.int32), mask=~is_head)
    return _append(events, columns)


def events_of_runs(runs: pa.Table, events: pa.Table) -> pa.Table:
    """The events of the given runs: one row per (run, event) with the run's columns and the event's.

    ``runs`` has columns ``app``, ``kind`` (``user`` | ``device``), ``name`` (the session key), ``first_ms``,
    ``last_ms`` and any others, which are carried; identical rows count once (a file without runs names each
    event as its own run, so events of one key at one time appear as one run per event). ``events`` are
    accepted events of the batch the runs were formed in (:data:`EVENT_COLUMNS`, ``partition`` when ``runs`` has
    ``head_partition``, and any others, carried; none may share a name with a column of ``runs``).

    With ``head_partition`` (the Kafka partition of the run's head) and ``run_events`` (its size) on ``runs``, a run
    takes its key's events of its head's partition within ``[first, last]`` when there are exactly ``run_events`` of
    them: a run formed within one partition (events of different partitions may then form overlapping runs of one
    key, which its partition tells apart). Otherwise (a run formed over the whole batch, one of whose events is in
    another partition, or no size known) it takes its key's events of every partition in ``[first, last]``, which
    for a run maximal over the batch are exactly its own; where both rules apply they select the same events."""
    runs = runs.group_by(runs.column_names, use_threads=False).aggregate([])
    by_partition = "head_partition" in runs.column_names and "run_events" in runs.column_names
    if by_partition:
        runs = runs.append_column("run_index", pa.array(np.arange(runs.num_rows, dtype=np.int64)))
    kind, key = session_keys(events)
    keyed = events.append_column("kind", kind).append_column("name", key).append_column(
        "t_ms", pa.array(epoch_ms(events["corrected_event_time"])))
    joined = runs.join(keyed, keys=["app", "kind", "name"], join_type="inner", use_threads=False)
    within = pc.and_(pc.greater_equal(joined["t_ms"], joined["first_ms"]),
                     pc.less_equal(joined["t_ms"], joined["last_ms"]))
    joined = joined.filter(within)
    if not by_partition:
        return joined
    run = np.asarray(joined["run_index"], dtype=np.int64)
    same = np.asarray(pc.fill_null(pc.equal(joined["partition"], joined["head_partition"]), False), dtype=bool)
    in_head_partition = np.bincount(run[same], minlength=runs.num_rows)
    size = np.asarray(pc.fill_null(runs["run_events"], -1), dtype=np.int64)
    formed_in_partition = in_head_partition == size
    return joined.filter(pa.array(same | ~formed_in_partition[run])).drop_columns(["run_index"])


def _codes(values: pa.ChunkedArray) -> np.ndarray:
    """Integer codes of a string column, equal strings equal codes (nulls share one code)."""
    whole = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    encoded = pc.dictionary_encode(whole, null_encoding="encode")
    return np.asarray(encoded.indices, dtype=np.int64)


def _append(table: pa.Table, columns: dict[str, pa.Array]) -> pa.Table:
    for name, column in columns.items():
        table = table.append_column(pa.field(name, RUN_FIELDS[name]), column)
    return table
