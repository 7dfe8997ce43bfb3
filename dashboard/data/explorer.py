"""The metric explorer's data: the series to pick from, then one series' windows of the chosen kind."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import pandas as pd
from clickhouse_connect.driver.client import Client

from dashboard import queries
from dashboard.data.reader import Reader
from dashboard.queries import SeriesCatalog
from store import pipeline
from store.range_query import SeriesKey

WindowKind = Literal["tumbling", "hopping", "sliding"]


@dataclass(frozen=True)
class ExplorerCatalog:
    """What the explorer's pickers offer."""

    catalog: SeriesCatalog
    batches: dict[str, datetime] | None
    """When each stream query's last batch was stored; read only when there is no series yet (the page then says
    how fresh the store is instead of drawing pickers)."""


def explorer_catalog(reader: Reader, since: datetime | None = None) -> ExplorerCatalog:
    """The series (most active since ``since`` first), their tumbling lengths and hopping windowings; the freshness
    batches too when there is no series."""
    catalog = reader.one("series_catalog", lambda client: queries.series_catalog(client, since))
    batches = None if catalog.series else reader.one("batches", pipeline.last_batches)
    return ExplorerCatalog(catalog, batches)


@dataclass(frozen=True)
class ExplorerData:
    """One series' windows in a range, as the explorer charts them."""

    batches: dict[str, datetime]
    windows: pd.DataFrame
    """Tumbling: one row per bucket (``queries.series_buckets``); hopping: each window (``queries.hopping_windows``);
    sliding: each event's trailing window (``queries.sliding_windows``)."""


def explorer_data(reader: Reader, series: SeriesKey, kind: WindowKind, since: datetime, until: datetime, *,
                  lengths_ms: Sequence[int] = (), resolution_s: int | None = None,
                  hopping: tuple[int, int] | None = None) -> ExplorerData:
    """``series``' windows of ``kind`` over ``[since, until)`` beside the freshness batches. Tumbling: buckets of
    ``resolution_s`` (``lengths_ms``: the stored tumbling lengths, :attr:`SeriesCatalog.lengths_ms`); hopping: the
    windowing ``hopping`` = (length_ms, hop_ms)."""
    if kind == "tumbling" and resolution_s is None:
        raise ValueError("tumbling windows need a resolution_s")
    if kind == "hopping" and hopping is None:
        raise ValueError("hopping windows need a hopping (length_ms, hop_ms)")

    def windows(client: Client) -> pd.DataFrame:
        if kind == "tumbling":
            return queries.series_buckets(client, series, resolution_s, since, until, lengths_ms)
        if kind == "hopping":
            return queries.hopping_windows(client, series, *hopping, since, until)
        return queries.sliding_windows(client, series, since, until)

    data = reader.together(batches=pipeline.last_batches, windows=windows)
    return ExplorerData(data["batches"], data["windows"])
