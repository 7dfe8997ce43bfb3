"""The Sessions page's data: sessions open now, sessions active and ended per app and bucket, and the duration and
size of each ended one."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandas as pd

from dashboard import queries
from dashboard.data.reader import Reader, batches_and_buckets


@dataclass(frozen=True)
class SessionsData:
    """What the Sessions page shows for a range (sessions active or ended in it) and now (sessions open)."""

    batches: dict[str, datetime]
    resolution_s: int
    open_per_app: pd.DataFrame
    """Sessions open now per app and the events they hold so far (``queries.open_sessions_per_app``)."""
    newest_open: pd.DataFrame
    """The open sessions with the latest events (``queries.newest_open_sessions``)."""
    active: pd.DataFrame
    """Sessions active per bucket and app, open or ended (``queries.active_sessions``)."""
    per_app: pd.DataFrame
    """Sessions ended per bucket and app (``queries.sessions_per_app``)."""
    shapes: pd.DataFrame
    """Duration and events of the newest ``queries.DISTRIBUTION_ROWS`` sessions (``queries.session_shapes``)."""

    @property
    def open_now(self) -> int:
        return int(self.open_per_app["open_sessions"].sum()) if not self.open_per_app.empty else 0


def sessions_data(reader: Reader, since: datetime, until: datetime) -> SessionsData:
    """The page's queries over ``[since, until)``: the freshness batches beside the window lengths (which set the
    bucket), then the open sessions, the active and ended ones per bucket and the ended ones' shapes side by side."""
    batches, _, resolution = batches_and_buckets(reader, since, until)
    data = reader.together(open_per_app=queries.open_sessions_per_app,
                           newest_open=queries.newest_open_sessions,
                           active=lambda c: queries.active_sessions(c, since, until, resolution),
                           per_app=lambda c: queries.sessions_per_app(c, since, until, resolution),
                           shapes=lambda c: queries.session_shapes(c, since, until))
    return SessionsData(batches, resolution, data["open_per_app"], data["newest_open"], data["active"],
                        data["per_app"], data["shapes"])
