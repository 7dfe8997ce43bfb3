"""What the store's statement guard costs per statement, in isolation (issue 49: the guard's cost per query).

``store.server.guard.check`` on a chDB session in process, as the server's parser handles run it, over the statements
the project sends: every migration statement (as the writer), the dashboard's and the evaluator's typical reads and
clickhouse-connect's own (as the reader). No verdict is remembered here (the server remembers verdicts of short
statements, so a repeated statement costs a dictionary lookup): each round checks every statement again.
Prints JSON: per-statement microseconds (median and p90 over rounds) and the median over all statements.

    .venv/bin/python -m bench.probes.guard_cost --rounds 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import chdb

from store.migrations import _LEDGER, migration_files, statements
from store.server import guard

READS = [
    "SELECT 1",
    "SELECT version(), timezone()",
    "SELECT name, value, readonly FROM system.settings LIMIT 10000",
    "SELECT engine_full FROM system.tables WHERE database = {d:String} AND name = {t:String}",
    "DESCRIBE TABLE eventide.window_aggregates",
    "EXISTS TABLE eventide.dead_letters",
    "SELECT window_start, app, name, count, quantiles FROM window_results WHERE app = {a:String} AND name = "
    "{n:String} AND window_start >= {s:DateTime64(3)} AND window_start < {e:DateTime64(3)} ORDER BY window_start "
    "FORMAT Native",
    "SELECT app, level, count() FROM logs WHERE corrected_event_time >= now() - INTERVAL 1 HOUR GROUP BY app, level "
    "ORDER BY app, level FORMAT JSONEachRow",
    "SELECT query_name, watermark FROM query_watermarks FINAL",
    "INSERT INTO eventide.window_aggregates (window_kind, app, version) FORMAT Native\n",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    conn = chdb.connect(":memory:")

    def parse(sql: str) -> str:
        return conn.query(sql, "TabSeparatedRaw").bytes().decode("utf-8", "replace")

    cases = [("writer", s) for _, sql in migration_files() for s in statements(sql)] + [("writer", _LEDGER)]
    cases += [("writer" if s.startswith("INSERT") else "reader", s) for s in READS]
    for role, statement in cases:           # warm up (and prove every statement is allowed)
        guard.check(statement, role=role, parse=parse)   # type: ignore[arg-type]
    timings: list[list[float]] = [[] for _ in cases]
    for _ in range(args.rounds):
        for i, (role, statement) in enumerate(cases):
            started = time.perf_counter()
            guard.check(statement, role=role, parse=parse)   # type: ignore[arg-type]
            timings[i].append((time.perf_counter() - started) * 1e6)
    per = [statistics.median(t) for t in timings]
    out = {
        "statements": len(cases), "rounds": args.rounds,
        "median_us": round(statistics.median(per), 1),
        "mean_of_medians_us": round(statistics.fmean(per), 1),
        "p90_us": round(statistics.quantiles([x for t in timings for x in t], n=10)[-1], 1),
        "select_1_us": round(per[len(cases) - len(READS)], 1),
    }
    print(json.dumps(out))
    conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
