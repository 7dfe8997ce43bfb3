"""The Overview's data: is data flowing, is the pipeline keeping up, is anything on fire?"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import pandas as pd
from clickhouse_connect.driver.client import Client

from dashboard import queries
from dashboard.data.reader import Reader, batches_and_buckets
from dashboard.queries import DataLoss
from eventide.config import Config
from store import pipeline


@dataclass(frozen=True)
class OverviewData:
    """Everything the Overview shows for a range."""

    batches: dict[str, datetime]
    """When each stream query's last batch was stored (the freshness line)."""
    resolution_s: int
    """The charts' bucket."""
    rates: pd.DataFrame
    """Events/s and error lines/s per app and bucket (empty before the first tumbling window)."""
    dropped: pd.DataFrame
    dead: pd.DataFrame
    duplicates: pd.DataFrame
    loss: DataLoss
    watermarks: dict[str, datetime]
    alert_states: pd.DataFrame
    lag: dict[int, int]
    """Records behind per Kafka partition; empty when unknown (see ``lag_error``) or nothing was processed yet."""
    lag_error: str
    """Why the broker gave no end offsets ("" when it did): the broker may be down while the store is up."""


ConsumerLag = Callable[[Config, Client], dict[int, int]]


def overview_data(reader: Reader, since: datetime, until: datetime,
                  consumer_lag: ConsumerLag = pipeline.consumer_lag) -> OverviewData:
    """The Overview's queries over ``[since, until)``: the freshness batches beside the window lengths (which set the
    bucket), then the rest side by side. ``consumer_lag``: the store's processed offsets against the broker's end
    offsets (the benchmark, which runs no broker, passes the store half alone)."""
    config = reader.config
    batches, lengths, resolution = batches_and_buckets(reader, since, until)

    def lag_or_error(client: Client) -> tuple[dict[int, int], str]:
        try:
            return consumer_lag(config, client), ""
        except Exception as exc:  # the broker may be down while the store is up: say so, keep the page
            return {}, str(exc)

    data = reader.together(
        rates=lambda c: queries.app_rates(c, since, until, resolution, min(lengths)) if lengths else pd.DataFrame(),
        dropped=lambda c: queries.dropped_stragglers(c, since, until, resolution),
        dead=lambda c: queries.dead_letter_rate(c, since, until, resolution),
        duplicates=lambda c: queries.duplicates_per_app(c, since, until),
        loss=lambda c: queries.kafka_data_loss(c, since, until),
        marks=pipeline.watermarks, states=queries.alert_states, lag=lag_or_error)
    lag, lag_error = data["lag"]
    return OverviewData(batches, resolution, data["rates"], data["dropped"], data["dead"],
                        data["duplicates"], data["loss"], data["marks"], data["states"], lag, lag_error)
