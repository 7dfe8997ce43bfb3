"""The Alerts page's data: where each (rule, series) stands, the transitions of a range and the notifications
given up in it. (The rules themselves come from the rules file, not the store: ``alerting.rules.load_rules``.)"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

import pandas as pd

from alerting.silences import from_row, muting
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
    silences: pd.DataFrame
    """Silences active or pending now (``queries.silences``), with their ``state``."""
    sent: pd.DataFrame
    """What receivers were sent in the range (``queries.group_notifications``)."""


def alerts_data(reader: Reader, since: datetime, until: datetime) -> AlertsData:
    """The page's queries over ``[since, until)``, side by side; each state is marked with the silences muting it
    now (``silenced``: their ids)."""
    now = datetime.now(UTC)
    data = reader.together(batches=pipeline.last_batches, states=queries.alert_states,
                           labels=queries.alert_labels, silences=lambda c: queries.silences(c, now),
                           history=lambda c: queries.alert_history(c, since, until),
                           failures=lambda c: queries.failed_deliveries(c, since, until),
                           sent=lambda c: queries.group_notifications(c, since, until))
    found = [from_row(*row) for row in data["silences"].itertuples(index=False)]
    at = int(now.timestamp() * 1000)
    labels = {(r.rule, r.series): json.loads(r.labels or "{}") for r in data["labels"].itertuples()}
    states = data["states"]
    if not states.empty:
        states = states.assign(silenced=[", ".join(muting(found, labels.get((r.rule, r.series), {}), at))
                                         for r in states.itertuples()])
    shown = data["silences"]
    if not shown.empty:
        shown = shown.assign(state=[s.state(at) for s in found],
                             matchers=[" ".join(m) for m in shown["matchers"]])
    return AlertsData(data["batches"], states, data["history"], data["failures"], shown, data["sent"])

