"""The Logs page's searches over N stored lines (issue 38): how long each search waits for the store.

Serves a temporary embedded store (``bench.dashboard_store``), writes ``--lines`` log lines of 5 apps and 2 loggers
over ``--hours`` (default 24 h) into ``logs`` (``bench.log_fill``), then runs the Logs page's searches, each
``--repeat`` times alone (the one ``dashboard.log_search`` call) and as the page renders it (its data functions,
``dashboard.data.logs``: its pickers, then the lines beside the count of all matches, or the patterns): (a) a common
and a rare word over the last hour, (b) a phrase, (c) a word with an app and a level, (d) the message patterns of
the last 15 min, and, beyond those, the same over wider ranges. 10M lines over 24 h put 417k in the last hour (116 a
second, about 7x the log rate of the page bench's 10 log series): a last-hour search then scans a demanding share,
where 10M lines over the 7-day retention would leave 60k an hour. Each search is timed as written and after
``OPTIMIZE TABLE logs FINAL`` (one part per day); ``--variants hourly`` also times a copy of the table with the hour
first in its key. What a call reads comes from the store's ``system.events`` counters around one call and from
``EXPLAIN indexes = 1``.

    .venv/bin/python -m bench.log_search --lines 10000000 --repeat 20 --variants hourly
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
from clickhouse_connect.driver.client import Client

from bench.dashboard_store import REPO, percentile, temporary_store
from bench.log_fill import LogLoad, populate_logs
from dashboard.data.logs import PATTERNS_SHOWN, logs_lines, logs_patterns, logs_pickers
from dashboard.data.reader import Reader
from dashboard.log_search import LogQuery, count_lines, message_patterns, search_lines
from eventide.config import Config
from store.client import connect


@dataclass(frozen=True)
class LogCase:
    """One search of the Logs page, with the page's sizes (``[dashboard]``): the newest ``log_lines_per_page``
    lines, or the top 20 message patterns of at most ``log_pattern_lines`` lines. ``run`` is that one call;
    ``render`` what the page waits for when it shows the search (dashboard/views/logs.py): the pickers' app and
    logger names of the range, then the lines beside the count of every matching line, or the patterns."""

    label: str
    minutes: int
    text: str = ""
    apps: tuple[str, ...] = ()
    levels: tuple[str, ...] = ()
    patterns: bool = False

    def query(self, until: datetime) -> LogQuery:
        return LogQuery(since=until - timedelta(minutes=self.minutes), until=until, apps=self.apps,
                        levels=self.levels, text=self.text)

    def run(self, client: Client, config: Config, until: datetime) -> pd.DataFrame:
        if self.patterns:
            return message_patterns(client, self.query(until), PATTERNS_SHOWN, config.dashboard.log_pattern_lines)
        return search_lines(client, self.query(until), config.dashboard.log_lines_per_page)

    def render(self, config: Config, until: datetime) -> int:
        """The page's data functions for this search; returns how many lines match (counted up to the page's cap,
        past which it says "more than N"), for patterns how many were masked."""
        query, reader = self.query(until), Reader(config)
        logs_pickers(reader, query.since, query.until)
        if self.patterns:
            return int(logs_patterns(reader, query).attrs.get("lines", 0))
        return logs_lines(reader, query, config.dashboard.log_lines_per_page).total


LOG_CASES = (
    LogCase("(a) common word, last hour", 60, text="request"),
    LogCase("(a) rare word, last hour", 60, text="deadlock"),
    LogCase("(b) phrase, last hour", 60, text='"connection reset by peer"'),
    LogCase("(c) word + app + level, last hour", 60, text="timeout", apps=("app-3",), levels=("error",)),
    LogCase("(d) patterns, last 15 min", 15, patterns=True),
    # Beyond the four: what a wider range costs.
    LogCase("(e) common word, last 24 h", 24 * 60, text="request"),
    LogCase("(f) patterns, last hour", 60, patterns=True),
    LogCase("(g) no filter, last 24 h", 24 * 60),
)


class _Recorder:
    """A client that remembers the statements sent through it (to measure what a call reads, afterwards)."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self.sent: list[tuple[str, dict[str, Any] | None]] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._client, name)
        if not name.startswith(("query", "raw_query")):
            return target

        def record(query: str, parameters: dict[str, Any] | None = None, *args: Any, **kwargs: Any) -> Any:
            self.sent.append((query, parameters))
            return target(query, parameters, *args, **kwargs)
        return record


_COUNTERS = ("SelectedParts", "SelectedMarks", "SelectedRows", "ReadCompressedBytes")
_STEP = re.compile(r"^(Min-Max|Partition|PrimaryKey|Skip|Name: \S+|Granules: \S+)$")


def _counters(client: Client) -> dict[str, int]:
    """The store process's read counters: chDB answers X-ClickHouse-Summary's read_rows with the rows of the
    result and has no system.query_log, but its system.events counts every query's reads."""
    rows = client.query("SELECT event, value FROM system.events WHERE event IN {e:Array(String)}",
                        parameters={"e": list(_COUNTERS)}).result_rows
    return {name: int(value) for name, value in rows}


def _reads(client: Client, config: Config, case: LogCase, until: datetime) -> str:
    """What one call of ``case`` reads (the store's counters around it, nothing else running) and the granules each
    index keeps in its statements (EXPLAIN indexes = 1)."""
    recorder = _Recorder(client)
    before = _counters(client)
    case.run(recorder, config, until)    # type: ignore[arg-type]
    after = _counters(client)
    read = {k: after.get(k, 0) - before.get(k, 0) for k in _COUNTERS}
    plans = []
    for sql, params in recorder.sent:
        steps, label = [], ""
        for (line,) in client.query(f"EXPLAIN indexes = 1 {sql}", parameters=params).result_rows:
            m = _STEP.match(line.lstrip(" │├└─"))
            if not m:
                continue
            if m.group(1).startswith("Granules"):
                steps.append(f"{label} {m.group(1).split()[1]}")
            else:
                label = m.group(1).removeprefix("Name: ")
        plans.append(" ".join(steps))
    if len(plans) > 1:     # one statement per slice of the range: the granules each keeps after every index
        detail = f"{len(plans)} statements, granules kept " + ", ".join(p.split()[-1] if p else "-" for p in plans)
    else:
        detail = "granules " + " ".join(plans)
    return (f"{read['SelectedRows']:,} rows ({read['SelectedMarks']:,} granules, {read['SelectedParts']} parts), "
            f"{read['ReadCompressedBytes'] / 2**20:.1f} MiB compressed; {detail}")


def log_search(config: Config, until: datetime, repeat: int, title: str) -> None:
    """Each log case ``repeat`` times through the served store as the page's reader, alternately the one call (and
    an exact ``count_lines`` alone: "count") and the page's render (its count capped as the page caps it); p50/p95
    of each, and what one call reads."""
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"{title:<34} {'call p50':>8} {'p95':>6} {'count':>6} {'page p50':>8} {'p95':>6} {'max':>6} {'rows':>4} "
          f"{'match':>9}   what the call reads (load avg {load})")
    for case in LOG_CASES:
        calls: list[float] = []
        counts: list[float] = []
        renders: list[float] = []
        for _ in range(repeat):
            with connect(config, role="reader") as client:
                t = time.perf_counter()
                out = case.run(client, config, until)
                calls.append(time.perf_counter() - t)
                if not case.patterns:
                    t = time.perf_counter()
                    exact = count_lines(client, case.query(until))   # uncapped: what the page's cap saves
                    counts.append(time.perf_counter() - t)
            t = time.perf_counter()
            rendered = case.render(config, until)
            renders.append(time.perf_counter() - t)
            matched = rendered if case.patterns else exact
        with connect(config, role="reader") as client:
            reads = _reads(client, config, case, until)
        count = statistics.median(counts) if counts else float("nan")
        print(f"{case.label:<34} {percentile(calls, 0.5):>8.3f} {percentile(calls, 0.95):>6.3f} {count:>6.3f} "
              f"{percentile(renders, 0.5):>8.3f} {percentile(renders, 0.95):>6.3f} {max(renders):>6.3f} "
              f"{len(out):>4} {matched:>9,}   {reads}")


def log_storage(config: Config, database: str) -> str:
    """The logs table's rows, parts, bytes (columns compressed, skip indexes, all files on disk) and the bytes per
    line of its largest columns and of each skip index."""
    db = {"db": database}
    with connect(config) as client:
        rows, parts, comp, raw, skip, disk = client.query(
            "SELECT sum(rows), count(), sum(data_compressed_bytes), sum(data_uncompressed_bytes), "
            "sum(secondary_indices_compressed_bytes), sum(bytes_on_disk) FROM system.parts "
            "WHERE active AND database = {db:String} AND table = 'logs'", parameters=db).result_rows[0]
        cols = client.query(
            "SELECT column, sum(column_data_compressed_bytes) AS c FROM system.parts_columns WHERE active AND "
            "database = {db:String} AND table = 'logs' GROUP BY column ORDER BY c DESC", parameters=db).result_rows
        indexes = client.query(
            "SELECT name, data_compressed_bytes FROM system.data_skipping_indices WHERE database = {db:String} "
            "AND table = 'logs' ORDER BY data_compressed_bytes DESC", parameters=db).result_rows
    per_col = ", ".join(f"{name} {c / rows:.1f}" for name, c in cols[:6])
    per_idx = ", ".join(f"{name} {c / rows:.1f}" for name, c in indexes)
    return (f"{database}.logs: {rows:,} lines in {parts} parts; {disk / 2**20:,.0f} MiB on disk = "
            f"{disk / rows:.1f} B/line (columns {comp / rows:.1f} compressed, {raw / rows:.1f} uncompressed; skip "
            f"indexes {skip / rows:.1f}); B/line by column: {per_col}; by skip index: {per_idx}")




def run_logs(config: Config, load: LogLoad, repeat: int, variants: list[str]) -> None:
    """Fill ``logs`` with the load's lines, then time each log search ``repeat`` times: as written, and after the
    table is merged (one part per day, as background merges leave a day's partition). ``variants``: the same lines
    in a copy of the table changed as :data:`LOG_VARIANTS` says, merged, timed the same way."""
    until = datetime.now(UTC).replace(second=0, microsecond=0)
    fill = populate_logs(config, load, until)
    db = config.store.database
    print(f"\nlogs: {load.lines:,} lines over {load.hours:g} h ({load.per_hour:,.0f} per hour, "
          f"{load.per_hour / 4:,.0f} in the last 15 min), generated in {fill.generate_s:.1f} s; "
          f"{fill.bulk_lines:,} in blocks of {load.block:,}: inserted in {fill.bulk_insert_s:.1f} s "
          f"({fill.bulk_lines / max(fill.bulk_insert_s, 1e-9):,.0f} lines/s); the last {load.live_minutes:g} min's "
          f"{fill.live_lines:,} in {fill.live_inserts} micro-batches of {load.trigger_s} s: {fill.live_insert_s:.1f} s "
          f"({fill.live_insert_s / max(fill.live_inserts, 1) * 1000:.0f} ms per insert)")
    print(log_storage(config, db))
    log_search(config, until, repeat, "as written")
    print(f"\nOPTIMIZE TABLE logs FINAL: {_optimize(config, db):.0f} s")
    print(log_storage(config, db))
    log_search(config, until, repeat, "merged")
    if variants:
        for name in variants:
            other = f"{db}_{name}"
            t = time.perf_counter()
            with connect(config, database=None) as client:
                client.command(f"CREATE DATABASE {other}")
                client.command(f"CREATE TABLE {other}.stragglers AS {db}.stragglers")
                client.command(logs_variant_ddl(other, name))
                client.command(f"INSERT INTO {other}.logs SELECT * FROM {db}.logs")
            print(f"\nvariant {name} ({LOG_VARIANTS[name][0]}): copied in {time.perf_counter() - t:.0f} s")
            print(log_storage(config, other))
            print(f"OPTIMIZE TABLE {other}.logs FINAL: {_optimize(config, other):.0f} s")
            print(log_storage(config, other))
            variant_config = config.model_copy(update={"store": config.store.model_copy(update={"database": other})})
            log_search(variant_config, until, repeat, f"{name}, merged")


def _optimize(config: Config, database: str) -> float:
    t = time.perf_counter()
    with connect(config, database=database) as client:
        client.command("OPTIMIZE TABLE logs FINAL")
    return time.perf_counter() - t


def _hourly(ddl: str) -> str:
    key = "ORDER BY (app, level, corrected_event_time)"
    if key not in ddl:
        raise ValueError(f"sql/0013_logs.sql: no {key}")
    return ddl.replace(key, "ORDER BY (toStartOfHour(corrected_event_time), app, level, corrected_event_time)")


LOG_VARIANTS: dict[str, tuple[str, Callable[[str], str]]] = {
    # The hour first: a range without app or level reads whole hours' (app, level) runs, not every run's edges.
    "hourly": ("ORDER BY (toStartOfHour(corrected_event_time), app, level, corrected_event_time)", _hourly),
}
"""Variants of sql/0013_logs.sql timed by ``--log-variants``: (what changes, how the DDL changes)."""


def logs_variant_ddl(database: str, variant: str) -> str:
    """sql/0013_logs.sql's table in ``database``, changed as :data:`LOG_VARIANTS` says for ``variant``."""
    ddl = (REPO / "sql" / "0013_logs.sql").read_text()
    ddl = "\n".join(line.split("--", 1)[0].rstrip() for line in ddl.splitlines() if not line.startswith("--"))
    ddl = ddl.replace("CREATE TABLE IF NOT EXISTS logs", f"CREATE TABLE {database}.logs")
    return LOG_VARIANTS[variant][1](ddl).rstrip().rstrip(";")



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", "--log-lines", type=int, default=1_000_000, help="log lines to store and search")
    parser.add_argument("--repeat", type=int, default=20, help="runs of each search")
    parser.add_argument("--hours", "--log-hours", type=float, default=LogLoad.hours, help="span the lines cover")
    parser.add_argument("--live-minutes", "--log-live-minutes", type=float, default=LogLoad.live_minutes,
                        help="the newest minutes of lines written one 5 s micro-batch per insert (0: all in blocks)")
    parser.add_argument("--variants", "--log-variants", default="",
                        help=f"also time copies of the logs table changed so: {', '.join(LOG_VARIANTS)} (comma list)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary store (its path is printed)")
    args = parser.parse_args()
    with temporary_store(args.keep) as (config, _):
        run_logs(config, LogLoad(args.lines, args.hours, live_minutes=args.live_minutes), args.repeat,
                 [v for v in args.variants.split(",") if v])


if __name__ == "__main__":
    main()
