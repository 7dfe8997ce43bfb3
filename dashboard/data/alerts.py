"""The Alerts page's data: where each (rule, series) stands, the transitions of a range and the notifications
given up in it. (The rules themselves come from the rules file, not the store: ``alerting.rules.load_rules``.)"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandas as pd

from dashboard import queries
from dashboard.data.reader import Reader
from store import pipeline


@dataclass(frozen=True)
class AlertsData:
    """What the Alerts page shows from the store for a range."""

    batches: dict[str, datetime]
    states: pd.DataFrame
    """The current state of every (rule, series), firing first (``queries.alert_states``)."""
    history: pd.DataFrame
    """Transitions with their window end in the range (``queries.alert_history``)."""
    failures: pd.DataFrame
    """Notifications given up in the range (``queries.failed_deliveries``)."""


def alerts_data(reader: Reader, since: datetime, until: datetime) -> AlertsData:
    """The page's queries over ``[since, until)``, side by side."""
    data = reader.together(batches=pipeline.last_batches, states=queries.alert_states,
                           history=lambda c: queries.alert_history(c, since, until),
                           failures=lambda c: queries.failed_deliveries(c, since, until))
    return AlertsData(data["batches"], data["states"], data["history"], data["failures"])
