"""Each dashboard page's data over a 24 h range: how long each page waits for the store per render.

Serves a temporary embedded store (``bench.dashboard_store``), fills it with 24 h of what the stream job and the
alert evaluator write for 50 series (``bench.dashboard_fill``), then renders each page's data N times by calling the
page's own data function (``dashboard.data``: the same queries, the same arguments, side by side where the page runs
them side by side, each on a reader client of its own), so a render's time is what the page waits for. Per call, the
median time of the slowest calls by the page's name for them (overlapping calls each count their own wait).
Plotly/Streamlit drawing is not included, nor the broker's half of the Overview's consumer lag (no Kafka runs here:
the store's half, the offsets processed, is).

    .venv/bin/python -m bench.dashboard_pages --repeat 20
    .venv/bin/python -m bench.dashboard_pages --tumbling 10,60   # the default config's windows (6x the rows)
    .venv/bin/python -m bench.dashboard_pages --hours 168        # a week stored, the pages still show 24 h
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from clickhouse_connect.driver.client import Client

from bench.dashboard_fill import Load, events_total, populate
from bench.dashboard_store import percentile, temporary_store
from dashboard import queries
from dashboard.data.alerts import alerts_data
from dashboard.data.explorer import WindowKind, explorer_catalog, explorer_data
from dashboard.data.logs import logs_charts_data, logs_dead_letters, stored_lines
from dashboard.data.overview import overview_data
from dashboard.data.reader import Reader, last_batches, span_minutes
from dashboard.data.sessions import sessions_data
from dashboard.data.stragglers import stragglers_data
from dashboard.log_search import LogQuery
from eventide.config import Config
from store import pipeline
from store.client import connect

T = TypeVar("T")
RANGE = timedelta(hours=24)
"""The range every page shows."""


class TimedReader(Reader):
    """The pages' reader, timing each named call (summed per name) and counting its rows."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.seconds: dict[str, float] = {}
        self.rows: dict[str, int] = {}

    def call(self, name: str, read: Callable[[Client], T], client: Client) -> T:
        t = time.perf_counter()
        out = read(client)
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t
        self.rows[name] = _rows(out)
        return out


def _rows(out: Any) -> int:
    """What a call gave back, counted: a frame's rows, a catalog's series, a data-loss report's ranges."""
    out = out[0] if isinstance(out, tuple) else out
    for part in ("ranges", "series"):
        out = getattr(out, part, out)
    return len(out) if hasattr(out, "__len__") else 1


def processed_offsets_only(config: Config, client: Client) -> dict[int, int]:
    """``pipeline.consumer_lag``'s store half (the offsets the job processed); its broker half is not part of this
    bench, so no partition is reported behind."""
    pipeline.processed_offsets(client, config.kafka.events_topic)
    return {}


Render = Callable[[Reader, datetime, datetime], object]


def overview(reader: Reader, since: datetime, until: datetime) -> object:
    return overview_data(reader, since, until, consumer_lag=processed_offsets_only)


def explorer(kind: WindowKind, resolution_s: int | None = None) -> Render:
    """The explorer's pickers, then the busiest series of the window kind's family (logs for sliding windows)."""
    def render(reader: Reader, since: datetime, until: datetime) -> object:
        catalog = explorer_catalog(reader).catalog
        chosen = next(s for s in catalog.series if (s.kind == "log") == (kind == "sliding"))
        hopping = catalog.hopping.get(chosen, [])
        return explorer_data(reader, chosen, kind, since, until, lengths_ms=catalog.lengths_ms,
                             resolution_s=resolution_s, hopping=hopping[0] if kind == "hopping" else None)
    return render


def dead_lettered_logs(reader: Reader, since: datetime, until: datetime) -> object:
    """The Logs page's view of dead-lettered log records, unfiltered (its searches: ``bench.log_search``)."""
    return logs_dead_letters(reader, LogQuery(since, until))


def refresh_with_nothing_new(reader: Reader, since: datetime, until: datetime) -> object:
    """What a refreshing page part asks at every refresh before deciding it has nothing new to read
    (``dashboard.live``): the stream queries' newest batches, or a followed search's stored line count."""
    return last_batches(reader), stored_lines(reader)


def run(config: Config, load: Load, data: Path, repeat: int) -> None:
    """Fill the store, then render every page ``repeat`` times and print the timings."""
    t = time.perf_counter()
    until = datetime.now(UTC).replace(second=0, microsecond=0)
    written = populate(config, load, until)
    fill_s = time.perf_counter() - t
    with connect(config) as client:
        parts = dict(client.query("SELECT table, count() FROM system.parts WHERE active AND database = 'bench' "
                                  "GROUP BY table").result_rows)
        lengths = queries.window_lengths_ms(client)
    size = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
    print(f"load: {len(load.series)} series x {load.hours} h, tumbling {load.tumbling_s} s, hopping "
          f"{load.hopping}, {load.events_per_minute} events/min per series ({events_total(load):,} events), "
          f"{load.versions} write(s) per window; filled in {fill_s:.0f} s, {size / 2**20:.0f} MiB on disk")
    for table, n in sorted(written.items()):
        print(f"  {table:<18} {n:>10,} rows  {parts.get(table, 0):>3} parts")
    since = until - RANGE
    pages: list[tuple[str, Render]] = [
        ("overview", overview),
        *[(f"explorer tumbling {res} s", explorer("tumbling", res)) for res in queries.resolutions_s(lengths)],
        *([("explorer hopping", explorer("hopping"))] if load.hopping else []),
        ("explorer sliding (log series)", explorer("sliding")),
        ("logs (charts)", logs_charts_data), ("logs (dead-lettered records)", dead_lettered_logs),
        ("sessions", sessions_data), ("stragglers", stragglers_data), ("alerts", alerts_data),
        ("a refresh with nothing new", refresh_with_nothing_new)]
    minutes = span_minutes(since, until)
    print(f"\nrange: last {minutes} min, page resolution {queries.overview_resolution_s(lengths, minutes)} s; "
          f"{repeat} renders per page (each: its page's data function, its store clients and queries)")
    print(f"{'page':<32} {'p50 s':>7} {'p95 s':>7} {'max s':>7}   slowest calls (median ms) and rows")
    for name, render in pages:
        totals, readers = [], []
        for _ in range(repeat):
            reader = TimedReader(config)
            t = time.perf_counter()
            render(reader, since, until)
            totals.append(time.perf_counter() - t)
            readers.append(reader)
        calls = {c: statistics.median(r.seconds[c] for r in readers) for c in readers[0].seconds}
        top = sorted(calls.items(), key=lambda kv: -kv[1])[:4]
        detail = ", ".join(f"{c} {s * 1000:.0f} ({readers[0].rows[c]:,})" for c, s in top)
        print(f"{name:<32} {percentile(totals, 0.5):>7.3f} {percentile(totals, 0.95):>7.3f} "
              f"{max(totals):>7.3f}   {detail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20, help="renders per page")
    parser.add_argument("--tumbling", default="60", help="tumbling window lengths in s, e.g. 10,60")
    parser.add_argument("--versions", type=int, default=1, help="writes per window (early result + corrections)")
    parser.add_argument("--hours", type=int, default=24,
                        help="history stored (the pages still show the last 24 h): what unbounded queries pay for")
    parser.add_argument("--no-hopping", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temporary store (its path is printed)")
    args = parser.parse_args()
    load = Load(tumbling_s=tuple(sorted(int(s) for s in args.tumbling.split(","))), versions=args.versions,
                hours=args.hours, hopping=None if args.no_hopping else Load.hopping)
    with temporary_store(args.keep) as (config, data):
        run(config, load, data, args.repeat)


if __name__ == "__main__":
    main()
