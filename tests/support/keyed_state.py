"""An in-memory stand-in for Spark's state API as the keyed windows logic meets it (``analytics.keyed.logic``'s
``StateRow``, ``Timers`` and ``BatchClock``): state rows and timers per key, driven in the order Spark's
``transformWithStateInPandas`` calls a processor in a micro-batch: ``handleInputRows`` for every key with rows, then
``handleExpiredTimer`` once per registered timer the watermark has reached (Spark deletes that timer). It counts the
calls, each of which is a round trip to Spark's JVM in a real run."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from analytics.keyed.logic import KeyedWindowsLogic


@dataclass
class InMemoryKeyedState:
    """State rows and timers per key, in the order and with the calls Spark's operator makes."""

    state: dict[tuple[str, str], object] = field(default_factory=dict)
    timers: set[tuple[str, int]] = field(default_factory=set)
    calls: Counter = field(default_factory=Counter)
    fired_with_windows: list[tuple[str, int]] = field(default_factory=list)
    key: str = ""

    def value_state(self, name: str) -> InMemoryStateRow:
        """The state row ``name`` of whichever key is current (Spark's ``getValueState``)."""
        return InMemoryStateRow(self, name)

    def registerTimer(self, at: int) -> None:   # Spark's handle API, by name
        self.calls["registerTimer"] += 1
        self.timers.add((self.key, at))

    def deleteTimer(self, at: int) -> None:
        self.calls["deleteTimer"] += 1
        self.timers.discard((self.key, at))

    def batch(self, logic: KeyedWindowsLogic, rows: dict[str, pd.DataFrame], watermark: int) -> list[pd.DataFrame]:
        """One micro-batch at ``watermark``: ``rows`` per key (JSON grouping keys), then the timers due; the
        logic's output frames in the order it gave them."""
        out = []
        values = BatchWatermark(watermark)
        for key, frame in rows.items():
            self._set_key(key)
            out += list(logic.handle_input_rows((key,), iter([frame]), values))
        for key, at in sorted(t for t in self.timers if t[1] <= watermark):
            self._set_key(key)
            emitted = list(logic.handle_expired_timer((key,), values))
            if any((frame["row_type"] == "window").any() for frame in emitted):
                self.fired_with_windows.append((key, at))
            out += emitted
            self.timers.discard((key, at))
            self.calls["deleteTimer (by Spark)"] += 1
        return out

    def _set_key(self, key: str) -> None:
        self.calls["setImplicitKey"] += 1
        self.key = key


@dataclass
class InMemoryStateRow:
    """One named state row per key, in ``spark``'s table."""

    spark: InMemoryKeyedState
    name: str

    def get(self) -> object:
        self.spark.calls["get"] += 1
        return self.spark.state.get((self.spark.key, self.name))

    def update(self, value: object) -> None:
        self.spark.calls["update"] += 1
        self.spark.state[(self.spark.key, self.name)] = value

    def clear(self) -> None:
        self.spark.calls["clear"] += 1
        self.spark.state.pop((self.spark.key, self.name), None)


@dataclass
class BatchWatermark:
    """The batch's watermark, as Spark's ``TimerValues`` gives it."""

    watermark: int

    def getCurrentWatermarkInMs(self) -> int:
        return self.watermark
