"""Silences, as Alertmanager's: label matchers and a time span during which the alerts they match are not notified.

A silenced alert is still evaluated, stored and shown (marked silenced); what it mutes is what Alertmanager's
mute it: notifications to receivers (group notifications and Alertmanager receivers, :mod:`alerting.dispatch`).
When a silence ends (or is expired early) its alerts are notified again at the next flush, as new to their groups'
receivers when they never heard of them. Silences are stored in ClickHouse (``alert_silences``,
``sql/0018_alert_silences.sql``): they survive restarts and every component reads the same ones.

As in Alertmanager, a silence needs at least one matcher that does not match the empty string, so that it cannot
mute every alert by accident.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from clickhouse_connect.driver.client import Client

from alerting.routes import Matcher
from eventide.config import Config, ConfigError
from eventide.envelope import ms_of, now_ms, utc_of
from store.client import connect

COLUMNS = ["silence_id", "matchers", "starts_at", "ends_at", "created_by", "comment", "updated_at"]




@dataclass(frozen=True)
class Silence:
    id: str
    matchers: tuple[Matcher, ...]
    starts_at_ms: int
    ends_at_ms: int
    created_by: str
    comment: str

    def active(self, at_ms: int) -> bool:
        return self.starts_at_ms <= at_ms < self.ends_at_ms

    def state(self, at_ms: int) -> str:
        """``pending`` (starts later), ``active`` or ``expired``, as Alertmanager names them."""
        return "pending" if at_ms < self.starts_at_ms else "active" if at_ms < self.ends_at_ms else "expired"

    def mutes(self, labels: dict[str, str]) -> bool:
        return all(m.matches(labels) for m in self.matchers)


def muting(silences: Iterable[Silence], labels: dict[str, str], at_ms: int) -> list[str]:
    """The ids of the silences that mute an alert with ``labels`` at ``at_ms``."""
    return [s.id for s in silences if s.active(at_ms) and s.mutes(labels)]


def new_silence(matchers: list[str], starts_at_ms: int, ends_at_ms: int, created_by: str, comment: str) -> Silence:
    """A silence, checked as Alertmanager checks one; raises :class:`ConfigError` saying what is wrong."""
    try:
        parsed = tuple(Matcher.parse(m) for m in matchers)
    except ValueError as exc:
        raise ConfigError(f"silence: {exc}") from None
    if not any(not m.matches({}) for m in parsed):
        raise ConfigError("silence: at least one matcher must not match the empty string (it would mute every "
                          "alert), e.g. app=\"checkout\"")
    if ends_at_ms <= starts_at_ms:
        raise ConfigError("silence: it must end after it starts")
    if not created_by.strip() or not comment.strip():
        raise ConfigError("silence: say who creates it and why (author and comment)")
    return Silence(str(uuid.uuid4()), parsed, starts_at_ms, ends_at_ms, created_by.strip(), comment.strip())


def save(config: Config, silence: Silence) -> None:
    with connect(config) as client:
        client.insert("alert_silences", [[silence.id, [str(m) for m in silence.matchers], utc_of(silence.starts_at_ms),
                                          utc_of(silence.ends_at_ms), silence.created_by, silence.comment,
                                          datetime.now(UTC)]], column_names=COLUMNS)


def load(client: Client, since_ms: int | None = None) -> list[Silence]:
    """Every silence, or those not ended before ``since_ms``; newest first."""
    rows = client.query(
        "SELECT silence_id, matchers, starts_at, ends_at, created_by, comment FROM alert_silences FINAL "
        "WHERE ends_at >= fromUnixTimestamp64Milli({since:Int64}) ORDER BY starts_at DESC, silence_id",
        parameters={"since": since_ms if since_ms is not None else 0}).result_rows
    return [from_row(*row) for row in rows]


def from_row(silence_id: str, matchers: list[str], starts_at: datetime, ends_at: datetime, created_by: str,
             comment: str) -> Silence:
    """A silence from its ``alert_silences`` row."""
    return Silence(silence_id, tuple(Matcher.parse(m) for m in matchers), ms_of(starts_at), ms_of(ends_at), created_by,
                   comment)


def listed(config: Config, at_ms: int | None = None, ended: bool = False) -> list[Silence]:
    """The silences active or pending at ``at_ms`` (default now), and with ``ended`` the others too, newest first;
    as the read-only user reads them."""
    at_ms = now_ms() if at_ms is None else at_ms
    with connect(config, role="reader") as client:
        return load(client, None if ended else at_ms + 1)


def expire(config: Config, silence_id: str, at_ms: int | None = None) -> Silence:
    """End the silence ``silence_id`` now (a pending one never starts); raises :class:`ConfigError` if there is no
    such silence or it has already ended."""
    at_ms = now_ms() if at_ms is None else at_ms
    with connect(config) as client:
        found = [s for s in load(client) if s.id == silence_id]
    if not found:
        raise ConfigError(f"silence {silence_id!r}: no such silence")
    silence = found[0]
    if silence.state(at_ms) == "expired":
        raise ConfigError(f"silence {silence_id!r} has already ended")
    ended = Silence(silence.id, silence.matchers, min(silence.starts_at_ms, at_ms), at_ms, silence.created_by,
                    silence.comment)
    save(config, ended)
    return ended
