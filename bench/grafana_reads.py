"""What Grafana's ClickHouse data source waits for when it reads the local store (issue 53).

1. A large answer: 1M rows × 5 columns (integers, a string, a float, a time, a low-cardinality string) as the
   reader, in ``Native`` at the protocol revision clickhouse-go names (the store rewrites chDB's blocks for it:
   ``store.server.native``), against the same query in ``RowBinary`` and in plain ``Native``, interleaved; each
   request read to its last byte. Goal: Native at the client's revision ≥ 80 % of RowBinary's rows per second.
2. Each panel of deploy/grafana/dashboards/eventide.json over the last 24 h of the dashboard benches' deployment
   (50 series of 1-min windows, ``bench.dashboard_fill``), its macros expanded as the plugin does (2-min interval),
   sent as the plugin sends it (POST, Native, ``client_protocol_version``). Goal: p95 ≤ 0.15 s, the page budget.

    .venv/bin/python -m bench.grafana_reads [--rows 1000000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import statistics
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from bench.dashboard_fill import Load, populate
from bench.dashboard_store import REPO, percentile, temporary_store
from eventide.config import Config
from store import credentials
from tests.support.grafana import expand_macros

PROTOCOL_REVISION = 54460   # what clickhouse-go v2 sends
WIDE = ("SELECT number, toString(number) AS text, number / 3 AS ratio, toDateTime64('2026-01-01', 3, 'UTC') + number "
        "AS t, toLowCardinality(toString(number % 100)) AS label FROM numbers({rows})")
FORMATS = {"RowBinary": {"default_format": "RowBinary"}, "Native": {"default_format": "Native"},
           "Native at the client's revision": {"default_format": "Native",
                                               "client_protocol_version": str(PROTOCOL_REVISION)}}


def post(config: Config, sql: str, params: dict[str, str]) -> tuple[float, int]:
    """One request as the reader on a fresh connection: (seconds until its last byte, bytes)."""
    creds = credentials.load(config)
    auth = base64.b64encode(f"{creds.reader_user}:{creds.reader_password}".encode()).decode()
    conn = http.client.HTTPConnection(config.store.host, config.store.port, timeout=300)
    started = time.perf_counter()
    conn.request("POST", "/?" + urlencode({"database": config.store.database, **params}), body=sql.encode(),
                 headers={"Authorization": f"Basic {auth}"})
    response = conn.getresponse()
    body = response.read()
    seconds = time.perf_counter() - started
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {body[:300]!r}")
    return seconds, len(body)


def large_answer(config: Config, rows: int, repeat: int) -> None:
    sql = WIDE.format(rows=rows)
    times: dict[str, list[float]] = {name: [] for name in FORMATS}
    sizes: dict[str, int] = {}
    for params in FORMATS.values():     # once each first: the engine's caches
        post(config, sql, params)
    for _ in range(repeat):
        for name, params in FORMATS.items():
            seconds, size = post(config, sql, params)
            times[name].append(seconds)
            sizes[name] = size
    base = statistics.median(times["RowBinary"])
    print(f"{rows:,} rows x 5 columns as the reader, {repeat} requests each, interleaved")
    print(f"{'format':<34} {'median s':>9} {'min s':>7} {'M rows/s':>9} {'MiB':>7}  vs RowBinary")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<34} {median:>9.3f} {min(values):>7.3f} {rows / median / 1e6:>9.2f} "
              f"{sizes[name] / 2**20:>7.1f}  {base / median:>6.0%}")


def panels(config: Config, repeat: int) -> None:
    until = datetime.now(UTC).replace(second=0, microsecond=0)
    since = until - timedelta(hours=24)
    dashboard = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "eventide.json").read_text())
    print(f"\neach panel of the Grafana dashboard over 24 h (2-min interval), {repeat} requests, Native at revision "
          f"{PROTOCOL_REVISION}")
    print(f"{'panel':<48} {'p50 s':>7} {'p95 s':>7} {'max s':>7} {'KiB':>7}")
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            sql = expand_macros(target["rawSql"], since, until, 120).replace("eventide.", f"{config.store.database}.")
            runs = [post(config, sql, FORMATS["Native at the client's revision"]) for _ in range(repeat)]
            seconds = [s for s, _ in runs]
            print(f"{panel['title'][:48]:<48} {percentile(seconds, 0.5):>7.3f} {percentile(seconds, 0.95):>7.3f} "
                  f"{max(seconds):>7.3f} {runs[-1][1] / 1024:>7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with temporary_store() as (config, _):
        large_answer(config, args.rows, max(3, args.repeat // 4))
        t = time.perf_counter()
        populate(config, Load(), datetime.now(UTC).replace(second=0, microsecond=0))
        print(f"\nfilled 24 h x 50 series in {time.perf_counter() - t:.0f} s")
        panels(config, args.repeat)


if __name__ == "__main__":
    main()
