"""Links into the dashboard's pages, for the dashboard itself and for what points users at it (alert
notifications): one place that knows the pages' URL parameters.

A link is relative to the dashboard's root (:func:`logs_url`), so it works wherever the dashboard is served;
:func:`dashboard_link` makes it absolute with ``dashboard.public_url`` for messages read elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from urllib.parse import urlencode

from eventide.config import Config

LOGS_PAGE = "logs"
ALERTS_PAGE = "alerts"


def dashboard_link(config: Config, relative: str) -> str:
    """``relative`` (a page and its parameters) under the dashboard's public URL: ``dashboard.public_url``, else
    ``http://<dashboard.host>:<dashboard.port>`` (right on loopback only)."""
    base = config.dashboard.public_url or f"http://{config.dashboard.host}:{config.dashboard.port}"
    return f"{base.rstrip('/')}/{relative}"


def logs_params(*, apps: Iterable[str] = (), levels: Iterable[str] = (), names: Iterable[str] = (),
                since: datetime | None = None, until: datetime | None = None, text: str = "",
                tags: Iterable[tuple[str, str]] = ()) -> dict[str, list[str]]:
    """The Logs page's URL parameters for these filters (each a list: apps, levels, names and tags repeat their
    key): ``from``/``to`` the absolute window (ISO 8601, UTC), ``q`` the text, ``tag`` each ``k=v``. For
    ``st.switch_page(..., query_params=...)``; :func:`logs_url` makes a link of them."""
    params = {"app": list(apps), "level": list(levels), "name": list(names),
              "from": [format_time(since)] if since is not None else [],
              "to": [format_time(until)] if until is not None else [],
              "q": [text] if text else [], "tag": [f"{k}={v}" for k, v in tags]}
    return {key: values for key, values in params.items() if values}


def logs_url(*, apps: Iterable[str] = (), levels: Iterable[str] = (), names: Iterable[str] = (),
             since: datetime | None = None, until: datetime | None = None, text: str = "",
             tags: Iterable[tuple[str, str]] = ()) -> str:
    """A link (relative to the dashboard's root, so it works wherever the dashboard is served) that opens the Logs
    page on these filters (:func:`logs_params`): one click from a chart, an alert or a table to the lines."""
    params = logs_params(apps=apps, levels=levels, names=names, since=since, until=until, text=text, tags=tags)
    return f"{LOGS_PAGE}?{urlencode(params, doseq=True)}" if params else LOGS_PAGE


def format_time(t: datetime) -> str:
    """``t`` in the URL's form: ISO 8601 in UTC to the millisecond, ``Z``-suffixed."""
    utc = t.astimezone(UTC) if t.tzinfo else t.replace(tzinfo=UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


