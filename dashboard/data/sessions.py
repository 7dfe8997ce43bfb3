"""The Sessions page's data: sessions ended per app and bucket, and the duration and size of each."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandas as pd

from dashboard import queries
from dashboard.data.reader import Reader, batches_and_buckets


@dataclass(frozen=True)
class SessionsData:
    """What the Sessions page shows for a range (sessions that ended in it)."""

    batches: dict[str, datetime]
    resolution_s: int
    per_app: pd.DataFrame
    """Sessions ended per bucket and app (``queries.sessions_per_app``)."""
    shapes: pd.DataFrame
    """Duration and events of the newest ``queries.DISTRIBUTION_ROWS`` sessions (``queries.session_shapes``)."""


def sessions_data(reader: Reader, since: datetime, until: datetime) -> SessionsData:
    """The page's queries over ``[since, until)``: the freshness batches beside the window lengths (which set the
    bucket), then sessions per app and their shapes side by side."""
    batches, _, resolution = batches_and_buckets(reader, since, until)
    data = reader.together(per_app=lambda c: queries.sessions_per_app(c, since, until, resolution),
                           shapes=lambda c: queries.session_shapes(c, since, until))
    return SessionsData(batches, resolution, data["per_app"], data["shapes"])
