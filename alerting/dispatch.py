"""Group notifications against the store: the current alerts from the evaluator's transitions, what each receiver
was last sent (``alert_group_notifications``, ``sql/0017_alert_groups.sql``), and the notifications a flush
decided, stored for delivery (:mod:`alerting.delivery` sends them, one thread per receiver).

The grouping itself is :mod:`alerting.grouping`, pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from alerting.alertmanager import Alert, fingerprint, label_set, postable_alerts, webhook_message
from alerting.grouping import Dispatcher, GroupNotification, KnownAlert, Sent, group_key, routed_to
from alerting.rules import AlertRules
from alerting.silences import load as silences_of
from alerting.silences import muting
from eventide.config import Config
from eventide.envelope import ms_of, utc_of
from store.client import connect

PUSHED = "alertmanager"
"""The group key of the rows that hold what an Alertmanager receiver was sent (its alerts are not grouped here)."""
RESOLVED_RETENTION_MS = 15 * 60 * 1000
"""How long a resolved alert is still sent to an Alertmanager (Prometheus' 15 minutes), so a lost request does not
leave it firing there until its ``endsAt``."""
COLUMNS = ["notification_key", "receiver", "group_key", "status", "firing", "resolved", "alerts", "body",
           "decided_at"]



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
        notes = json.loads(notes or "{}")
        # generatorURL: where the alert came from, as Prometheus links its expression; here, the Alerts page.
        alerts.append(KnownAlert(Alert(labels, notes, ms_of(fired), ms_of(last) if state == "resolved" else None,
                                       generator_url=notes.get("dashboard_url", "")), ms_of(recorded)))
    return alerts


def last_sent(client: Client) -> dict[tuple[str, str], Sent]:
    """What each receiver was last notified of, per group."""
    rows = client.query(
        "SELECT receiver, group_key, argMax(firing, decided_at), argMax(resolved, decided_at), max(decided_at) "
        "FROM alert_group_notifications FINAL GROUP BY receiver, group_key").result_rows
    return {(r, g): Sent(frozenset(f), frozenset(s), ms_of(at)) for r, g, f, s, at in rows}


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


@dataclass(frozen=True)
class _Pushed:
    at_ms: int
    firing: frozenset[str]


class GroupNotifier:
    """The routes of one rules file, run once per evaluation pass and whenever something falls due
    (:meth:`flush`): webhook receivers get group notifications (:mod:`alerting.grouping`); Alertmanager receivers
    get their alerts, sent again every ``resend_interval`` and at once when one fires or resolves. Alerts an active
    silence matches are left out (:mod:`alerting.silences`)."""

    def __init__(self, config: Config, rules: AlertRules) -> None:
        tree = rules.routing_tree
        assert tree is not None, "a rules file without [routing] groups nothing"
        self.config, self.rules, self.tree = config, rules, tree
        send_resolved = {r.name: r.send_resolved for r in rules.receiver}
        self.alertmanagers = {r.name: r.alertmanager for r in rules.receiver if r.alertmanager is not None}
        self.dispatcher = Dispatcher(tree, lambda name: send_resolved.get(name, True),
                                     grouped=lambda name: name not in self.alertmanagers)
        self._pushed: dict[str, _Pushed] = {}

    def next_due_ms(self) -> int | None:
        """When a group or an Alertmanager resend falls due (None: nothing waits)."""
        due = [self.dispatcher.next_flush_ms(), *(
            p.at_ms + round(self.alertmanagers[name].resend_interval * 1000) for name, p in self._pushed.items())]
        return min((d for d in due if d is not None), default=None)

    def flush(self, now_ms: int) -> int:
        """Flush the groups and resends that are due; stores what each receiver is sent (and recorded-only
        group notifications); returns how many rows."""
        with connect(self.config, role="reader") as client:
            alerts, sent, silences = current_alerts(client), last_sent(client), silences_of(client, now_ms)
        # A silenced alert is left out, as Alertmanager's mute stage leaves it out: nothing about it is sent.
        alerts = [k for k in alerts if not muting(silences, k.alert.labels, now_ms)]
        rows = stored_rows(self.rules, self.dispatcher.flush(alerts, sent, now_ms)) + self._pushes(alerts, now_ms)
        if rows:
            with connect(self.config) as writer:
                writer.insert("alert_group_notifications", rows, column_names=COLUMNS)
        return len(rows)

    def _pushes(self, alerts: list[KnownAlert], now_ms: int) -> list[list[Any]]:
        rows = []
        for name, target in self.alertmanagers.items():
            mine = [k.alert for k in routed_to(self.tree, name, alerts)
                    if k.alert.status == "firing" or k.known_at_ms >= now_ms - RESOLVED_RETENTION_MS]
            firing = frozenset(a.fingerprint for a in mine if a.status == "firing")
            last = self._pushed.get(name)
            resend_ms = round(target.resend_interval * 1000)
            if not mine or (last is not None and last.firing == firing and now_ms < last.at_ms + resend_ms):
                continue
            # Valid for four resends, as Prometheus does: a few lost requests do not resolve it there.
            valid_until = now_ms + 4 * max(resend_ms, round(self.config.alerting.evaluation_interval_s * 1000))
            body = postable_alerts(mine, valid_until)
            rows.append([f"{name}|{PUSHED}|{now_ms}", name, PUSHED, "firing" if firing else "resolved",
                         sorted(firing), sorted(a.fingerprint for a in mine if a.status == "resolved"), len(mine),
                         json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")),
                         datetime.fromtimestamp(now_ms / 1000, UTC)])
            self._pushed[name] = _Pushed(now_ms, firing)
        return rows


def notification_status(rules: AlertRules, labels: dict[str, str], firing: bool, known_at_ms: int,
                        sent: dict[tuple[str, str], Sent], silenced: list[str], now_ms: int) -> str:
    """Where an alert's notification stands, in words, for the Alerts page: per receiver its routes reach, sent
    (and when the repeat is due), waiting for ``group_wait``, grouped (joins the group's next notification after
    ``group_interval``), or held by a silence. ``labels``: the alert's; ``known_at_ms``: when its newest transition
    was recorded; ``sent``: :func:`last_sent`; ``silenced``: the ids of the silences muting it now."""
    tree = rules.routing_tree
    if tree is None:
        return "per-transition channels only (the rules file has no [routing])"
    if silenced:
        return f"silenced ({', '.join(s[:8] for s in silenced)}): not sent to receivers"
    alertmanagers = {r.name for r in rules.receiver if r.alertmanager is not None}
    send_resolved = {r.name: r.send_resolved for r in rules.receiver}
    fp = fingerprint(labels)
    parts = []
    for route in tree.routes_for(labels):
        name = route.receiver
        if name in alertmanagers:
            last = sent.get((name, PUSHED))
            known = last is not None and fp in (last.firing if firing else last.resolved)
            parts.append(f"{name}: {'sent' if known else 'sent at the next push'} to Alertmanager"
                         + (f" {_clock(last.at_ms)}" if known and last is not None else ""))
            continue
        last = sent.get((name, group_key(route, labels)))
        if firing and last is not None and fp in last.firing:
            repeat = last.at_ms + round(route.repeat_interval_s * 1000)
            parts.append(f"{name}: sent {_clock(last.at_ms)}; repeated "
                         + (f"at {_clock(repeat)} if still firing (repeat_interval)" if repeat > now_ms
                            else "at the group's next flush"))
        elif firing and (last is None or not last.firing):
            due = known_at_ms + round(route.group_wait_s * 1000)
            parts.append(f"{name}: " + (f"waiting for group_wait, until {_clock(due)}" if due > now_ms
                                        else "due at the group's next flush"))
        elif firing:
            assert last is not None
            due = last.at_ms + round(route.group_interval_s * 1000)
            parts.append(f"{name}: joined a notified group; in its next notification"
                         + (f", at {_clock(due)} (group_interval)" if due > now_ms else ", at its next flush"))
        elif last is not None and fp in last.resolved:
            parts.append(f"{name}: resolution " + ("sent" if send_resolved.get(name, True) else "recorded "
                                                   "(send_resolved off)") + f" {_clock(last.at_ms)}")
        elif last is not None and fp in last.firing:
            parts.append(f"{name}: resolution due at the group's next flush")
        else:
            parts.append(f"{name}: never notified (resolved before its group was sent)")
    return "; ".join(parts) or "no route reaches a receiver"


def current_groups(rules: AlertRules, alerts: list[tuple[dict[str, str], bool]],
                   sent: dict[tuple[str, str], Sent]) -> list[dict[str, Any]]:
    """The groups the current alerts form under ``rules``' routes, for the Alerts page: per receiver and group,
    its labels, how many of its alerts fire, how many resolved that the receiver still knows as firing (its next
    notification clears them), and when it was last notified of the group and of how many firing alerts.
    ``alerts``: (labels, firing) of each alert not silenced; ``sent``: :func:`last_sent`. A group with neither
    is over. An Alertmanager receiver's alerts are one row (Alertmanager groups them itself)."""
    tree = rules.routing_tree
    if tree is None:
        return []
    alertmanagers = {r.name for r in rules.receiver if r.alertmanager is not None}
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for labels, firing in alerts:
        for route in tree.routes_for(labels):
            grouped = route.receiver not in alertmanagers
            key = group_key(route, labels) if grouped else PUSHED
            last = sent.get((route.receiver, key))
            if not firing and (last is None or fingerprint(labels) not in last.firing):
                continue
            group = groups.setdefault((route.receiver, key), {
                "receiver": route.receiver, "group": label_set(route.group_labels(labels)) if grouped
                else "(Alertmanager groups them)", "firing": 0, "to_clear": 0,
                "last_notified": utc_of(last.at_ms) if last is not None else None,
                "firing_notified": len(last.firing) if last is not None else 0})
            group["firing" if firing else "to_clear"] += 1
    return [groups[key] for key in sorted(groups)]


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S UTC")


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
    rows = [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]
    # An Alertmanager is sent the newest of its alerts only: an older request would set them back.
    newest_push = [r for r in rows if r["series"] == PUSHED][-1:]
    return [r for r in rows if r["series"] != PUSHED] + newest_push
