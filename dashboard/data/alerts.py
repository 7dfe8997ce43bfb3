"""The Alerts page's data: where each (rule, series) stands, the transitions of a range and the notifications
given up in it. (The rules themselves come from the rules file, not the store: ``alerting.rules.load_rules``.)"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from alerting.dispatch import current_groups, last_sent, notification_status
from alerting.grouping import Sent
from alerting.rules import AlertRules
from alerting.silences import from_row, muting
from dashboard import queries
from dashboard.data.reader import Reader
from eventide.envelope import ms_of
from store import pipeline


@dataclass(frozen=True)
class AlertsData:
    """What the Alerts page shows from the store for a range."""

    batches: dict[str, datetime]
    states: pd.DataFrame
    """The current state of every (rule, series), firing first (``queries.alert_states``), with the silences muting
    it (``silenced``) and where its notification to receivers stands (``notified``,
    ``alerting.dispatch.notification_status``)."""
    history: pd.DataFrame
    """Transitions with their window end in the range (``queries.alert_history``)."""
    failures: pd.DataFrame
    """Notifications given up in the range (``queries.failed_deliveries``)."""
    silences: pd.DataFrame
    """Silences active or pending now (``queries.silences``), with their ``state``."""
    sent: pd.DataFrame
    """What receivers were sent in the range (``queries.group_notifications``)."""
    groups: pd.DataFrame
    """The groups the current alerts form under the routes (``alerting.dispatch.current_groups``); silenced alerts
    are in none, as they are sent nowhere."""


def alerts_data(reader: Reader, since: datetime, until: datetime, rules: AlertRules | None = None) -> AlertsData:
    """The page's queries over ``[since, until)``, side by side; each state is marked with the silences muting it
    now (``silenced``: their ids) and, for a firing or resolved alert, where its notification stands under
    ``rules``' routes (``notified``)."""
    now = datetime.now(UTC)
    data = reader.together(batches=pipeline.last_batches, states=queries.alert_states,
                           labels=queries.alert_labels, silences=lambda c: queries.silences(c, now),
                           history=lambda c: queries.alert_history(c, since, until),
                           failures=lambda c: queries.failed_deliveries(c, since, until),
                           sent=lambda c: queries.group_notifications(c, since, until), last_sent=last_sent)
    found = [from_row(*row) for row in data["silences"].itertuples(index=False)]
    at = int(now.timestamp() * 1000)
    known = {(r.rule, r.series): r for r in data["labels"].itertuples()}
    states = data["states"]
    if not states.empty:
        muted = [muting(found, _labels(known.get((r.rule, r.series))), at) for r in states.itertuples()]
        states = states.assign(silenced=[", ".join(m) for m in muted], notified=[
            _notified(rules or AlertRules(), known.get((r.rule, r.series)), data["last_sent"], m, at)
            for r, m in zip(states.itertuples(), muted, strict=True)])
    shown = data["silences"]
    if not shown.empty:
        shown = shown.assign(state=[s.state(at) for s in found],
                             matchers=[" ".join(m) for m in shown["matchers"]])
    current = [(labels, row.to_state == "firing") for row in known.values()
               if not muting(found, labels := _labels(row), at)]
    groups = pd.DataFrame(current_groups(rules or AlertRules(), current, data["last_sent"]),
                          columns=["receiver", "group", "firing", "to_clear", "last_notified", "firing_notified"])
    return AlertsData(data["batches"], states, data["history"], data["failures"], shown, data["sent"], groups)


def _labels(row: Any) -> dict[str, str]:
    """An alert's labels as its newest notified transition has them; one stored before labels were (sql/0016)
    has its rule's name, as the dispatcher reads it (``alerting.dispatch.current_alerts``)."""
    if row is None:
        return {}
    return json.loads(row.labels or "{}") or {"alertname": str(row.rule)}


def _notified(rules: AlertRules, row: Any, sent: dict[tuple[str, str], Sent], silenced: list[str], at: int) -> str:
    """Where the notification of the alert whose newest notified transition is ``row`` stands; "" for one that
    never fired."""
    if row is None:
        return ""
    return notification_status(rules, _labels(row), row.to_state == "firing", ms_of(row.known_at), sent, silenced,
                               at)
