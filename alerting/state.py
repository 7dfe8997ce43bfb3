"""The alert state machine, pure: finished windows in, states and transitions out.

Per (rule, series) the state is ``ok``, ``pending`` (breaching, fewer than ``for`` consecutive finished windows)
or ``firing``. Each finished window is evaluated once, oldest first; a window at or before the last one evaluated
is ignored, so re-running the evaluator over the same windows (a restart) changes nothing and emits nothing.

Transitions: ``pending`` (first breach of a rule with ``for`` > 1), ``firing``, ``resolved`` (a firing alert's
first non-breaching window past its rule's ``keep_firing_for`` calm windows) and ``ok`` (a pending alert that
stopped breaching). Only ``firing`` and ``resolved`` are notified. Every transition has a stable ``key``, so a
notifier that records the keys it delivered never notifies one transition twice.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from alerting.rules import COMPARATORS, AlertRule

State = Literal["ok", "pending", "firing"]
NOTIFIED = ("firing", "resolved")
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    symbol: getattr(operator, name) for symbol, name in COMPARATORS.items()}


class AlertState(NamedTuple):
    """Where one (rule, series) stands after the newest evaluated window. A tuple: the evaluator makes one per
    (rule, series) and window, tens of thousands a pass."""

    rule: str
    series: str
    state: State = "ok"
    breaches: int = 0
    """Consecutive breaching finished windows up to ``evaluated_until_ms``."""
    evaluated_until_ms: int = 0
    """End of the newest finished window evaluated."""
    since_ms: int = 0
    """End of the window that entered the current state."""
    value: float | None = None
    calm: int = 0
    """While firing: consecutive non-breaching finished windows since the last breach (``keep_firing_for``)."""


@dataclass(frozen=True)
class Transition:
    rule: str
    series: str
    to: Literal["pending", "firing", "resolved", "ok"]
    window_end_ms: int
    value: float | None
    threshold: float
    severity: str

    @property
    def key(self) -> str:
        """Identifies the transition across restarts (the dedup key of notifications)."""
        return f"{self.rule}|{self.series}|{self.to}|{self.window_end_ms}"

    @property
    def notify(self) -> bool:
        return self.to in NOTIFIED


def breaches(rule: AlertRule, value: float | None) -> bool:
    """Whether ``value`` crosses the rule's threshold; a window without a value never breaches."""
    return value is not None and _COMPARE[rule.comparator](value, rule.threshold)


def step(rule: AlertRule, current: AlertState, window_end_ms: int,
         value: float | None) -> tuple[AlertState, Transition | None]:
    """Evaluate one finished window; returns the new state and the transition it caused, if any."""
    if window_end_ms <= current.evaluated_until_ms:
        return current, None
    if breaches(rule, value):
        count = current.breaches + 1
        if current.state == "firing":
            return _moved(current, "firing", count, 0, current.since_ms, window_end_ms, value), None
        if count >= rule.for_windows:
            return _to(rule, current, "firing", "firing", count, window_end_ms, value)
        if current.state == "ok":
            return _to(rule, current, "pending", "pending", count, window_end_ms, value)
        return _moved(current, current.state, count, current.calm, current.since_ms, window_end_ms, value), None
    if current.state == "firing":
        if current.calm < rule.keep_firing_for:
            return _moved(current, "firing", 0, current.calm + 1, current.since_ms, window_end_ms, value), None
        return _to(rule, current, "ok", "resolved", 0, window_end_ms, value)
    if current.state == "pending":
        return _to(rule, current, "ok", "ok", 0, window_end_ms, value)
    return _moved(current, current.state, 0, current.calm, current.since_ms, window_end_ms, value), None


# Module-level rather than closures in step: step runs once per (rule, series) and window, every pass.
def _moved(current: AlertState, state: State, count: int, calm: int, since_ms: int, window_end_ms: int,
           value: float | None) -> AlertState:
    return AlertState(current.rule, current.series, state, count, window_end_ms, since_ms, value, calm)


def _to(rule: AlertRule, current: AlertState, state: State, transition: Literal["pending", "firing", "resolved", "ok"],
        count: int, window_end_ms: int, value: float | None) -> tuple[AlertState, Transition]:
    return (_moved(current, state, count, 0, window_end_ms, window_end_ms, value),
            Transition(rule.name, current.series, transition, window_end_ms, value, rule.threshold, rule.severity))


def run(rule: AlertRule, current: AlertState,
        windows: list[tuple[int, float | None]]) -> tuple[AlertState, list[Transition]]:
    """``step`` over (window_end_ms, value) pairs in time order."""
    transitions = []
    for window_end_ms, value in (sorted(windows, key=lambda w: w[0]) if len(windows) > 1 else windows):
        current, transition = step(rule, current, window_end_ms, value)
        if transition is not None:
            transitions.append(transition)
    return current, transitions
