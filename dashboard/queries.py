"""Read-side queries the dashboard needs. Each takes an open client (``store.client.connect``), so a page
opens the store once per refresh, which matters for chDB where every open costs tens of milliseconds."""

from __future__ import annotations

from datetime import datetime

import pandas as pd
from clickhouse_connect.driver.client import Client

from store import range_query
from store.range_query import SeriesKey


def list_series(client: Client) -> list[SeriesKey]:
    """Every series that has at least one window, most active first."""
    rows = client.query(
        "SELECT app, kind, name, series_tags FROM window_aggregates FINAL "
        "GROUP BY app, kind, name, series_tags ORDER BY sum(event_count) DESC"
    ).result_rows
    return [SeriesKey(*row) for row in rows]


def window_lengths_ms(client: Client) -> list[int]:
    """Stored tumbling window lengths (the finest resolutions a chart can have)."""
    rows = client.query("SELECT DISTINCT window_length_ms FROM window_aggregates "
                        "WHERE window_kind = 'tumbling' ORDER BY 1").result_rows
    return [int(r[0]) for r in rows]


def resolutions_s(lengths_ms: list[int], extra_s: tuple[int, ...] = (300, 3600)) -> list[int]:
    """Chart resolutions: each stored length, plus coarser ones that are whole multiples of one of them."""
    lengths_s = [ms // 1000 for ms in lengths_ms if ms % 1000 == 0]
    return sorted({*lengths_s, *(r for r in extra_s if any(r % n == 0 for n in lengths_s))})


def series_buckets(client: Client, series: SeriesKey, resolution_s: int, since: datetime,
                   until: datetime) -> pd.DataFrame:
    """One row per bucket of ``resolution_s``: start, count, rate, p50/p90/p99, distinct users, final.

    Buckets come from ``store.range_query``: sums add up and percentiles / distinct counts are read from the merged
    sketches of the bucket's windows, never averaged. Each window's newest version is used (corrections).
    """
    buckets = range_query.range_buckets(client, series, since, until, resolution_s)
    return pd.DataFrame([{
        "window_start": b.start, "event_count": b.count, "rate": b.rate,
        "p50": b.quantiles.get(0.5), "p90": b.quantiles.get(0.9), "p99": b.quantiles.get(0.99),
        "distinct_users": b.distinct_users, "final": b.final,
    } for b in buckets if b.windows])


def dead_letter_count(client: Client) -> int:
    return int(client.query("SELECT count() FROM dead_letters FINAL").result_rows[0][0])


def alert_states(client: Client) -> pd.DataFrame:
    """Current state of every (rule, series), firing first."""
    result = client.query(
        "SELECT rule, series, state, severity, value, threshold, since, evaluated_until FROM alert_states FINAL "
        "ORDER BY state = 'firing' DESC, state = 'pending' DESC, rule, series")
    return pd.DataFrame(result.result_rows, columns=result.column_names)


def alert_history(client: Client, since: datetime, until: datetime) -> pd.DataFrame:
    """Transitions with their window end in ``[since, until)``, oldest first."""
    result = client.query(
        "SELECT window_end, rule, series, to_state, value, threshold, severity FROM alert_transitions FINAL "
        "WHERE window_end >= {lo:DateTime64(3)} AND window_end < {hi:DateTime64(3)} ORDER BY window_end",
        parameters={"lo": since.replace(tzinfo=None), "hi": until.replace(tzinfo=None)})
    return pd.DataFrame(result.result_rows, columns=result.column_names)
