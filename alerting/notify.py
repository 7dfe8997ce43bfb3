"""Alert notifications: what is sent (the payload, strict JSON) and the channels that send it (a webhook, a Kafka
topic), one attempt at a time.

Scheduling (attempts, backoff, deadlines, recording deliveries and failures) lives in :mod:`alerting.delivery`,
which runs off the evaluation loop and imports this module (never the reverse). A channel's
:meth:`Channel.attempt` makes exactly one attempt and says how it went: delivered, failed for good
(:attr:`Outcome.permanent`) or worth retrying (with the receiver's ``Retry-After`` when it gave one).

Delivery is tracked per (transition, channel) in ``alert_notifications``: a transition is sent until a channel
confirms it, then never again, also after restarts. (A crash between a confirmed send and its record means one
repeat: at-least-once, with the transition key in every payload for receivers that deduplicate.)

Webhook requests are always valid HTTP whatever the rule and series names hold: the body is UTF-8 JSON with no
``NaN``/``Infinity`` (non-finite numbers are sent as ``null``), and the ``Idempotency-Key`` header is
:func:`idempotency_key` of the transition key: the SHA-256 of its UTF-8 bytes in hex, 64 ASCII characters, the
same for every attempt and every restart. The readable key is the body's ``key``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from http.client import HTTPException
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

from confluent_kafka import KafkaError, KafkaException, Producer

from eventide.config import Config
from eventide.redaction import scrub_url, url_origin

log = logging.getLogger("eventide.alerting")

RETRIED_STATUSES = frozenset({408, 429})
"""4xx answers that mean "try again later" (request timeout, too many requests); every other 4xx is final."""


@dataclass(frozen=True)
class RetryPolicy:
    """How long one notification is tried on one channel."""

    attempts: int
    backoff_s: float
    """Delay before the second attempt; doubles for each further one (a longer ``Retry-After`` wins)."""
    attempt_timeout_s: float
    deadline_s: float
    """From the first attempt: no attempt starts after it, and no attempt runs past it."""

    @classmethod
    def of(cls, config: Config) -> RetryPolicy:
        a = config.alerting
        return cls(a.webhook_attempts, a.webhook_backoff_s, a.webhook_timeout_s, a.delivery_deadline_s)


@dataclass(frozen=True)
class Outcome:
    """How one attempt went."""

    delivered: bool
    permanent: bool = False
    """Not worth retrying: the receiver refused this notification (4xx other than 408/429)."""
    status: int | None = None
    """HTTP status of the answer; None when there was none (timeout, reset, refused connection)."""
    error: str = ""
    retry_after_s: float | None = None


class Channel(Protocol):
    """A destination of notifications."""

    name: str
    policy: RetryPolicy

    def attempt(self, payload: dict[str, Any], body: bytes, timeout_s: float) -> Outcome:
        """One attempt to deliver ``body`` (the encoded ``payload``), waiting at most ``timeout_s``."""
        ...


class EncodingError(ValueError):
    """A notification that cannot be encoded (a permanent failure: no attempt could ever send it)."""


def _finite(value: Any) -> Any:
    return value if not isinstance(value, float) or math.isfinite(value) else None


def payload(row: dict[str, Any]) -> dict[str, Any]:
    """The JSON body of one notification (non-finite numbers become None: strict JSON has no NaN or Infinity), with
    the alert's ``labels`` and ``annotations`` (``alerting.labels``; {} for transitions stored before them)."""
    return {
        "key": row["transition_key"], "rule": row["rule"], "series": row["series"],
        "status": row["to_state"], "severity": row["severity"],
        "window_end": row["window_end"].replace(tzinfo=UTC).isoformat(), "value": _finite(row["value"]),
        "threshold": _finite(row["threshold"]),
        "labels": json.loads(row.get("labels") or "{}"), "annotations": json.loads(row.get("annotations") or "{}"),
    }


def encode(body: dict[str, Any]) -> bytes:
    """Strict JSON in UTF-8; raises :class:`EncodingError` for what strict JSON cannot carry (NaN, Infinity, lone
    surrogates) instead of sending something a receiver may reject or misread."""
    try:
        return json.dumps(body, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except (ValueError, TypeError) as exc:      # UnicodeEncodeError is a ValueError
        raise EncodingError(f"payload cannot be encoded as strict JSON: {exc}") from exc


def idempotency_key(transition_key: str) -> str:
    """The ``Idempotency-Key`` header of a transition: hex SHA-256 of its UTF-8 bytes. Always a valid header
    value (whatever the names hold: non-Latin-1 letters, CR, LF), of fixed length, stable across attempts and
    restarts. ``surrogatepass`` so that even a lone surrogate hashes instead of raising."""
    return hashlib.sha256(transition_key.encode("utf-8", "surrogatepass")).hexdigest()


def retry_after_s(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (delay-seconds or an HTTP date); None when absent or invalid."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as it is: following it would turn the POST into a GET without its body."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class WebhookChannel:
    """POSTs each notification as JSON to ``url``.

    The URL often holds the receiver's secret (a token in its path or query, a password): no message this channel
    makes (failure reasons, which are logged and stored in ``alert_delivery_failures``, and raised errors) names
    more of it than :attr:`origin`, scheme and host."""

    name = "webhook"

    def __init__(self, url: str, attempts: int, backoff_s: float, timeout_s: float = 5.0,
                 deadline_s: float = 120.0, name: str = "webhook") -> None:
        self.name = name
        self.url = url
        self.origin = url_origin(url)
        self.policy = RetryPolicy(attempts, backoff_s, timeout_s, deadline_s)
        self._opener = urllib.request.build_opener(_NoRedirects)
        # urllib would take ``user:password@`` for part of the host name: send them as HTTP Basic credentials.
        self._target, self._auth = url, None
        try:
            parts = urlsplit(url)
        except ValueError:      # an attempt says so, as a permanent failure
            return
        if "@" in parts.netloc:
            userinfo, _, hostport = parts.netloc.rpartition("@")
            user, _, password = userinfo.partition(":")
            token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
            self._target, self._auth = urlunsplit(parts._replace(netloc=hostport)), f"Basic {token}"

    def __repr__(self) -> str:
        return f"WebhookChannel({self.origin!r})"

    def _failure(self, exc: BaseException) -> str:
        # An exception's text may quote the URL (an invalid URL, some socket and TLS errors).
        return scrub_url(f"webhook {self.origin}: {type(exc).__name__} {exc}".strip(), self.url)

    def attempt(self, payload: dict[str, Any], body: bytes, timeout_s: float) -> Outcome:
        try:
            return self._attempt(payload, body, timeout_s)
        except ValueError as exc:      # a URL urllib cannot use: no attempt will ever get through
            return Outcome(False, permanent=True, error=self._failure(exc))
        except Exception as exc:
            # Raised on for the delivery thread to log with a traceback, without the URL and without the
            # original exception attached (its text and arguments could hold the URL).
            raise RuntimeError(self._failure(exc)) from None

    def _attempt(self, payload: dict[str, Any], body: bytes, timeout_s: float) -> Outcome:
        headers = {"Content-Type": "application/json; charset=utf-8",
                   "Idempotency-Key": idempotency_key(payload["key"]), "User-Agent": "eventide-alerting"}
        if self._auth:
            headers["Authorization"] = self._auth
        request = urllib.request.Request(self._target, data=body, method="POST", headers=headers)
        try:
            with self._opener.open(request, timeout=timeout_s) as response:
                status = response.status
                retry_after = response.headers.get("Retry-After")
                reason = response.reason
        except urllib.error.HTTPError as exc:
            status, retry_after, reason = exc.code, exc.headers.get("Retry-After") if exc.headers else None, exc.reason
            exc.close()
        except (OSError, HTTPException) as exc:   # timeouts, resets, refused connections, garbled answers
            return Outcome(False, error=self._failure(exc.reason if isinstance(exc, urllib.error.URLError)
                                                      and isinstance(exc.reason, BaseException) else exc))
        if 200 <= status < 300:
            return Outcome(True, status=status)
        error = f"webhook answered {status} {reason}".strip()
        if status >= 500 or status in RETRIED_STATUSES:
            return Outcome(False, status=status, error=error, retry_after_s=retry_after_s(retry_after))
        return Outcome(False, permanent=True, status=status, error=error)


class KafkaChannel:
    """Produces each notification to ``alerting.alerts_topic`` (key: rule name), acknowledged by all replicas."""

    name = "kafka"

    def __init__(self, config: Config) -> None:
        self.topic = config.alerting.alerts_topic
        self.policy = RetryPolicy.of(config)
        self._producer = Producer({"bootstrap.servers": config.kafka.bootstrap, "acks": "all",
                                   "enable.idempotence": True})
        # One attempt at a time: flush() waits for every queued message, and a delivery report may be served by
        # another thread's flush, so concurrent attempts could not tell whose message failed.
        self._lock = threading.Lock()

    def attempt(self, payload: dict[str, Any], body: bytes, timeout_s: float) -> Outcome:
        failures: list[KafkaError] = []
        with self._lock:
            try:
                self._producer.produce(self.topic, body, payload["rule"].encode("utf-8", "surrogatepass"),
                                       on_delivery=lambda err, _msg: failures.append(err) if err else None)
            except BufferError as exc:
                return Outcome(False, error=f"Kafka producer queue full: {exc}")
            except KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                return Outcome(False, permanent=err is not None and not err.retriable(), error=f"Kafka: {exc}")
            left = self._producer.flush(timeout_s)
        if failures:
            err = failures[0]
            return Outcome(False, permanent=not err.retriable(), error=f"Kafka topic {self.topic}: {err}")
        if left:
            return Outcome(False, error=f"Kafka topic {self.topic} did not acknowledge within {timeout_s:.1f} s")
        return Outcome(True)


def channels(config: Config) -> list[Channel]:
    """The configured channels: the Kafka topic always, the webhook when ``alerting.webhook_url`` is set."""
    found: list[Channel] = [KafkaChannel(config)]
    a = config.alerting
    if a.webhook_url:
        found.append(WebhookChannel(a.webhook_url, a.webhook_attempts, a.webhook_backoff_s, a.webhook_timeout_s,
                                    a.delivery_deadline_s))
    return found

