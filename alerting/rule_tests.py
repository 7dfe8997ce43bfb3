"""Rule unit tests (``eventide alerts test FILE``, like ``promtool test rules``): given the values of a few series in
consecutive finished windows, these alerts fire and resolve at these windows.

    rule_files = ["alerts.toml"]          # relative to this file

    [[test]]
    name = "a slow checkout fires after two slow minutes"

    [[test.input]]
    series = { app = "checkout", kind = "metric", name = "latency_ms" }   # omitted for pipeline statistics
    window_s = 60
    values = { p99 = "80 150 150 90 90" }   # per statistic, one value per window; "_": the window has no value

    [[test.alert]]
    at = 3                                  # the window (1 = the first value) whose end the alert changes at
    rule = "checkout p99 latency"
    series = "checkout · metric · latency_ms"      # the alert's series as the Alerts page shows it
    status = "firing"                       # firing | resolved
    [test.alert.labels]                     # optional: the alert's labels, exactly
    alertname = "checkout p99 latency"
    severity = "warning"
    app = "checkout"
    kind = "metric"
    name = "latency_ms"
    team = "checkout"                       # the rule's own

A rule reads an input when its ``window_s``, its statistic and its series selector (``app = "*"``: any app) match;
a rule on log lines reads the series its search makes: ``{ app = "checkout", kind = "log", name = 'lines "payment
declined" level=error' }`` (the name as the Alerts page shows the rule's series, ``LogSearch.described``);
the values are what the rule compares (for ``week_over_week``, the ratio). The rules run through the evaluator's
own state machine (``alerting.state``), and a test passes when the firing and resolved notifications are exactly
the expected ones, no more.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from alerting.labels import PIPELINE_SERIES, alert_labels, series_label
from alerting.rules import AlertRule, rules_for
from alerting.state import AlertState, run
from eventide.config import Config, ConfigError, SeriesSelector
from store.range_query import SeriesKey

NO_VALUE = "_"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TestInput(_Strict):
    series: SeriesSelector | None = None
    window_s: int = Field(gt=0)
    values: dict[str, str]
    """Per statistic, values separated by spaces, one per consecutive finished window."""

    @field_validator("series")
    @classmethod
    def _one_app(cls, series: SeriesSelector | None) -> SeriesSelector | None:
        if series is not None and series.app == "*":
            raise ValueError("an input is one series: name its app")
        return series

    @field_validator("values")
    @classmethod
    def _numbers(cls, values: dict[str, str]) -> dict[str, str]:
        for statistic, text in values.items():
            for word in text.split():
                if word != NO_VALUE:
                    try:
                        float(word)
                    except ValueError:
                        raise ValueError(f"{statistic}: {word!r} is neither a number nor {NO_VALUE}") from None
        return values

    @property
    def label(self) -> str:
        return series_label(None if self.series is None else
                            SeriesKey(self.series.app, self.series.kind, self.series.name))

    def windows(self, statistic: str) -> list[tuple[int, float | None]]:
        """(window end in ms, value): window k (from 1) ends at k × ``window_s``."""
        return [((k + 1) * self.window_s * 1000, None if word == NO_VALUE else float(word))
                for k, word in enumerate(self.values[statistic].split())]


class ExpectedAlert(_Strict):
    at: int = Field(ge=1)
    rule: str
    series: str = PIPELINE_SERIES
    status: Literal["firing", "resolved"]
    labels: dict[str, str] | None = None
    """When given, the alert's labels exactly (``alertname``, ``severity``, the series' ``app``, ``kind``, ``name``
    and the rule's own), as routes and silences see them; like ``exp_labels`` of ``promtool test rules``."""


class RuleTest(_Strict):
    name: str = Field(min_length=1)
    input: list[TestInput] = Field(min_length=1)
    alert: list[ExpectedAlert] = Field(default_factory=list)


class RuleTests(_Strict):
    rule_files: list[str] = Field(min_length=1)
    test: list[RuleTest] = Field(min_length=1)


Notified = tuple[int, str, str, str]
"""(window number, rule, series, status)."""


def reads(rule: AlertRule, given: TestInput) -> bool:
    """Whether ``rule`` evaluates ``given``: same window length and statistic, and its selector matches."""
    if rule.window_s != given.window_s or rule.statistic not in given.values:
        return False
    if rule.logs is not None:
        # A rule on log lines reads the series its search makes (alerting.rules.LogSearch.series).
        return (given.series is not None and rule.logs.app in ("*", given.series.app)
                and (given.series.kind, given.series.name) == ("log", rule.logs.described))
    if rule.series is None or given.series is None:
        return rule.series is None and given.series is None
    return (rule.series.app in ("*", given.series.app) and rule.series.kind == given.series.kind
            and rule.series.name == given.series.name)


def notified(rules: list[AlertRule], test: RuleTest) -> dict[Notified, dict[str, str]]:
    """The firing and resolved notifications ``rules`` give on ``test``'s inputs, with each alert's labels."""
    found = {}
    for given in test.input:
        for rule in rules:
            if reads(rule, given):
                _, transitions = run(rule, AlertState(rule.name, given.label), given.windows(rule.statistic))
                series = None if given.series is None else SeriesKey(given.series.app, given.series.kind,
                                                                     given.series.name)
                labels = alert_labels(rule.name, rule.severity, series, rule.labels)
                found |= {(t.window_end_ms // (given.window_s * 1000), t.rule, t.series, t.to): labels
                          for t in transitions if t.notify}
    return found


def failures(rules: list[AlertRule], test: RuleTest) -> list[str]:
    """One line per expected notification that did not come, per one that came unexpected, and per one that came
    with other labels than expected."""
    expected = {(a.at, a.rule, a.series, a.status): a.labels for a in test.alert}
    got = notified(rules, test)
    lines = [f"test {test.name!r}: expected {status} of {rule!r} [{series}] at window {at}, but it did not come"
             for at, rule, series, status in sorted(expected.keys() - got.keys())]
    lines += [f"test {test.name!r}: unexpected {status} of {rule!r} [{series}] at window {at}"
              for at, rule, series, status in sorted(got.keys() - expected.keys())]
    lines += [f"test {test.name!r}: {key[3]} of {key[1]!r} [{key[2]}] at window {key[0]} has labels "
              f"{_labels(got[key])}, expected {_labels(labels)}"
              for key, labels in sorted(expected.items()) if labels is not None and key in got and got[key] != labels]
    return lines


def _labels(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def load_tests(path: Path) -> RuleTests:
    """The tests of ``path``; raises :class:`ConfigError` naming the field of every problem."""
    if not path.exists():
        raise ConfigError(f"alert rule tests {path} do not exist")
    try:
        return RuleTests.model_validate(tomllib.loads(path.read_text()))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"alert rule tests {path} are not valid TOML: {exc}") from None
    except ValidationError as exc:
        lines = [f"invalid alert rule tests ({path}):"]
        lines += [f"  field {'.'.join(str(p) for p in e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
                  for e in exc.errors()]
        raise ConfigError("\n".join(lines)) from None


def run_tests(config: Config, path: Path) -> tuple[int, list[str]]:
    """(tests run, failure lines) of the test file ``path``, its rules checked as ``alerts check`` does."""
    tests = load_tests(path)
    rules = [rule for name in tests.rule_files for rule in rules_for(config, path.parent / name).rule]
    known = {rule.name for rule in rules}
    lines = [f"test {test.name!r}: no rule is named {alert.rule!r}"
             for test in tests.test for alert in test.alert if alert.rule not in known]
    return len(tests.test), lines + [line for test in tests.test for line in failures(rules, test)]
