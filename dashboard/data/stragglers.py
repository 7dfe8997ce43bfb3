"""The Stragglers & clocks page's data: what the watermark dropped and how late it was, the windows late events
corrected, and each device's clock offset."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandas as pd

from dashboard import queries
from dashboard.data.reader import Reader, batches_and_buckets


@dataclass(frozen=True)
class StragglersData:
    """What the Stragglers & clocks page shows for a range."""

    batches: dict[str, datetime]
    resolution_s: int
    dropped: pd.DataFrame
    """Distinct events dropped per bucket and window kind (``queries.dropped_stragglers``)."""
    lateness: pd.DataFrame
    """Lateness of the newest dropped contributions (``queries.straggler_lateness``)."""
    worst_windows: pd.DataFrame
    """The windows that lost the most events (``queries.straggler_windows``)."""
    clocks: pd.DataFrame
    """Each device's latest clock offset, worst first (``queries.device_clock_offsets``)."""
    corrected: pd.DataFrame
    """Windows re-published with late events per bucket and window kind (``queries.corrections_published``)."""


def stragglers_data(reader: Reader, since: datetime, until: datetime) -> StragglersData:
    """The page's queries over ``[since, until)``: the freshness batches beside the window lengths (which set the
    bucket), then the five tables side by side."""
    batches, _, resolution = batches_and_buckets(reader, since, until)
    data = reader.together(
        dropped=lambda c: queries.dropped_stragglers(c, since, until, resolution),
        lateness=lambda c: queries.straggler_lateness(c, since, until),
        worst_windows=lambda c: queries.straggler_windows(c, since, until),
        clocks=lambda c: queries.device_clock_offsets(c, since, until),
        corrected=lambda c: queries.corrections_published(c, since, until, resolution))
    return StragglersData(batches, resolution, data["dropped"], data["lateness"], data["worst_windows"],
                          data["clocks"], data["corrected"])
