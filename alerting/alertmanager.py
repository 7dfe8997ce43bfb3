"""What Alertmanager's receivers expect: an alert's fingerprint, and the webhook payload (version 4).

A receiver written for Alertmanager's webhook reads our group notifications unchanged: the same fields, the same
fingerprints (Prometheus' FNV-1a hash of the sorted label set), the same time format, a firing alert's ``endsAt``
Go's zero time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_SEPARATOR = 0xFF
GO_ZERO_TIME = "0001-01-01T00:00:00Z"
WEBHOOK_VERSION = "4"


def fingerprint(labels: dict[str, str]) -> str:
    """Prometheus' fingerprint of a label set, as Alertmanager prints it (16 hex digits)."""
    h = _FNV_OFFSET
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in part.encode("utf-8", "surrogatepass"):
                h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
            h = ((h ^ _SEPARATOR) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def go_time(ms: int | None) -> str:
    """A time as Go's ``time.Time`` marshals to JSON in UTC (RFC 3339, fraction without trailing zeros); None: the
    zero time."""
    if ms is None:
        return GO_ZERO_TIME
    text = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{ms % 1000:03d}".rstrip("0")
    return f"{text}.{fraction}Z" if fraction else f"{text}Z"


def label_set(labels: dict[str, str]) -> str:
    """A label set as Prometheus prints it: ``{alertname="x", app="y"}`` (sorted, values quoted)."""
    escaped = {k: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for k, v in labels.items()}
    return "{" + ", ".join(f'{k}="{escaped[k]}"' for k in sorted(escaped)) + "}"


def quote_meta(text: str) -> str:
    """Go's ``regexp.QuoteMeta``: Alertmanager puts the receiver's name through it in the payload."""
    return "".join("\\" + c if c in "\\.+*?()|[]{}^$" else c for c in text)


@dataclass(frozen=True)
class Alert:
    """One alert instance as a group notification carries it."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at_ms: int
    ends_at_ms: int | None
    """None while firing."""
    generator_url: str = ""

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.labels)

    @property
    def status(self) -> str:
        return "firing" if self.ends_at_ms is None else "resolved"

    def as_webhook(self) -> dict[str, Any]:
        return {"status": self.status, "labels": self.labels, "annotations": self.annotations,
                "startsAt": go_time(self.starts_at_ms), "endsAt": go_time(self.ends_at_ms),
                "generatorURL": self.generator_url, "fingerprint": self.fingerprint}


def _common(maps: Sequence[dict[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    first = maps[0]
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in maps[1:])}


def webhook_message(receiver: str, group_key: str, group_labels: dict[str, str], alerts: Sequence[Alert],
                    max_alerts: int = 0, external_url: str = "") -> dict[str, Any]:
    """Alertmanager's webhook payload (version 4) for one notification of one group."""
    sent = list(alerts[:max_alerts]) if max_alerts else list(alerts)
    return {
        "receiver": quote_meta(receiver),
        "status": "firing" if any(a.status == "firing" for a in alerts) else "resolved",
        "alerts": [a.as_webhook() for a in sent],
        "groupLabels": group_labels,
        "commonLabels": _common([a.labels for a in alerts]),
        "commonAnnotations": _common([a.annotations for a in alerts]),
        "externalURL": external_url,
        "version": WEBHOOK_VERSION,
        "groupKey": group_key,
        "truncatedAlerts": len(alerts) - len(sent),
    }


def postable_alerts(alerts: Sequence[Alert], valid_until_ms: int) -> list[dict[str, Any]]:
    """The body of ``POST /api/v2/alerts`` (Alertmanager's ``PostableAlerts``): a firing alert ends at
    ``valid_until_ms`` unless sent again before (as Prometheus sends them), a resolved one at its own end."""
    body = []
    for a in alerts:
        alert: dict[str, Any] = {"labels": a.labels, "annotations": a.annotations, "startsAt": go_time(a.starts_at_ms),
                                 "endsAt": go_time(a.ends_at_ms if a.ends_at_ms is not None else valid_until_ms)}
        if a.generator_url:
            alert["generatorURL"] = a.generator_url
        body.append(alert)
    return body
