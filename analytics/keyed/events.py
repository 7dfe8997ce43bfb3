"""The events of one key in one micro-batch, as numpy columns: the input of the per-key window logic.

The stateful processor runs once per key and micro-batch, often for a handful of events, so the per-key code
works on plain arrays; pandas is touched once on the way in and once on the way out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analytics.vocabulary import LEVEL_COLUMNS

NO_LEVEL = -1
_LEVEL_CODES = {name: i for i, name in enumerate(LEVEL_COLUMNS)}


@dataclass(frozen=True)
class Events:
    t: np.ndarray            # corrected event time, ms (int64)
    value: np.ndarray        # metric value, NaN for logs (float64)
    level: np.ndarray        # index in LEVEL_COLUMNS, NO_LEVEL for metrics (int8)
    is_log: np.ndarray       # bool
    partition: np.ndarray    # Kafka position (int32, int64): the key of every row written about the event
    offset: np.ndarray
    id: np.ndarray           # event ids (object)
    device: np.ndarray       # (object)

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> Events:
        """From columns t, metric_value, level (its name), kind, partition, offset, id, device."""
        levels = frame["level"].tolist()
        level = np.array([_LEVEL_CODES.get(x, NO_LEVEL) if isinstance(x, str) else NO_LEVEL for x in levels],
                         dtype=np.int8)
        return cls._from_columns(frame, level, (frame["kind"] == "log").to_numpy(bool))

    @classmethod
    def from_input(cls, frame: pd.DataFrame) -> Events:
        """From the stateful query's compact input (columns t, level_code, metric_value, partition, offset, id,
        device): the level arrives as its code (``NO_LEVEL`` for metrics), so no string is compared per row."""
        level = frame["level_code"].to_numpy(np.int8)
        return cls._from_columns(frame, level, level != NO_LEVEL)

    @classmethod
    def _from_columns(cls, frame: pd.DataFrame, level: np.ndarray, is_log: np.ndarray) -> Events:
        return cls(
            t=frame["t"].to_numpy(np.int64),
            value=frame["metric_value"].to_numpy(np.float64, na_value=np.nan),
            level=level,
            is_log=is_log,
            partition=frame["partition"].to_numpy(np.int32),
            offset=frame["offset"].to_numpy(np.int64),
            id=frame["id"].to_numpy(object),
            device=frame["device"].to_numpy(object),
        )

    def __len__(self) -> int:
        return len(self.t)

    def take(self, index: np.ndarray) -> Events:
        """The events at ``index`` (a boolean mask or positions)."""
        return Events(self.t[index], self.value[index], self.level[index], self.is_log[index],
                      self.partition[index], self.offset[index], self.id[index], self.device[index])
