"""Routes and receivers: which alerts go where, grouped how (Alertmanager's routing tree, in the rules file).

    [routing]                        # the root route: every alert enters here
    receiver = "oncall"              # the default receiver
    group_by = ["alertname", "app"]  # [] (the default): one group per route; ["..."]: every label
    group_wait = "30s"               # before a new group's first notification
    group_interval = "5m"            # before a notification about alerts added to (or resolved in) a group
    repeat_interval = "4h"           # before an unchanged group is notified again

    [[route]]                        # children of the root, tried in order; [[route.route]] nests
    matchers = ['app = "checkout"', 'severity =~ "warning|critical"']
    receiver = "checkout"
    continue = true                  # also try the next siblings (default: the first match wins)

    [[receiver]]
    name = "oncall"
    webhook = { url = "http://hooks.example/alerts", send_resolved = true }   # Alertmanager's webhook format

An alert enters the root; a route that matches it passes it to the first of its children that matches (every
matching one with ``continue``), and the deepest matching routes are where it ends up; a route with no matching
child keeps it. A child inherits what it does not set (receiver, group_by and the three intervals). Durations are
Alertmanager's (``30s``, ``5m``, ``4h``, ``1h30m``, ``1d``) or a number of seconds. Matchers are
Alertmanager's: ``name = value``, ``!=``, ``=~`` and ``!~`` (a regular expression matching the whole value);
values may be quoted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from alerting.labels import LABEL_NAME
from eventide.config import http_url

DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_DURATION_UNITS_S = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
EVERY_LABEL = "..."
"""``group_by = ["..."]``: group by every label (one group per alert)."""


def seconds_of(value: object) -> object:
    """Seconds in a duration: a number, or Alertmanager's ``1h30m`` form; anything else is left for the model to
    refuse."""
    if isinstance(value, str):
        match = DURATION.match(value.strip())
        if not value.strip() or match is None:
            raise ValueError(f"{value!r} is not a duration: a number of seconds or e.g. 30s, 5m, 4h, 1h30m")
        return sum(int(part) * unit for part, unit in zip(match.groups(), _DURATION_UNITS_S, strict=True) if part)
    return value


Duration = Annotated[float, BeforeValidator(seconds_of), Field(gt=0)]

_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$')


@dataclass(frozen=True)
class Matcher:
    """One label condition: ``name op value``."""

    name: str
    op: Literal["=", "!=", "=~", "!~"]
    value: str

    @classmethod
    def parse(cls, text: str) -> Matcher:
        """``app = "checkout"``, ``severity=~warning|critical``; raises ValueError saying what is wrong."""
        match = _MATCHER.match(text)
        if match is None:
            raise ValueError(f"matcher {text!r}: expected name = value, name != value, name =~ regex or "
                             f"name !~ regex")
        name, op, value = match.groups()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        matcher = cls(name, op, value)   # type: ignore[arg-type]
        if op in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"matcher {text!r}: invalid regular expression: {exc}") from None
        return matcher

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether ``labels`` satisfy it; a missing label is the empty string (as in Alertmanager)."""
        value = labels.get(self.name, "")
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        found = re.fullmatch(self.value, value) is not None
        return found if self.op == "=~" else not found

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.name}{self.op}"{escaped}"'


def _valid_group_by(names: list[str] | None) -> list[str] | None:
    for name in names or []:
        if name != EVERY_LABEL and not LABEL_NAME.match(name):
            raise ValueError(f"group_by {name!r}: a label name (letters, digits, _) or \"...\" for every label")
    if names and EVERY_LABEL in names and len(names) > 1:
        raise ValueError('group_by "..." (every label) stands alone')
    return names


def _matchers(value: object) -> object:
    if isinstance(value, list):
        return [Matcher.parse(v) if isinstance(v, str) else v for v in value]
    return value


class Route(BaseModel):
    """A route of the file: what it matches, where and how matching alerts go, and its children."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, arbitrary_types_allowed=True)

    matchers: Annotated[list[Matcher], BeforeValidator(_matchers)] = Field(default_factory=list)
    receiver: str | None = None
    group_by: list[str] | None = None
    group_wait: Duration | None = None
    group_interval: Duration | None = None
    repeat_interval: Duration | None = None
    continue_: bool = Field(False, alias="continue")
    route: list[Route] = Field(default_factory=list)
    """Children, tried in order (``[[route.route]]``)."""

    @field_validator("group_by")
    @classmethod
    def _group_by(cls, names: list[str] | None) -> list[str] | None:
        return _valid_group_by(names)


class RootRoute(BaseModel):
    """``[routing]``: the root route, whose settings are every route's defaults (Alertmanager's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    receiver: str
    group_by: list[str] = Field(default_factory=list)
    group_wait: Duration = 30.0
    group_interval: Duration = 300.0
    repeat_interval: Duration = 4 * 3600.0

    @field_validator("group_by")
    @classmethod
    def _group_by(cls, names: list[str]) -> list[str]:
        return _valid_group_by(names) or []


class WebhookReceiver(BaseModel):
    """POSTs each group notification in Alertmanager's webhook format (version 4)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    send_resolved: bool = True
    max_alerts: int = Field(0, ge=0)
    """Alerts per notification at most (0: all); the rest are counted in ``truncatedAlerts``."""

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return http_url(url)


class AlertmanagerReceiver(BaseModel):
    """An existing Alertmanager: its alerts are POSTed to ``{url}/api/v2/alerts`` every ``resend_interval``, as
    Prometheus does, and that Alertmanager groups, routes, silences and notifies them itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    """Its base URL, e.g. ``http://alertmanager:9093``."""
    resend_interval: Duration = 60.0
    """How often the alerts are sent again while nothing changes (Prometheus' ``--rules.alert.resend-delay``)."""

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return http_url(url)

    @property
    def alerts_url(self) -> str:
        return self.url.rstrip("/") + "/api/v2/alerts"


class Receiver(BaseModel):
    """A named destination of alerts: a webhook (grouped here) or an Alertmanager (which groups them itself)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200)
    webhook: WebhookReceiver | None = None
    alertmanager: AlertmanagerReceiver | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Receiver:
        if (self.webhook is None) == (self.alertmanager is None):
            raise ValueError('a receiver has one of webhook = { url = "..." } or alertmanager = { url = "..." }')
        return self

    @property
    def target_url(self) -> str:
        """Where its requests are POSTed."""
        return self.webhook.url if self.webhook is not None else self.alertmanager.alerts_url  # type: ignore[union-attr]

    @property
    def grouped(self) -> bool:
        """Whether its alerts are grouped here (a webhook) rather than by the receiver (an Alertmanager)."""
        return self.webhook is not None

    @property
    def send_resolved(self) -> bool:
        return self.webhook.send_resolved if self.webhook else True

    @property
    def channel(self) -> str:
        """The name its deliveries and failures are recorded under (apart from the per-transition channels)."""
        return f"receiver:{self.name}"


@dataclass(frozen=True)
class RouteNode:
    """A route with every setting resolved (its own or inherited); ``key`` names it in group keys."""

    key: str
    matchers: tuple[Matcher, ...]
    receiver: str
    group_by: tuple[str, ...]
    group_wait_s: float
    group_interval_s: float
    repeat_interval_s: float
    continue_: bool
    children: tuple[RouteNode, ...]

    def group_labels(self, labels: dict[str, str]) -> dict[str, str]:
        """The labels that name the group an alert with ``labels`` joins on this route."""
        if self.group_by == (EVERY_LABEL,):
            return dict(labels)
        return {name: labels[name] for name in self.group_by if labels.get(name)}

    def routes_for(self, labels: dict[str, str]) -> list[RouteNode]:
        """The routes an alert with ``labels`` ends up on, below and including this one (which it matched)."""
        found: list[RouteNode] = []
        for child in self.children:
            if all(m.matches(labels) for m in child.matchers):
                found += child.routes_for(labels)
                if not child.continue_:
                    break
        return found or [self]


def resolve(root: RootRoute, routes: list[Route]) -> RouteNode:
    """The routing tree of ``[routing]`` and its ``[[route]]`` children, every setting filled in."""

    def node(route: Route, parent: RouteNode | None, key: str) -> RouteNode:
        assert parent is not None
        resolved = RouteNode(
            key=key, matchers=tuple(route.matchers), receiver=route.receiver or parent.receiver,
            group_by=tuple(route.group_by) if route.group_by is not None else parent.group_by,
            group_wait_s=route.group_wait or parent.group_wait_s,
            group_interval_s=route.group_interval or parent.group_interval_s,
            repeat_interval_s=route.repeat_interval or parent.repeat_interval_s,
            continue_=route.continue_, children=())
        return replace(resolved, children=_children(route.route, resolved))

    def _children(children: list[Route], parent: RouteNode) -> tuple[RouteNode, ...]:
        # Alertmanager's route key: the parent's, "/", the matchers; the sibling index keeps equal ones apart.
        return tuple(node(child, parent, f"{parent.key}/{{{','.join(map(str, child.matchers))}}}"
                          + (f"/{i}" if [c.matchers for c in children].count(child.matchers) > 1 else ""))
                     for i, child in enumerate(children))

    top = RouteNode(key="{}", matchers=(), receiver=root.receiver, group_by=tuple(root.group_by),
                    group_wait_s=root.group_wait, group_interval_s=root.group_interval,
                    repeat_interval_s=root.repeat_interval, continue_=False, children=())
    return replace(top, children=_children(routes, top))


def receivers_named(root: RootRoute | None, routes: list[Route]) -> list[tuple[str, str]]:
    """(where, receiver name) for every receiver the routes name."""
    named = [("routing.receiver", root.receiver)] if root else []

    def walk(children: list[Route], where: str) -> None:
        for i, route in enumerate(children):
            here = f"{where}[{i}]"
            if route.receiver:
                named.append((f"{here}.receiver", route.receiver))
            walk(route.route, f"{here}.route")

    walk(routes, "route")
    return named
