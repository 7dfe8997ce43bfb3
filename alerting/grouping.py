"""Grouping, as Alertmanager's dispatcher does it, pure: alerts and what each receiver was last sent in, group
notifications out.

Each alert is routed (:mod:`alerting.routes`) and joins, on every route it ends up on, the group named by its
``group_by`` labels. A group is flushed ``group_wait`` after it first appears, then every ``group_interval``. A flush
notifies the route's receiver only when Alertmanager would (its ``needsUpdate``):

- never notified before: when something fires;
- an alert fires that the last notification did not list as firing;
- every alert the receiver knew as firing has resolved (the all-clear; sent only with ``send_resolved``, but
  recorded either way, so the next firing is new again);
- with ``send_resolved``: an alert the receiver knew as firing has resolved since;
- otherwise, nothing changed: once ``repeat_interval`` has passed since the last notification.

A notification carries every firing alert of the group and, with ``send_resolved``, the resolved ones the receiver
last knew as firing. A resolved alert the receiver never heard of (it fired and resolved within one wait) is not
sent. A group with nothing firing and nothing left to clear is dropped.

What was last sent (:class:`Sent`) is kept by the caller (in the store: it survives restarts, so a restarted
dispatcher, whose groups start again, sends nothing a receiver already has before ``repeat_interval``). As in
Alertmanager, a group whose alerts were all known for longer than ``group_wait`` (after a restart) is flushed at
once rather than waiting again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from alerting.alertmanager import Alert, label_set
from alerting.routes import RouteNode


@dataclass(frozen=True)
class KnownAlert:
    """An alert and when the evaluator recorded its newest transition."""

    alert: Alert
    known_at_ms: int


@dataclass(frozen=True)
class Sent:
    """What a receiver was last notified of for one group (Alertmanager's notification log entry)."""

    firing: frozenset[str]
    """Fingerprints of the alerts notified as firing."""
    resolved: frozenset[str]
    at_ms: int


@dataclass(frozen=True)
class GroupNotification:
    """One flush's decision to notify ``receiver`` about a group."""

    receiver: str
    group_key: str
    group_labels: dict[str, str]
    alerts: tuple[Alert, ...]
    """What the receiver is sent: empty when there is nothing it wants (an all-clear without ``send_resolved``)."""
    firing: frozenset[str]
    resolved: frozenset[str]
    at_ms: int

    @property
    def key(self) -> str:
        """Identifies the notification across restarts (deliveries and failures are recorded by it)."""
        return f"{self.receiver}|{self.group_key}|{self.at_ms}"

    @property
    def status(self) -> str:
        return "firing" if self.firing else "resolved"

    def as_sent(self) -> Sent:
        return Sent(self.firing, self.resolved, self.at_ms)


def needs_update(last: Sent | None, firing: frozenset[str], resolved: frozenset[str], send_resolved: bool,
                 repeat_interval_ms: int, now_ms: int) -> bool:
    """Whether a flush notifies (Alertmanager's rules, module docstring)."""
    if last is None:
        return bool(firing)
    if not firing <= last.firing:
        return True
    if not firing:
        return bool(last.firing)
    if send_resolved and not resolved <= last.resolved:
        return True
    return last.at_ms + repeat_interval_ms <= now_ms


def group_key(route: RouteNode, labels: dict[str, str]) -> str:
    """The key of the group an alert with ``labels`` joins on ``route``: the route's key and the group's labels,
    e.g. ``{}:{alertname="slow"}`` (Alertmanager's ``groupKey``)."""
    return f"{route.key}:{label_set(route.group_labels(labels))}"


def routed_to(tree: RouteNode, receiver: str, alerts: Iterable[KnownAlert]) -> list[KnownAlert]:
    """The alerts that end up on a route of ``receiver``."""
    return [k for k in alerts if any(r.receiver == receiver for r in tree.routes_for(k.alert.labels))]


@dataclass
class _Group:
    route: RouteNode
    labels: dict[str, str]
    next_flush_ms: int


class Dispatcher:
    """The groups of one routing tree between flushes; :meth:`flush` once per pass."""

    def __init__(self, tree: RouteNode, send_resolved: Callable[[str], bool],
                 grouped: Callable[[str], bool] = lambda _receiver: True) -> None:
        self.tree = tree
        self.send_resolved = send_resolved
        self.grouped = grouped
        """Whether a receiver's alerts are grouped here (an Alertmanager receiver groups them itself)."""
        self._groups: dict[str, _Group] = {}

    def next_flush_ms(self) -> int | None:
        """When the earliest group is due (None: no group)."""
        return min((g.next_flush_ms for g in self._groups.values()), default=None)

    def waiting(self) -> dict[str, int]:
        """Each group's key and when it is next flushed (for the Alerts page)."""
        return {key: g.next_flush_ms for key, g in self._groups.items()}

    def flush(self, alerts: Iterable[KnownAlert], sent: dict[tuple[str, str], Sent],
              now_ms: int) -> list[GroupNotification]:
        """Route ``alerts`` (every current firing alert, and resolved ones) into groups and flush the groups that
        are due. ``sent``: (receiver, group key) → what it was last notified of. Returns the notifications, including
        recorded-only ones (no alerts to send), which the caller stores as the new ``sent``."""
        members: dict[str, tuple[RouteNode, dict[str, str], list[KnownAlert]]] = {}
        for known in alerts:
            for route in self.tree.routes_for(known.alert.labels):
                if not self.grouped(route.receiver):
                    continue
                labels = route.group_labels(known.alert.labels)
                key = group_key(route, known.alert.labels)
                members.setdefault(key, (route, labels, []))[2].append(known)
        decided = []
        for key in list(self._groups.keys() - members.keys()):
            del self._groups[key]
        for key, (route, labels, items) in sorted(members.items()):
            last = sent.get((route.receiver, key))
            firing = [k for k in items if k.alert.status == "firing"]
            # Only what the receiver last knew as firing has to be cleared.
            cleared = [k for k in items if k.alert.status == "resolved" and last is not None
                       and k.alert.fingerprint in last.firing]
            if not firing and not cleared:
                self._groups.pop(key, None)
                continue
            group = self._groups.get(key)
            if group is None:
                wait_ms = round(route.group_wait_s * 1000)
                settled = all(k.known_at_ms + wait_ms <= now_ms for k in firing + cleared)
                group = self._groups[key] = _Group(route, labels, now_ms if settled else now_ms + wait_ms)
            if now_ms < group.next_flush_ms:
                continue
            group.next_flush_ms = now_ms + round(route.group_interval_s * 1000)
            firing_fps = frozenset(k.alert.fingerprint for k in firing)
            cleared_fps = frozenset(k.alert.fingerprint for k in cleared)
            send_resolved = self.send_resolved(route.receiver)
            if not needs_update(last, firing_fps, cleared_fps, send_resolved,
                                round(route.repeat_interval_s * 1000), now_ms):
                continue
            shown = sorted((k.alert for k in firing + (cleared if send_resolved else [])),
                           key=lambda a: (a.starts_at_ms, label_set(a.labels)))
            decided.append(GroupNotification(route.receiver, key, labels, tuple(shown), firing_fps, cleared_fps,
                                             now_ms))
            if not firing:
                del self._groups[key]      # all clear: a new firing starts a new group (and its wait)
        return decided
