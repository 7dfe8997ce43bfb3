"""Showing a URL without its secrets: wherever a configured URL is printed, logged, stored or drawn on a page.

A webhook URL often carries its credential in the path or query (``https://hooks.example.com/services/T0/B0/XXXX``,
``...?token=...``) and a store URL may carry ``user:password@``. Only the scheme and the host (with its port) say
where something goes without giving anyone the means to go there too: :func:`url_origin`. Text that may quote the
URL (an exception's message, a reason stored earlier) goes through :func:`scrub_url`.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

HIDDEN = "***"
"""What a secret part of a URL becomes in :func:`scrub_url`."""

SHORTEST_SECRET = 4
"""A URL part shorter than this is not treated as a secret by :func:`scrub_url` (``/``, ``/a``): replacing it
everywhere would garble the message and hide nothing worth hiding."""


_QUOTED_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*[^\s'\"<>.,:;!?)\]]")
"""A URL quoted in a message, without the punctuation that may follow it (``at http://h:1: refused``)."""


def _hostname(url: str) -> str | None:
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None


def url_origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: no user, password, path, query or fragment. A text that is no URL with a
    host gives ``"(no URL)"`` or ``"(unreadable URL)"``, never the text itself (it may be a secret)."""
    if not url:
        return "(no URL)"
    try:
        parts = urlsplit(url.strip())
        host, port = parts.hostname, parts.port
    except ValueError:      # an invalid port or a malformed IPv6 literal
        return "(unreadable URL)"
    if not parts.scheme or not host:
        return "(unreadable URL)"
    if ":" in host:         # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def scrub_url(text: str, url: str) -> str:
    """``text`` with ``url`` shown as its :func:`url_origin`, and every secret part of ``url`` (user info,
    password, path, query, fragment; as written and percent-decoded) that still appears on its own replaced by
    :data:`HIDDEN`. For messages that may quote the URL: exception texts, stored reasons."""
    if not url or not text:
        return text
    text = text.replace(url, url_origin(url))
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return text
    if host:    # the URL quoted in another form (``user:***@``, another path): any URL to the same host
        text = _QUOTED_URL.sub(lambda m: url_origin(m[0]) if _hostname(m[0]) == host else m[0], text)
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    path_query = parts.path + (f"?{parts.query}" if parts.query else "")
    secrets = {userinfo, parts.password or "", path_query, parts.path, parts.query, parts.fragment}
    secrets |= {unquote(s) for s in secrets}
    for secret in sorted((s for s in secrets if len(s) >= SHORTEST_SECRET), key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    return text
