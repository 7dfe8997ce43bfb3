"""Read-side queries the dashboard needs. Each takes an open client (``store.client.connect``), so a page
opens the store once per refresh, which matters for chDB where every open costs tens of milliseconds."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandas as pd
from clickhouse_connect.driver.client import Client


@dataclass(frozen=True)
class Series:
    app: str
    kind: str
    name: str
    series_tags: str = ""

    @property
    def label(self) -> str:
        tags = f" {{{self.series_tags}}}" if self.series_tags else ""
        return f"{self.app} · {self.kind} · {self.name}{tags}"


def list_series(client: Client) -> list[Series]:
    """Every series that has at least one window, most active first."""
    rows = client.query(
        "SELECT app, kind, name, series_tags FROM window_aggregates FINAL "
        "GROUP BY app, kind, name, series_tags ORDER BY sum(event_count) DESC"
    ).result_rows
    return [Series(*row) for row in rows]


def window_lengths_ms(client: Client) -> list[int]:
    rows = client.query("SELECT DISTINCT window_length_ms FROM window_aggregates ORDER BY 1").result_rows
    return [int(r[0]) for r in rows]


def series_windows(client: Client, series: Series, window_length_ms: int, since: datetime) -> pd.DataFrame:
    """One row per tumbling window of the series since ``since``: start, count, rate, mean, p50/p90/p99, users.

    Reads the latest version of each window (``FINAL``), so corrections replace earlier results.
    """
    return client.query_df(
        "SELECT window_start, event_count, rate, mean, p50, p90, p99, distinct_users, distinct_devices "
        "FROM window_aggregates FINAL "
        "WHERE window_kind = 'tumbling' AND window_length_ms = {length:UInt64} "
        "AND app = {app:String} AND kind = {kind:String} AND name = {name:String} "
        "AND series_tags = {tags:String} AND window_start >= {since:DateTime64(3)} "
        "ORDER BY window_start",
        parameters={"length": window_length_ms, "app": series.app, "kind": series.kind,
                    "name": series.name, "tags": series.series_tags, "since": since},
    )


def dead_letter_count(client: Client) -> int:
    return int(client.query("SELECT count() FROM dead_letters FINAL").result_rows[0][0])
