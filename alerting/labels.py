"""An alert's labels and annotations, as Prometheus and Alertmanager shape them.

Labels identify an alert and are what routes and silences match: ``alertname`` (the rule), ``severity``, the
series' ``app``, ``kind`` and ``name`` (none for a pipeline statistic), then the rule's own ``labels``.
Annotations describe it: ``summary`` and ``description`` (the rule's, or the defaults below), and any other the
rule sets. Annotation text is a template whose ``{placeholders}`` are :data:`PLACEHOLDERS`, replaced by plain
substitution (never ``str.format``, whose ``{value.attr}`` would reach into Python objects).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

from store.range_query import SeriesKey

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
"""Prometheus' label names."""
OWN_LABELS = ("alertname", "severity", "app", "kind", "name")
"""Labels every alert gets from its rule and series; a rule's ``labels`` cannot set them."""
PLACEHOLDERS = ("alertname", "severity", "app", "kind", "name", "series", "statistic", "comparator", "threshold",
                "value", "window_s", "window_end", "status")
DEFAULT_SUMMARY = "{alertname}: {statistic} {comparator} {threshold} on {series}"
DEFAULT_DESCRIPTION = ("{statistic} of {series} was {value} in the {window_s}-s window ending {window_end} UTC "
                       "(fires when {comparator} {threshold}); now {status}")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
PIPELINE_SERIES = "pipeline"
"""The series of an alert on a pipeline statistic, which has none."""


def series_label(series: SeriesKey | None) -> str:
    """An alert's series as states, transitions and the Alerts page name it (None: a pipeline statistic)."""
    return PIPELINE_SERIES if series is None else series.label


def unknown_placeholders(template: str) -> list[str]:
    """The ``{names}`` in ``template`` that are not :data:`PLACEHOLDERS`."""
    return [name for name in _PLACEHOLDER.findall(template) if name not in PLACEHOLDERS]


def fill(template: str, values: dict[str, str]) -> str:
    """``template`` with each known ``{placeholder}`` replaced by its value; anything else left as written."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def alert_labels(alertname: str, severity: str, series: SeriesKey | None, own: dict[str, str]) -> dict[str, str]:
    """The labels of the alert of rule ``alertname`` on ``series`` (None: a pipeline statistic)."""
    labels = {"alertname": alertname, "severity": severity}
    if series is not None:
        labels |= {"app": series.app, "kind": series.kind, "name": series.name}
    return labels | {k: v for k, v in own.items() if k not in OWN_LABELS}


def _number(value: float | None) -> str:
    if value is None:
        return "no value"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.6g}"


def alert_annotations(labels: dict[str, str], own: dict[str, str], *, series: str, statistic: str, comparator: str,
                      threshold: float, value: float | None, window_s: int, window_end_ms: int,
                      status: str) -> dict[str, str]:
    """The annotations of one transition of an alert with ``labels``: ``summary`` and ``description`` (the rule's
    ``own``, or the defaults) and the rule's others, each filled in."""
    values = {**{k: labels.get(k, "") for k in OWN_LABELS}, "series": series, "statistic": statistic,
              "comparator": comparator, "threshold": _number(threshold), "value": _number(value),
              "window_s": str(window_s), "status": status,
              "window_end": datetime.fromtimestamp(window_end_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")}
    templates = {"summary": DEFAULT_SUMMARY, "description": DEFAULT_DESCRIPTION} | own
    return {key: fill(text, values) for key, text in templates.items()}
