"""Grouping and repeats, as Alertmanager's dispatcher decides them: given alerts over time, these notifications."""

from __future__ import annotations

from datetime import UTC, datetime

from alerting.alertmanager import Alert, fingerprint
from alerting.dispatch import current_groups, notification_status
from alerting.grouping import Dispatcher, GroupNotification, KnownAlert, Sent
from alerting.routes import RootRoute, Route, resolve
from alerting.rules import parse_rules

S = 1000
MINUTE = 60 * S


def alert(app: str, fired_ms: int, resolved_ms: int | None = None, rule: str = "slow") -> KnownAlert:
    labels = {"alertname": rule, "severity": "warning", "app": app}
    return KnownAlert(Alert(labels, {"summary": f"{app} slow"}, fired_ms, resolved_ms),
                      fired_ms if resolved_ms is None else resolved_ms)


class Receivers:
    """The dispatcher's caller: keeps what each receiver was last sent, as the store does."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.sent: dict[tuple[str, str], Sent] = {}
        self.notified: list[GroupNotification] = []

    def flush(self, alerts: list[KnownAlert], now_ms: int) -> list[GroupNotification]:
        decided = self.dispatcher.flush(alerts, self.sent, now_ms)
        for n in decided:
            self.sent[(n.receiver, n.group_key)] = n.as_sent()
        sent = [n for n in decided if n.alerts]
        self.notified += sent
        return sent


def grouped_by_alertname(send_resolved: bool = True) -> Receivers:
    tree = resolve(RootRoute(receiver="oncall", group_by=["alertname"], group_wait=30, group_interval=300,
                             repeat_interval=4 * 3600), [])
    return Receivers(Dispatcher(tree, lambda _receiver: send_resolved))


def test_thirty_series_breaching_one_rule_make_one_notification_after_group_wait() -> None:
    receivers = grouped_by_alertname()
    firing = [alert(f"app{i:02d}", 0) for i in range(30)]
    assert receivers.flush(firing, 0) == []                 # the group waits group_wait
    assert receivers.flush(firing, 29 * S) == []
    [notification] = receivers.flush(firing, 30 * S)
    assert len(notification.alerts) == 30 and notification.status == "firing"
    assert notification.group_labels == {"alertname": "slow"}
    assert notification.group_key == '{}:{alertname="slow"}'


def test_a_series_joining_later_is_notified_at_the_next_group_interval_and_nothing_repeats_before_its_interval(
        ) -> None:
    receivers = grouped_by_alertname()
    first = [alert(f"app{i:02d}", 0) for i in range(30)]
    receivers.flush(first, 0)
    receivers.flush(first, 30 * S)
    joined = [*first, alert("late", 60 * S)]
    assert receivers.flush(joined, 60 * S) == []            # the group was flushed at 30 s: next at 330 s
    assert receivers.flush(joined, 329 * S) == []
    [notification] = receivers.flush(joined, 330 * S)
    assert len(notification.alerts) == 31
    # Nothing changed since: no notification at each group interval, one once repeat_interval has passed.
    for t in range(630, 4 * 3600 + 330, 300):
        assert receivers.flush(joined, t * S) == [], t
    [repeat] = receivers.flush(joined, (4 * 3600 + 330) * S)
    assert len(repeat.alerts) == 31


def test_all_resolved_sends_one_resolved_notification_and_drops_the_group() -> None:
    receivers = grouped_by_alertname()
    firing = [alert(f"app{i}", 0) for i in range(3)]
    receivers.flush(firing, 30 * S)
    resolved = [alert(f"app{i}", 0, resolved_ms=100 * S) for i in range(3)]
    assert receivers.flush(resolved, 100 * S) == []         # not before the group interval
    [clear] = receivers.flush(resolved, 330 * S)
    assert clear.status == "resolved" and [a.status for a in clear.alerts] == ["resolved"] * 3
    assert receivers.flush(resolved, 630 * S) == [] and receivers.dispatcher.waiting() == {}


def test_one_resolved_among_firing_ones_is_sent_with_send_resolved_and_waits_for_the_next_change_without() -> None:
    firing = [alert("a", 0), alert("b", 0)]
    one_resolved = [alert("a", 0), alert("b", 0, resolved_ms=60 * S)]
    with_resolved = grouped_by_alertname(send_resolved=True)
    with_resolved.flush(firing, 30 * S)
    [n] = with_resolved.flush(one_resolved, 330 * S)
    assert sorted((a.labels["app"], a.status) for a in n.alerts) == [("a", "firing"), ("b", "resolved")]

    without = grouped_by_alertname(send_resolved=False)
    without.flush(firing, 30 * S)
    assert without.flush(one_resolved, 330 * S) == []
    # The all-clear is recorded but not sent to a receiver that does not want resolved notifications.
    all_resolved = [alert("a", 0, resolved_ms=400 * S), alert("b", 0, resolved_ms=60 * S)]
    assert without.flush(all_resolved, 630 * S) == []
    assert without.sent[("oncall", '{}:{alertname="slow"}')].firing == frozenset()


def test_an_alert_that_fired_and_resolved_within_the_wait_is_never_notified() -> None:
    receivers = grouped_by_alertname()
    receivers.flush([alert("a", 0)], 0)
    assert receivers.flush([alert("a", 0, resolved_ms=20 * S)], 30 * S) == []
    assert receivers.notified == []


def test_a_restarted_dispatcher_sends_nothing_the_receiver_already_has() -> None:
    receivers = grouped_by_alertname()
    firing = [alert("a", 0), alert("b", 0)]
    receivers.flush(firing, 30 * S)
    restarted = Receivers(Dispatcher(receivers.dispatcher.tree, lambda _r: True))
    restarted.sent = dict(receivers.sent)
    # Its groups start again, but alerts known for longer than group_wait are flushed at once: and not sent.
    assert restarted.flush(firing, 200 * S) == []
    [n] = restarted.flush([*firing, alert("c", 250 * S)], 500 * S)
    assert len(n.alerts) == 3


def test_routes_send_matching_alerts_to_their_receiver_and_the_rest_to_the_default() -> None:
    tree = resolve(RootRoute(receiver="oncall", group_by=["app"], group_wait=10),
                   [Route.model_validate({"matchers": ['app = "checkout"'], "receiver": "payments",
                                          "group_wait": "1m"}),
                    Route.model_validate({"matchers": ["severity=~warn.*"], "receiver": "warnings"})])
    receivers = Receivers(Dispatcher(tree, lambda _r: True))
    alerts = [alert("checkout", 0), alert("search", 0)]
    assert [(n.receiver, n.group_labels) for n in receivers.flush(alerts, 10 * S)] == [
        ("warnings", {"app": "search"})]          # "search" matched the second route, whose wait is the root's
    assert receivers.flush(alerts, 69 * S) == []      # the checkout group, first seen at 10 s, waits 1 min
    assert [(n.receiver, n.group_key) for n in receivers.flush(alerts, 70 * S)] == [
        ("payments", '{}/{app="checkout"}:{app="checkout"}')]


def test_thirty_series_in_ten_apps_grouped_by_app_make_ten_notifications_of_three_alerts() -> None:
    tree = resolve(RootRoute(receiver="oncall", group_by=["app"]), [])
    receivers = Receivers(Dispatcher(tree, lambda _r: True))
    firing = [alert(f"app{i % 10}", 0, rule=f"rule{i // 10}") for i in range(30)]
    decided = receivers.flush(firing, 0) + receivers.flush(firing, 30 * S)
    assert sorted((n.group_labels["app"], len(n.alerts)) for n in decided) == [(f"app{i}", 3) for i in range(10)]
    assert receivers.flush(firing, 3600 * S) == []     # nothing new: no repeat before repeat_interval (4 h)


ROUTED = """
[[rule]]
name = "slow"
series = { app = "*", kind = "metric", name = "latency_ms" }
statistic = "p99"
comparator = ">"
threshold = 500

[routing]
receiver = "oncall"
group_by = ["alertname"]

[[route]]
matchers = ['app = "checkout"']
receiver = "am"
continue = true

[[receiver]]
name = "oncall"
webhook = { url = "http://127.0.0.1:9/hook" }

[[receiver]]
name = "am"
alertmanager = { url = "http://127.0.0.1:9/" }
"""


def test_the_alerts_page_says_why_an_alert_was_or_was_not_notified_yet() -> None:
    # Given the routes above (group_wait 30 s, group_interval 5 min, repeat_interval 4 h) and a flush history,
    rules = parse_rules(ROUTED)
    shop = {"alertname": "slow", "severity": "warning", "app": "shop"}
    checkout = {**shop, "app": "checkout"}
    group = ("oncall", '{}:{alertname="slow"}')
    t0 = 1_800_000_000_000
    clock = "%H:%M:%S UTC"

    def at(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime(clock)

    def status(labels: dict[str, str], sent: dict, now: int, firing: bool = True, silenced: tuple = ()) -> str:
        return notification_status(rules, labels, firing, t0, sent, list(silenced), now)

    # a new alert waits for group_wait; then it is due,
    assert status(shop, {}, t0 + 10 * S) == f"oncall: waiting for group_wait, until {at(t0 + 30 * S)}"
    assert status(shop, {}, t0 + 31 * S) == "oncall: due at the group's next flush"
    # once sent, its repeat waits for repeat_interval,
    sent = {group: Sent(frozenset({fingerprint(shop)}), frozenset(), t0 + 30 * S)}
    assert status(shop, sent, t0 + MINUTE) == (
        f"oncall: sent {at(t0 + 30 * S)}; repeated at {at(t0 + 30 * S + 4 * 3600 * S)} if still firing "
        "(repeat_interval)")
    # one joining the notified group waits for its group_interval; checkout's route leads to the Alertmanager only,
    assert status({**shop, "app": "search"}, sent, t0 + MINUTE) == (
        f"oncall: joined a notified group; in its next notification, at {at(t0 + 330 * S)} (group_interval)")
    assert status(checkout, sent, t0 + MINUTE) == "am: sent at the next push to Alertmanager"
    # a resolved one the receiver knew of is cleared at the next flush; a silenced one is sent nowhere.
    assert status(shop, sent, t0 + MINUTE, firing=False) == "oncall: resolution due at the group's next flush"
    assert status(shop, sent, t0 + MINUTE, silenced=["0123456789abcdef"]) == (
        "silenced (01234567): not sent to receivers")
    assert notification_status(parse_rules(ROUTED.split("[routing]")[0]), shop, True, t0, {}, [], t0) == (
        "per-transition channels only (the rules file has no [routing])")


def test_the_alerts_page_lists_the_groups_current_alerts_form_per_receiver() -> None:
    # Given the routes above, three firing alerts (checkout's to the Alertmanager), one resolved that oncall was
    # last sent as firing and one resolved it never heard of,
    rules = parse_rules(ROUTED)
    labels = [{"alertname": "slow", "severity": "warning", "app": app} for app in ("shop", "search", "checkout",
                                                                                   "cart", "gone")]
    shop, search, checkout, cart, gone = labels
    t0 = 1_800_000_000_000
    sent = {("oncall", '{}:{alertname="slow"}'): Sent(frozenset({fingerprint(shop), fingerprint(cart)}),
                                                      frozenset(), t0)}
    groups = current_groups(rules, [(shop, True), (search, True), (checkout, True), (cart, False), (gone, False)],
                            sent)
    # then oncall's group holds the two firing and the one to clear, and the Alertmanager its own.
    assert groups == [
        {"receiver": "am", "group": "(Alertmanager groups them)", "firing": 1, "to_clear": 0, "last_notified": None,
         "firing_notified": 0},
        {"receiver": "oncall", "group": '{alertname="slow"}', "firing": 2, "to_clear": 1,
         "last_notified": datetime.fromtimestamp(t0 / 1000, UTC), "firing_notified": 2}]
