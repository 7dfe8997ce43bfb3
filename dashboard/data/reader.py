"""How a page's data function reaches the store: as the dashboard's ``reader`` role, a client per call, a page's
independent calls side by side."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from clickhouse_connect.driver.client import Client

from dashboard.queries import concurrently, overview_resolution_s, window_lengths_ms
from eventide.config import Config
from store import pipeline
from store.client import connect

T = TypeVar("T")


class Reader:
    """The store as a page's data function reads it: :meth:`one` call on a client of its own, or several
    :meth:`together`, side by side (``queries.concurrently``: a page waits for about its slowest query, not the sum).

    Every call has a name (what the page calls the result). Each one runs through :meth:`call`, so a subclass can
    watch the calls (the benchmark times them) while the data function stays the page's own. An unreachable store
    raises ``store.client.StoreUnavailable``; the page turns it into an error (``common.page_data``).
    """

    def __init__(self, config: Config) -> None:
        self.config = config

    def call(self, name: str, read: Callable[[Client], T], client: Client) -> T:
        """Run one named ``read`` on ``client``."""
        return read(client)

    def one(self, name: str, read: Callable[[Client], T]) -> T:
        """``read`` on a reader client of its own."""
        with connect(self.config, role="reader") as client:
            return self.call(name, read, client)

    def together(self, **reads: Callable[[Client], Any]) -> dict[str, Any]:
        """Independent ``reads`` side by side, a client each; their results by name. Raises the first failed read's
        exception once all are done."""
        return concurrently(self.config, {name: partial(self.call, name, read) for name, read in reads.items()})


def span_minutes(since: datetime, until: datetime) -> int:
    """The length of ``[since, until)`` in whole minutes (at least 1): the range a page's chart resolution is for."""
    return max(1, round((until - since).total_seconds() / 60))


def bucket_seconds(client: Client, since: datetime, until: datetime) -> tuple[list[int], int]:
    """(stored tumbling lengths in ms, the chart bucket in s for the range ``[since, until)``)."""
    lengths = window_lengths_ms(client)
    return lengths, overview_resolution_s(lengths, span_minutes(since, until))


def last_batches(reader: Reader) -> dict[str, datetime]:
    """When each stream query stored its newest batch: what a refreshing page part asks at every refresh (its
    freshness line, and whether its charts have anything new to read, ``dashboard.live``)."""
    return reader.one("batches", pipeline.last_batches)


def batches_and_buckets(reader: Reader, since: datetime, until: datetime) -> tuple[dict[str, datetime], list[int], int]:
    """A charted page's first step: when each stream query's last batch was stored (the freshness line), beside the
    stored tumbling lengths in ms and the charts' bucket in s for ``[since, until)``, which its other queries need."""
    first = reader.together(batches=pipeline.last_batches, lengths=lambda c: bucket_seconds(c, since, until))
    lengths, resolution = first["lengths"]
    return first["batches"], lengths, resolution
