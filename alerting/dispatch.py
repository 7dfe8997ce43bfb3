"""Group notifications against the store: the current alerts from the evaluator's transitions, what each receiver
was last sent (``alert_group_notifications``, ``sql/0017_alert_groups.sql``), and the notifications a flush
decided, stored for delivery (:mod:`alerting.delivery` sends them, one thread per receiver).

The grouping itself is :mod:`alerting.grouping`, pure.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from alerting.alertmanager import Alert, webhook_message
from alerting.grouping import Dispatcher, GroupNotification, KnownAlert, Sent
from alerting.rules import AlertRules
from eventide.config import Config
from store.client import connect

COLUMNS = ["notification_key", "receiver", "group_key", "status", "firing", "resolved", "alerts", "body",
           "decided_at"]


def _ms(ts: datetime) -> int:
    return int((ts if ts.tzinfo else ts.replace(tzinfo=UTC)).timestamp() * 1000)


def current_alerts(client: Client) -> list[KnownAlert]:
    """Every (rule, series) whose newest notified transition is ``firing`` (a firing alert since that window) or
    ``resolved`` (resolved at that window's end), with its labels and annotations."""
    rows = client.query(
        "SELECT rule, argMax(to_state, window_end), argMax(labels, window_end), argMax(annotations, window_end), "
        "maxIf(window_end, to_state = 'firing'), max(window_end), argMax(recorded_at, window_end) "
        "FROM alert_transitions FINAL WHERE notify = 1 GROUP BY rule, series").result_rows
    alerts = []
    for rule, state, labels, notes, fired, last, recorded in rows:
        # Transitions stored before labels were (sql/0016) read as {}: the rule's name still tells them apart.
        labels = json.loads(labels or "{}") or {"alertname": rule}
        alerts.append(KnownAlert(Alert(labels, json.loads(notes or "{}"), _ms(fired),
                                       _ms(last) if state == "resolved" else None), _ms(recorded)))
    return alerts


def last_sent(client: Client) -> dict[tuple[str, str], Sent]:
    """What each receiver was last notified of, per group."""
    rows = client.query(
        "SELECT receiver, group_key, argMax(firing, decided_at), argMax(resolved, decided_at), max(decided_at) "
        "FROM alert_group_notifications FINAL GROUP BY receiver, group_key").result_rows
    return {(r, g): Sent(frozenset(f), frozenset(s), _ms(at)) for r, g, f, s, at in rows}


def stored_rows(rules: AlertRules, decided: list[GroupNotification]) -> list[list[Any]]:
    """The ``alert_group_notifications`` rows of ``decided``, each with the body its receiver is sent."""
    receivers = {r.name: r for r in rules.receiver}
    rows = []
    for n in decided:
        hook = receivers[n.receiver].webhook
        body = webhook_message(n.receiver, n.group_key, n.group_labels, n.alerts,
                               max_alerts=hook.max_alerts if hook else 0)
        rows.append([n.key, n.receiver, n.group_key, n.status, sorted(n.firing), sorted(n.resolved), len(n.alerts),
                     json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")),
                     datetime.fromtimestamp(n.at_ms / 1000, UTC)])
    return rows


class GroupNotifier:
    """The grouping of one rules file's routes, run once per evaluation pass (:meth:`flush`)."""

    def __init__(self, config: Config, rules: AlertRules) -> None:
        tree = rules.routing_tree
        assert tree is not None, "a rules file without [routing] groups nothing"
        self.config, self.rules = config, rules
        send_resolved = {r.name: r.send_resolved for r in rules.receiver}
        self.dispatcher = Dispatcher(tree, lambda name: send_resolved.get(name, True))

    def flush(self, now_ms: int) -> list[GroupNotification]:
        """Flush the groups that are due; stores and returns the notifications decided (sent ones and
        recorded-only ones)."""
        with connect(self.config, role="reader") as client:
            alerts, sent = current_alerts(client), last_sent(client)
        decided = self.dispatcher.flush(alerts, sent, now_ms)
        if decided:
            with connect(self.config) as writer:
                writer.insert("alert_group_notifications", stored_rows(self.rules, decided), column_names=COLUMNS)
        return decided


def undelivered_groups(client: Client, receiver: str, channel: str) -> list[dict[str, Any]]:
    """Group notifications for ``receiver`` that its channel has neither delivered nor given up, oldest first; in
    the rows delivery reads (``transition_key``: the notification's key, ``rule``: the receiver, ``series``: the
    group key, ``to_state``: its status, ``window_end``: when it was decided)."""
    result = client.query(
        "SELECT notification_key AS transition_key, receiver AS rule, group_key AS series, status AS to_state, "
        "decided_at AS window_end, body FROM alert_group_notifications FINAL "
        "WHERE receiver = {r:String} AND alerts > 0 AND notification_key NOT IN "
        "(SELECT transition_key FROM alert_notifications FINAL WHERE channel = {c:String}) "
        "AND notification_key NOT IN "
        "(SELECT transition_key FROM alert_delivery_failures FINAL WHERE channel = {c:String}) "
        "ORDER BY decided_at, group_key", parameters={"r": receiver, "c": channel})
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]
