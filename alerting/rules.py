"""Alert rules: loaded from a TOML file, validated at startup with messages that name the rule and the field.

    [[rule]]
    name = "checkout p99 latency"
    series = { app = "checkout", kind = "metric", name = "latency_ms" }
    window_s = 60              # the tumbling window length evaluated (one of stream.tumbling_windows_s)
    statistic = "p99"          # see STATISTICS
    comparator = ">"
    threshold = 250
    for = 3                    # consecutive finished windows before firing
    keep_firing_for = 2        # once firing, stay firing this many calm windows after the last breach
    severity = "warning"       # info | warning | critical
    week_over_week = false     # true: compare value / value of the same window a week earlier
    labels = { team = "payments" }                            # on every alert it raises (alerting.labels)
    annotations = { summary = "checkout slow: p99 {value} ms" }  # templated text

Series-free statistics (``dead_letters``, ``lag``, ``freshness``, ``skipped_offsets``) describe the pipeline and take
no ``series``.

A rule on log lines counts the lines a search finds (the Logs page's search, :mod:`store.log_query`) in each
finished window, instead of reading a series:

    [[rule]]
    name = "payments declined"
    logs = { app = "checkout", text = '"payment declined"', levels = ["error"] }   # app = "*": each app apart
    window_s = 60
    statistic = "count"        # count | rate (lines per second)
    comparator = ">"
    threshold = 20
"""

from __future__ import annotations

import contextlib
import re
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from alerting.labels import LABEL_NAME, OWN_LABELS, PLACEHOLDERS, unknown_placeholders
from alerting.routes import Receiver, RootRoute, Route, RouteNode, receivers_named, resolve
from eventide.config import Config, ConfigError, SeriesSelector
from eventide.envelope import LEVELS
from eventide.links import logs_url
from store.log_query import LogQuery, parse_text
from store.range_query import SeriesKey

SERIES_STATISTICS = ("count", "rate", "sum", "mean", "min", "max", "distinct_users", "distinct_devices",
                     "error_ratio", "dropped_stragglers")
PIPELINE_STATISTICS = ("dead_letters", "lag", "freshness", "skipped_offsets")
LOG_SEARCH_STATISTICS = ("count", "rate")
"""What a rule on log lines (``logs = {...}``) can compare: matching lines per window, or per second."""
MAX_SEARCH_TEXT = 500
"""Longest search text of a rule: its link carries it to the Logs page, which takes no longer text."""
QUANTILE_PATTERN = re.compile(r"^p(\d{1,2}(\.\d+)?)$")
"""``p50``, ``p99``, ``p99.9``: a quantile merged from the window's KLL sketch."""
STATISTICS_HELP = f"one of {', '.join(SERIES_STATISTICS + PIPELINE_STATISTICS)}, or pXX such as p50, p99, p99.9"

Comparator = Literal[">", ">=", "<", "<=", "==", "!="]
COMPARATORS: dict[str, str] = {">": "gt", ">=": "ge", "<": "lt", "<=": "le", "==": "eq", "!=": "ne"}


def quantile_of(statistic: str) -> float | None:
    """0.99 for ``p99``; None for statistics that are not quantiles."""
    match = QUANTILE_PATTERN.match(statistic)
    return float(match.group(1)) / 100 if match else None


Level = Literal["debug", "info", "warning", "error", "critical"]


class LogSearch(BaseModel):
    """The lines a rule on log lines counts: what the Logs page would search for (:class:`LogQuery`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    app: str = Field("*", min_length=1)
    """One app, or ``*``: every app that logs, each counted apart (one alert per app)."""
    text: str = Field("", max_length=MAX_SEARCH_TEXT)
    """Words and "quoted phrases", all of which a line must hold (case-insensitive, whole words)."""
    levels: list[Level] = Field(default_factory=list)
    names: list[str] = Field(default_factory=list)
    """Logger names; empty: any."""
    tags: dict[str, str] = Field(default_factory=dict)

    def query(self, app: str, since: datetime, until: datetime) -> LogQuery:
        """The search of ``app``'s lines (``*``: every app's) in ``[since, until)``."""
        return LogQuery(since, until, apps=() if app == "*" else (app,), levels=tuple(self.levels),
                        names=tuple(self.names), text=self.text, tags=tuple(sorted(self.tags.items())))

    def link(self, app: str, since: datetime, until: datetime) -> str:
        """The Logs page on this search of ``app``'s lines in ``[since, until)`` (relative to the dashboard): the
        lines an alert of the rule counted."""
        return logs_url(apps=[app], levels=self.levels, names=self.names, text=self.text,
                        tags=sorted(self.tags.items()), since=since, until=until)

    def series(self, app: str) -> SeriesKey:
        """The series an alert of this search on ``app``'s lines is about: ``app``, kind ``log``, and the search
        in words (:attr:`described`) as its name, so alerts, silences and routes see app and search."""
        return SeriesKey(app, "log", self.described)

    @property
    def described(self) -> str:
        """The search in words: ``lines payment declined level=error`` (words), ``lines "payment declined"``
        (a phrase)."""
        words, phrases = parse_text(self.text)
        parts = ["lines", *words, *(f'"{p}"' for p in phrases)]
        if self.levels:
            parts.append(f"level={'|'.join(level for level in LEVELS if level in self.levels)}")
        if self.names:
            parts.append(f"logger={'|'.join(self.names)}")
        parts += [f"{k}={v}" for k, v in sorted(self.tags.items())]
        return " ".join(parts)


class AlertRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(min_length=1, max_length=200)
    series: SeriesSelector | None = None
    logs: LogSearch | None = None
    """Instead of a series: count the log lines this search finds in each window (statistic count or rate)."""
    window_s: int = Field(60, gt=0)
    statistic: str
    comparator: Comparator
    threshold: float
    for_windows: int = Field(1, ge=1, alias="for")
    """Consecutive finished windows that must breach before the alert fires (``for`` in the file)."""
    keep_firing_for: int = Field(0, ge=0)
    """Finished windows a firing alert stays firing after its last breach (Prometheus' ``keep_firing_for``): it
    resolves at the first calm window past them, and a breach among them starts the count again. Against
    flapping: an alert whose value dips under the threshold for a window is not resolved and fired again."""
    severity: Literal["info", "warning", "critical"] = "warning"
    week_over_week: bool = False
    """Compare the ratio value / value of the same window one week earlier (a missing or zero base: no breach)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """The rule's own labels on every alert it raises (``team = "payments"``), besides ``alertname``, ``severity``
    and the series' ``app``, ``kind`` and ``name`` (``alerting.labels``)."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """``summary``, ``description`` or any other text, with ``{placeholders}`` (``alerting.labels.PLACEHOLDERS``)."""

    @field_validator("labels")
    @classmethod
    def _label_names(cls, labels: dict[str, str]) -> dict[str, str]:
        for name in labels:
            if not LABEL_NAME.match(name):
                raise ValueError(f"label {name!r}: a label name is letters, digits and _, not starting with a digit")
            if name in OWN_LABELS:
                raise ValueError(f"label {name!r} comes from the rule and its series; choose another name")
        return labels

    @field_validator("annotations")
    @classmethod
    def _known_placeholders(cls, annotations: dict[str, str]) -> dict[str, str]:
        for key, text in annotations.items():
            if unknown := unknown_placeholders(text):
                raise ValueError(f"annotation {key!r}: unknown placeholder {{{unknown[0]}}}; known: "
                                 f"{', '.join(PLACEHOLDERS)}")
        return annotations

    @field_validator("statistic")
    @classmethod
    def _known_statistic(cls, statistic: str) -> str:
        if statistic in SERIES_STATISTICS or statistic in PIPELINE_STATISTICS:
            return statistic
        q = quantile_of(statistic)
        if q is None or not 0 < q < 1:
            raise ValueError(f"unknown statistic {statistic!r}: {STATISTICS_HELP}")
        return statistic

    @model_validator(mode="after")
    def _series_matches_statistic(self) -> AlertRule:
        if self.logs is not None:
            if self.series is not None:
                raise ValueError("a rule reads a series or counts log lines (logs), not both")
            if self.statistic not in LOG_SEARCH_STATISTICS:
                raise ValueError(f"a rule on log lines (logs) compares {' or '.join(LOG_SEARCH_STATISTICS)}, "
                                 f"not {self.statistic!r}")
            return self
        if self.statistic in PIPELINE_STATISTICS:
            if self.series is not None:
                raise ValueError(f"statistic {self.statistic!r} describes the pipeline and takes no series")
        elif self.series is None:
            raise ValueError(f"statistic {self.statistic!r} needs a series = {{ app, kind, name }}")
        if self.statistic == "error_ratio" and self.series is not None and self.series.kind != "log":
            raise ValueError("error_ratio is computed from log levels: series.kind must be \"log\"")
        return self


class AlertRules(BaseModel):
    """A rules file: its rules and, optionally, where their alerts go (``alerting.routes``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: list[AlertRule] = Field(default_factory=list)
    routing: RootRoute | None = None
    route: list[Route] = Field(default_factory=list)
    receiver: list[Receiver] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> AlertRules:
        seen: set[str] = set()
        for rule in self.rule:
            if rule.name in seen:
                raise ValueError(f"two rules are named {rule.name!r}; names identify alert states")
            seen.add(rule.name)
        return self

    @model_validator(mode="after")
    def _routes_reach_receivers(self) -> AlertRules:
        if (self.route or self.receiver) and self.routing is None:
            raise ValueError("[[route]] and [[receiver]] need a [routing] table naming the default receiver")
        names = [r.name for r in self.receiver]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"two receivers are named {twice[0]!r}")
        for where, name in receivers_named(self.routing, self.route):
            if name not in names:
                raise ValueError(f"{where}: no [[receiver]] is named {name!r}")
        return self

    @property
    def routing_tree(self) -> RouteNode | None:
        """The resolved routing tree; None when the file routes nothing (notifications per transition only)."""
        return resolve(self.routing, self.route) if self.routing is not None else None


def _describe(error: ValidationError, data: dict[str, object], source: str) -> str:
    rules = data.get("rule") if isinstance(data.get("rule"), list) else []
    lines = [f"invalid alert rules ({source}):"]
    for item in error.errors():
        loc = list(item["loc"])
        where = "(file)"
        if len(loc) >= 2 and loc[0] == "rule" and isinstance(loc[1], int):
            index = loc[1]
            raw = rules[index] if index < len(rules) else None   # type: ignore[index]
            name = raw.get("name") if isinstance(raw, dict) else None
            field = ".".join(str(p) for p in loc[2:]) or "(rule)"
            where = f"rule {name!r} (rule #{index + 1}), field {field}" if name else \
                f"rule #{index + 1}, field {field}"
        elif loc:
            where = f"field {'.'.join(str(p) for p in loc)}"
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"  {where}: {message}")
    return "\n".join(lines)


def parse_rules(text: str, source: str = "<string>") -> AlertRules:
    """Rules from TOML text; raises :class:`ConfigError` naming the rule and field of every problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"alert rules {source} are not valid TOML: {exc}") from None
    try:
        return AlertRules.model_validate(data)
    except ValidationError as exc:
        raise _InvalidRules(_describe(exc, data, source), data) from None


def load_rules(path: Path) -> AlertRules:
    if not path.exists():
        raise ConfigError(f"alert rules file {path} does not exist (alerting.rules_file)")
    return parse_rules(path.read_text(), str(path))


def mismatches(rules: AlertRules, config: Config) -> list[str]:
    """What in valid ``rules`` the job's settings cannot give, one line each: a series statistic is read from the
    stored tumbling windows of length ``window_s``, so any other length would never have a value (never fire)."""
    lengths = config.stream.tumbling_windows_s
    return [f"rule {rule.name!r}, field window_s: {rule.window_s} is not a tumbling window length the job computes "
            f"(stream.tumbling_windows_s = {lengths}), so the rule would never have a value"
            for rule in rules.rule if rule.series is not None and rule.window_s not in lengths]


def rules_for(config: Config, path: Path | None = None) -> AlertRules:
    """The rules of ``path`` (default ``alerting.rules_file``), valid and evaluable with ``config``; raises
    :class:`ConfigError` naming the rule and field of every problem."""
    path = config.alert_rules_file if path is None else path
    try:
        rules, lines = load_rules(path), []
    except _InvalidRules as invalid:
        # Every problem at once: the rules valid on their own are still checked against the configuration.
        rules, lines = _valid_alone(invalid.data), invalid.lines
    lines += [f"  {m}" for m in mismatches(rules, config)]
    if lines:
        raise ConfigError("\n".join([f"invalid alert rules ({path}):", *lines]))
    return rules


class _InvalidRules(ConfigError):
    def __init__(self, message: str, data: dict[str, object]) -> None:
        super().__init__(message)
        self.lines = message.splitlines()[1:]
        self.data = data


def _valid_alone(data: dict[str, object]) -> AlertRules:
    """The rules of ``data`` that are valid each on its own (the file as a whole is not)."""
    valid = []
    for raw in data.get("rule") if isinstance(data.get("rule"), list) else []:   # type: ignore[union-attr]
        with contextlib.suppress(ValidationError):
            valid.append(AlertRule.model_validate(raw))
    return AlertRules.model_construct(rule=valid)
