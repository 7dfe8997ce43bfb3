"""The stateful processor of the ``keyed_windows`` query, in a module whose imports are light.

Spark pickles the processor by reference to its class, so every process that runs it imports this module: the executors'
Python workers, and a driver-side process that ``transformWithStateInPandas`` starts at every start of the query only to
run :meth:`KeyedWindowsProcessor.init` (which declares the state variables). That process has pyspark's processor API
loaded already; the window logic's imports (pandas, pyarrow, the job's configuration) would be most of its start, on the
path of the query's first batch (docs/performance.md#the-python-stateful-operator). So they are imported where rows are
handled: ``analytics.keyed.logic.KeyedWindowsLogic``, in the workers only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

if TYPE_CHECKING:
    import pandas as pd

    from analytics.keyed.logic import KeyedWindowsLogic

# One state row per key: numpy arrays as raw bytes (analytics.keyed.query loads and saves them).
SLIDING_STATE = ("t binary, value binary, level binary, arrived_wm binary, pending_t binary, "
                 "pending_partition binary, pending_offset binary, pending_ids string")
SESSION_STATE = ("open_key binary, open_first binary, open_last binary, open_counts binary, closed_key binary, "
                 "closed_first binary, closed_last binary, keys string")


class KeyedWindowsProcessor(StatefulProcessor):
    """Runs in Spark's Python workers; one instance serves many keys of both families."""

    _logic: KeyedWindowsLogic | None = None

    def __init__(self, sliding_length_ms: int, session_gap_ms: int, session_memory_ms: int) -> None:
        self.sliding_length_ms = sliding_length_ms
        self.session_gap_ms = session_gap_ms
        self.session_memory_ms = session_memory_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self._logic = None   # built on first use, over this handle's state
        self.sliding_state = handle.getValueState("sliding", SLIDING_STATE)
        self.session_state = handle.getValueState("session", SESSION_STATE)
        # No longer read or written: a key's registered timer is its stored state's next due time
        # (``KeyedWindowsLogic._move_timer``). Still declared, so that checkpoints written while it was in use load.
        handle.getValueState("timer", "expiry_ms long")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        return self._rows().handle_input_rows(key, rows, timerValues)

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        return self._rows().handle_expired_timer(key, timerValues)

    def close(self) -> None:
        pass

    def _rows(self) -> KeyedWindowsLogic:
        """The window logic over this processor's state, created at the first rows or timer of the process."""
        if self._logic is None:
            from analytics.keyed.logic import KeyedWindowsLogic  # pandas and the window rules: workers only

            self._logic = KeyedWindowsLogic(self.handle, self.sliding_state, self.session_state,
                                            self.sliding_length_ms, self.session_gap_ms, self.session_memory_ms)
        return self._logic
