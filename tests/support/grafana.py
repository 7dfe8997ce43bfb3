"""Grafana's ClickHouse data source as a test meets it: its macros expanded as the plugin expands them, and
clickhouse-go (the client the plugin embeds, built by ``./run test`` into tests/integration/clickhouse_go/bin) run
against a store as a given user.

The macros follow grafana/clickhouse-datasource's ``pkg/macros/macros.go``: ``$__timeFilter(c)`` becomes
``c >= toDateTime(<from s>) AND c <= toDateTime(<to s>)``, ``$__timeInterval(c)`` becomes
``toStartOfInterval(toDateTime(c), INTERVAL <interval s> second)``, and so on.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from datetime import UTC, date, datetime
from decimal import Decimal
from ipaddress import IPv4Address, IPv6Address
from typing import Any
from uuid import UUID

from eventide.config import Config
from store import credentials
from tests.support.stack import REPO

GO_CLIENT = REPO / "tests" / "integration" / "clickhouse_go" / "bin" / "chgo"


def expand_macros(sql: str, since: datetime, until: datetime, interval_s: int) -> str:
    """``sql`` with the plugin's time macros replaced for the range ``[since, until]`` and the panel's interval."""
    lo, hi = int(since.timestamp()), int(until.timestamp())
    lo_ms, hi_ms = int(since.timestamp() * 1000), int(until.timestamp() * 1000)
    column = r"\(\s*([^()]+?)\s*\)"
    rules = [
        (r"\$__timeFilter_ms" + column,
         lambda m: f"{m[1]} >= fromUnixTimestamp64Milli({lo_ms}) AND {m[1]} <= fromUnixTimestamp64Milli({hi_ms})"),
        (r"\$__timeFilter" + column, lambda m: f"{m[1]} >= toDateTime({lo}) AND {m[1]} <= toDateTime({hi})"),
        (r"\$__timeInterval_ms" + column,
         lambda m: f"toStartOfInterval(toDateTime64({m[1]}, 3), INTERVAL {max(1, interval_s * 1000)} millisecond)"),
        (r"\$__timeInterval" + column,
         lambda m: f"toStartOfInterval(toDateTime({m[1]}), INTERVAL {max(1, interval_s)} second)"),
        (r"\$__fromTime_ms\b", lambda m: f"fromUnixTimestamp64Milli({lo_ms})"),
        (r"\$__toTime_ms\b", lambda m: f"fromUnixTimestamp64Milli({hi_ms})"),
        (r"\$__fromTime\b", lambda m: f"toDateTime({lo})"),
        (r"\$__toTime\b", lambda m: f"toDateTime({hi})"),
        (r"\$__interval_s\b", lambda m: str(max(1, interval_s))),
    ]
    for pattern, replace in rules:
        sql = re.sub(pattern, replace, sql)
    if "$__" in sql:
        raise ValueError(f"a macro this expansion does not know: {sql}")
    return sql


def go_client(config: Config, queries: list[str], role: str = "reader",
              settings: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """clickhouse-go over HTTP (Native, the client's protocol revision) as Grafana's data source connects: its ping
    and server version, then one result per query (``columns``, ``types``, ``rows``, ``error``)."""
    creds = credentials.load(config)
    user, password = ((creds.reader_user, creds.reader_password) if role == "reader"
                      else (credentials.WRITER_USER, creds.writer_password))
    request = {"addr": f"{config.store.host}:{config.store.port}", "user": user, "password": password,
               "database": config.store.database, "settings": settings or {"max_execution_time": 60},
               "queries": queries}
    done = subprocess.run([str(GO_CLIENT)], input=json.dumps(request), capture_output=True, text=True, timeout=300,
                          check=True)
    hello, *results = [json.loads(line) for line in done.stdout.splitlines()]
    return hello, results


def comparable(value: Any, type_name: str = "") -> Any:
    """A value as clickhouse-go's JSON gives it, or as clickhouse-connect reads it, in one form: times as aware UTC
    datetimes, dates as dates, decimals as Decimal, big integers, UUIDs, addresses, bytes and NaNs as text, tuples as
    lists."""
    if isinstance(value, str) and "DateTime" in type_name:
        return datetime.fromisoformat(value).astimezone(UTC)
    if isinstance(value, str) and type_name.startswith(("Date", "Nullable(Date")):
        return date.fromisoformat(value[:10])
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str) and "Decimal" in type_name:
        return Decimal(value)
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**53:
        return str(value)
    if isinstance(value, UUID | IPv4Address | IPv6Address):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): comparable(v, type_name) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [comparable(v, type_name) for v in value]
    return value
