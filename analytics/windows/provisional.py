"""Provisional tumbling and hopping rows: a window's row as it stands after each ``accept`` batch, before the
``windows`` query has taken that batch.

The ``windows`` query takes a reader batch every ``stream.trigger_interval_s`` (``analytics.reader_batches``), so
its rows move at that pace plus a batch's run time. ``accept`` runs more often (``stream.accept_interval_s``) and
already aggregates its events per series and grain bucket (``analytics.windows.partials``). After publishing a
batch, its driver merges that batch's partials, and those of every earlier batch the ``windows`` query has not
taken yet, into the newest rows of the windows they touch (the ones it wrote last, kept while they can stand for the
stored ones: :func:`reusable`; else the stored ones), and writes the result to ``window_aggregates`` like any row:
readers see the window move after each accept batch, with no change on their side. Each round is recorded beside
the queries' batches (``store.pipeline.PROVISIONAL_WINDOWS``), which the dashboard's tumbling and hopping charts
follow.

Which row wins is decided by ``version`` alone (``ReplacingMergeTree``), because a version names the newest accept
batch a row covers (``analytics.rounds.covered``):

- the ``windows`` query writes ``2c + 1``, ``c`` being the newest accept batch of its micro-batch
  (``analytics.rounds.reader_version``);
- a provisional row written at accept batch ``k`` has ``2k`` (``analytics.rounds.provisional_version``).

So a provisional row replaces every row covering less, and the ``windows`` query's row replaces it once that
query has taken batch ``k``: the exact row always has the last word. A provisional row is the stored row it was
merged into (covering ``c``) plus the partials of the accept batches after ``c`` up to ``k``; a ``windows`` row
written meanwhile has a version of its own and wins or loses by it, never double counts.

What is final does not change. A provisional row is written only for a window whose end is past **every
watermark the ``windows`` query can apply while it takes these accept batches**: that query's watermark is the
latest corrected event time of the reader batches before the one it is taking, minus the allowed lateness, so it
is at most the latest time of every accept batch up to ``k`` minus that lateness
(``analytics.rounds.watermark_bound_ms``). The ``windows`` query will therefore keep every contribution the
provisional row counted, and write the window again after it; a window at or behind that bound is left to the
``windows`` query alone (its contribution may be a dropped straggler). Provisional rows are never final
(``window_results.is_final``), and nothing judges them: the alert evaluator reads final windows only.

A drain (``availableNow``) hands every accept batch over on its own, so it writes none, and neither does a job
with ``accept_interval_s`` equal to the trigger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from clickhouse_connect.driver.exceptions import ClickHouseError
from datasketches import hll_sketch, tgt_hll_type

from analytics import accepted_log
from analytics.progress import record_round
from analytics.rounds import AcceptRounds, Pending, covered, provisional_version
from analytics.sinks import Newest, timed
from analytics.vocabulary import (
    ACCEPT_QUERY,
    BUCKET_START,
    LEVEL_FIELDS,
    QUANTILES,
    SERIES,
    WINDOWS_QUERY,
    assign_windows,
    window_specs,
)
from analytics.windows.partials import SCHEMA as PARTIALS_SCHEMA
from eventide.config import Config
from store.client import StoreUnavailable, connect
from store.pipeline import PROVISIONAL_WINDOWS
from store.range_query import SKETCH_FORMATS, hll_estimate, merge_hll, merge_kll

log = logging.getLogger(__name__)

OUTCOMES_KEPT = 10_000
outcomes: Newest[int, tuple[int, int]] = Newest(OUTCOMES_KEPT)
"""The newest accept batches' outcome in this driver (at most ``OUTCOMES_KEPT``): batch id → (windows its events
touched that were left to the ``windows`` query, when its rows were written, epoch ms). Read by the benchmark: the
events of a batch with none left moved their windows then."""

WindowKey = tuple[str, int, int, str, str, str, str]
"""(window_kind, window_length_ms, window_start_ms, app, kind, name, series_tags): ``window_aggregates``' key."""

_WINDOW = ("window_kind", "window_length_ms", "window_hop_ms", "window_start_ms", "window_end_ms")
_ADDED = ("event_count", "value_count", *LEVEL_FIELDS)
STORED_COLUMNS = ("event_count", "value_count", "sum", "min", "max", "value_sketch", "users_sketch",
                  "devices_sketch", *LEVEL_FIELDS, "version")
"""What a provisional row needs of the stored row it merges into."""


@dataclass(frozen=True)
class Provisional:
    """The rows one accept batch writes, and what it left to the ``windows`` query."""

    rows: pa.Table
    windows_left: int
    """Windows the batch's events touch that got no provisional row: at or behind the watermark bound."""
    written: dict[WindowKey, dict[str, Any]]
    """``rows`` by window, as dicts (without ``version``)."""


def window_contributions(partials: pa.Table, config: Config) -> pa.Table:
    """One row per (partial, tumbling or hopping window of its bucket): the partial's index (``partial``) and the
    window's columns."""
    assigned = assign_windows(window_specs(config), np.asarray(partials[BUCKET_START], dtype=np.int64))
    return assigned.rename_columns(["partial", *assigned.column_names[1:]])


@dataclass(frozen=True)
class BatchPartials:
    """One accept batch's window partials, indexed by the windows they count in: built once per batch, while each
    round merges only the windows it writes (a batch stays pending for several rounds)."""

    windows: dict[WindowKey, tuple[dict[str, Any], list[dict[str, Any]]]]
    """Per window: its columns (kind, length, hop, start and end in ms) and the partials counting in it."""
    newest_event_ms: int | None
    """The batch's latest ``corrected_event_time`` (epoch ms); None for a batch without events."""


def by_window(partials: pa.Table, config: Config) -> BatchPartials:
    """An accept batch's ``partials`` (``analytics.windows.partials.SCHEMA``) indexed by window."""
    rows = partials.to_pylist()
    windows: dict[WindowKey, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for c in window_contributions(partials, config).to_pylist():
        row = rows[c["partial"]]
        key = _key(c, [row[s] for s in SERIES])
        if key in windows:
            windows[key][1].append(row)
        else:
            windows[key] = ({w: c[w] for w in _WINDOW}, [row])
    newest = (int(partials["corrected_event_time"].cast(pa.int64()).to_numpy().max()) // 1000
              if partials.num_rows else None)
    return BatchPartials(windows, newest)


def touched_windows(partials: BatchPartials, bound_ms: int) -> tuple[set[WindowKey], set[WindowKey]]:
    """The windows ``partials`` contribute to: those ending after ``bound_ms``, and those at or behind it."""
    after: set[WindowKey] = set()
    behind: set[WindowKey] = set()
    for key, (window, _) in partials.windows.items():
        (after if window["window_end_ms"] > bound_ms else behind).add(key)
    return after, behind


def provisional_rows(config: Config, batches: Sequence[int], pending: Mapping[int, BatchPartials],
                     stored: Mapping[WindowKey, dict[str, Any]], committed: int, bound_ms: int,
                     written_at: datetime) -> Provisional:
    """The provisional rows of accept ``batches`` (one, or several taken together), versioned by the newest, k:
    for each window their partials touch whose end is past ``bound_ms``, the stored row (``stored``,
    :data:`STORED_COLUMNS`; absent for a window with none) merged with the partials of the accept batches after the
    one that row covers, up to k.

    ``pending`` holds the partials of every accept batch the ``windows`` query may not have taken (at least those
    after ``committed``, the newest accept batch of its newest committed micro-batch), by batch id. A stored row
    covering less than ``committed`` has no contribution in between: that micro-batch wrote every window it
    changed before it committed."""
    batch_id = max(batches)
    own: set[WindowKey] = set()
    behind: set[WindowKey] = set()
    for batch in batches:
        after_bound, behind_bound = touched_windows(pending[batch], bound_ms)
        own |= after_bound
        behind |= behind_bound
    sources = sorted((item for item in pending.items() if item[0] <= batch_id), key=lambda item: item[0])
    written = {}
    for key in sorted(own):
        since = max(covered(stored[key]["version"]) if key in stored else -1, committed)
        window: dict[str, Any] | None = None
        parts: list[dict[str, Any]] = []
        for source, partials in sources:
            if source > since and key in partials.windows:
                window, rows = partials.windows[key]
                parts.extend(rows)
        if window is not None:
            written[key] = _merged(config, window, stored.get(key), parts)
    out = list(written.values())
    table = (pa.Table.from_pylist(out, schema=_ROW_SCHEMA) if out else _ROW_SCHEMA.empty_table())
    table = table.append_column("version", pa.array([provisional_version(batch_id)] * table.num_rows, pa.uint64()))
    table = table.append_column("written_at", pa.array([written_at] * table.num_rows, pa.timestamp("ms", tz="UTC")))
    return Provisional(table, len(behind - own), written)


def reusable(written: Mapping[WindowKey, dict[str, Any]], keys: set[WindowKey],
             committed: int) -> dict[WindowKey, dict[str, Any]]:
    """The rows of ``keys`` among those this driver wrote last (``written``, with their ``version``) that can stand
    for the stored ones: those covering at least ``committed``, the newest accept batch the ``windows`` query has
    committed. Such a row plus the partials after it is the row the store's newest would give with the partials
    after it, whichever wins there. An older one may have been replaced by a ``windows`` row covering batches whose
    partials are no longer kept: that window is read from the store."""
    return {k: written[k] for k in keys if k in written and covered(written[k]["version"]) >= committed}


def _key(contribution: dict[str, Any], series: list[str]) -> WindowKey:
    return (contribution["window_kind"], contribution["window_length_ms"], contribution["window_start_ms"],
            *series)   # type: ignore[return-value]


def _merged(config: Config, window: dict[str, Any], base: dict[str, Any] | None,
            parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One window row: ``base`` (a stored row, or None) and the partials ``parts`` of the ``window``, merged as the
    ``windows`` query merges them (``analytics.windows.query.aggregate``)."""
    first = parts[0]
    counts = {f: sum(p[f] for p in parts) + (base[f] if base else 0) for f in _ADDED}
    values = [p for p in parts if p["value_count"]]
    total = sum(p["sum"] for p in values) + (base["sum"] if base and base["value_count"] else 0.0)
    lows = [p["min"] for p in values] + ([base["min"]] if base and base["value_count"] else [])
    highs = [p["max"] for p in values] + ([base["max"]] if base and base["value_count"] else [])
    kll = merge_kll([*([base["value_sketch"]] if base and base["value_count"] else []),
                     *(p["value_sketch"] for p in values)])
    users, devices = (merge_hll([*([base[c]] if base else []), *(p[c] for p in parts)], config.stream.hll_lg_k,
                                tgt_hll_type.HLL_8) or hll_sketch(config.stream.hll_lg_k, tgt_hll_type.HLL_8)
                      for c in ("users_sketch", "devices_sketch"))
    has_values = counts["value_count"] > 0   # exactly when some merged KLL sketch holds values
    length_ms = window["window_length_ms"]
    return {
        "window_kind": window["window_kind"], "window_length_ms": length_ms, "window_hop_ms": window["window_hop_ms"],
        "window_start": datetime.fromtimestamp(window["window_start_ms"] / 1000, UTC),
        "window_end": datetime.fromtimestamp(window["window_end_ms"] / 1000, UTC),
        **{s: first[s] for s in SERIES},
        "event_count": counts["event_count"], "value_count": counts["value_count"], "sum": total,
        "min": min(lows) if has_values else None, "max": max(highs) if has_values else None,
        "mean": total / counts["value_count"] if has_values else None,
        "rate": counts["event_count"] * 1000.0 / length_ms,
        **{name: kll.get_quantile(q, inclusive=True) if kll is not None else None for name, q in QUANTILES.items()},
        "distinct_users": hll_estimate(users), "distinct_devices": hll_estimate(devices),
        "value_sketch": kll.serialize() if kll is not None else b"",
        "users_sketch": users.serialize_compact(), "devices_sketch": devices.serialize_compact(),
        **{f: counts[f] for f in LEVEL_FIELDS},
    }


def _store_time(epoch_ms: int) -> str:
    """A window bound as a ``DateTime64(3, 'UTC')`` literal."""
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


_ROW_SCHEMA = pa.schema([
    ("window_kind", pa.string()), ("window_length_ms", pa.uint64()), ("window_hop_ms", pa.uint64()),
    ("window_start", pa.timestamp("ms", tz="UTC")), ("window_end", pa.timestamp("ms", tz="UTC")),
    *[(s, pa.string()) for s in SERIES],
    ("event_count", pa.uint64()), ("value_count", pa.uint64()), ("sum", pa.float64()), ("min", pa.float64()),
    ("max", pa.float64()), ("mean", pa.float64()), ("rate", pa.float64()),
    *[(name, pa.float64()) for name in QUANTILES],
    ("distinct_users", pa.uint64()), ("distinct_devices", pa.uint64()),
    ("value_sketch", pa.binary()), ("users_sketch", pa.binary()), ("devices_sketch", pa.binary()),
    *[(f, pa.uint64()) for f in LEVEL_FIELDS],
])


class ProvisionalWindows(AcceptRounds[BatchPartials]):
    """``accept``'s side: the provisional rows of the windows each published batch touched (module docstring),
    written by a thread of their own (``analytics.rounds``). Keeps the partials of the accept batches the
    ``windows`` query has not taken yet, read once each."""

    name = "provisional_windows"

    def __init__(self, config: Config) -> None:
        super().__init__(config, config.checkpoint_dir / WINDOWS_QUERY)
        self._written: dict[WindowKey, dict[str, Any]] = {}   # the rows last written, by window (see reusable)

    def round(self, start: Pending, pending: dict[int, BatchPartials]) -> Provisional | None:
        """Write the provisional rows of the round's accept batches; None when they could not be (the store
        unreachable). (``start.committed`` was read before the store is: see :func:`provisional_rows`.)"""
        committed, batches, batch_id = start.committed, start.batches, max(start.batches)
        bound_ms = self.bound_ms(start, (p.newest_event_ms for p in pending.values()))
        touched: set[WindowKey] = set()
        for batch in batches:
            touched |= touched_windows(pending[batch], bound_ms)[0]
        try:
            with timed(ACCEPT_QUERY, "provisional_windows.lookup"):
                known = reusable(self._written, touched, committed)
                stored = known | self._stored(touched - known.keys())
            with timed(ACCEPT_QUERY, "provisional_windows.merge"):
                result = provisional_rows(self.config, batches, pending, stored, committed, bound_ms,
                                          datetime.now(UTC))
            if result.rows.num_rows:
                with timed(ACCEPT_QUERY, "provisional_windows.insert"), connect(self.config) as client:
                    client.insert_arrow("window_aggregates", result.rows)
                    # After the rows: a page that sees the round reads them (dashboard.live).
                    record_round(client, PROVISIONAL_WINDOWS, datetime.now(UTC))
        except (StoreUnavailable, ClickHouseError) as exc:
            log.warning("accept batches %s: no provisional window rows (%s)", batches,
                        str(exc).splitlines()[0][:200])
            return None
        self._remember(result, provisional_version(batch_id), committed)
        written_ms = int(time.time() * 1000)
        for batch in batches:
            outcomes.note(batch, (result.windows_left, written_ms))
        return result

    def _remember(self, result: Provisional, version: int, committed: int) -> None:
        """Keep the rows just written, so the next round merges into them instead of reading them back; forget
        those the ``windows`` query's committed rows may have replaced (:func:`reusable`)."""
        for key, row in result.written.items():
            self._written[key] = {**{c: row[c] for c in STORED_COLUMNS if c != "version"}, "version": version}
        for key in [k for k, row in self._written.items() if covered(row["version"]) < committed]:
            del self._written[key]

    def read(self, batch_id: int) -> BatchPartials:
        files = accepted_log.partials_files(self.config, batch_id)
        table = (pa.concat_tables([pq.read_table(f, schema=PARTIALS_SCHEMA) for f in files])
                 if files else PARTIALS_SCHEMA.empty_table())
        return by_window(table, self.config)

    def _stored(self, keys: set[WindowKey]) -> dict[WindowKey, dict[str, Any]]:
        """The newest stored row of each window of ``keys``."""
        if not keys:
            return {}
        # Bound in the query text (quoted by the client), not as server-side parameters: past a few kB those travel
        # as multipart form data, which the local store does not serve.
        listed = tuple((k[0], k[1], _store_time(k[2]), *k[3:]) for k in sorted(keys))
        with connect(self.config) as client:
            found = client.query(
                "SELECT window_kind, window_length_ms, toUnixTimestamp64Milli(window_start), app, kind, name, "
                f"series_tags, {', '.join(STORED_COLUMNS)} FROM window_aggregates FINAL "
                "WHERE (window_kind, window_length_ms, window_start, app, kind, name, series_tags) IN %(keys)s",
                parameters={"keys": listed}, column_formats=SKETCH_FORMATS)
        return {tuple(row[:7]): dict(zip(STORED_COLUMNS, row[7:], strict=True))   # type: ignore[misc]
                for row in found.result_rows}
