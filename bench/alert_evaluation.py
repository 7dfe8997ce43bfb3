"""What one alert evaluation pass costs: R rules over a deployment of A apps x 10 series (8 metrics, 2 loggers) of
1-min tumbling windows with real sketches (``bench.dashboard_fill``), in a store served as in production.

Each rule selects one series name across every app (``app = "*"``), so a rule matches A series; statistics cycle
through quantiles, counts, rates, means, extremes, distinct users and (on log series) the error ratio. Two passes
are timed: the first of new rules (each looks back ``for`` + 2 windows) and a steady one, one minute later, with one
new finished window per (rule, series), and after each a pass 15 s later with no new window (with 1-min windows and
the default ``alerting.evaluation_interval_s`` of 15 s, three passes in four). CPU is the machine's (/proc/stat: the
evaluator and the store server; run it on an idle machine).

    .venv/bin/python -m bench.alert_evaluation --apps 100 --rules 200
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta

from alerting.evaluator import evaluate
from alerting.rules import parse_rules
from bench.dashboard_fill import METRICS, Load, populate
from bench.dashboard_store import LOGS, temporary_store
from bench.harness import cpu_seconds
from eventide.config import Config
from store.client import connect

METRIC_STATISTICS = ("p99", "count", "mean", "max", "distinct_users", "rate", "p50", "min", "sum")


def rules_text(count: int) -> str:
    """``count`` rules, each on one series name of every app."""
    names = [("metric", m) for m in METRICS] + [("log", n) for n in LOGS]
    rules = []
    for i in range(count):
        kind, name = names[i % len(names)]
        statistic = "error_ratio" if kind == "log" and i % 2 else METRIC_STATISTICS[i % len(METRIC_STATISTICS)]
        rules.append(f'[[rule]]\nname = "rule {i}"\nseries = {{ app = "*", kind = "{kind}", name = "{name}" }}\n'
                     f'window_s = 60\nstatistic = "{statistic}"\ncomparator = ">"\nthreshold = {50 + i}\n'
                     f"for = {1 + i % 3}\n")
    return "\n".join(rules)


def set_watermark(config: Config, mark: datetime) -> None:
    with connect(config) as client:
        client.insert("pipeline_progress", [["windows", "q", "r", int(mark.timestamp()), mark, mark, mark]],
                      column_names=["query_name", "query_id", "run_id", "batch_id", "batch_timestamp",
                                    "watermark", "recorded_at"])


def timed_pass(config: Config, rules_toml: str, mark: datetime) -> dict[str, float]:
    set_watermark(config, mark)
    rules = parse_rules(rules_toml)
    cpu, wall = cpu_seconds(), time.perf_counter()
    transitions = evaluate(config, rules, now=int((mark + timedelta(seconds=5)).timestamp() * 1000))
    return {"wall_s": round(time.perf_counter() - wall, 3), "machine_cpu_s": round(cpu_seconds() - cpu, 3),
            "transitions": len(transitions)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--apps", type=int, default=100, help="apps; each has 10 series")
    parser.add_argument("--rules", type=int, default=200)
    parser.add_argument("--hours", type=int, default=2, help="history stored")
    parser.add_argument("--steady", type=int, default=3, help="steady passes timed (one new window each)")
    args = parser.parse_args()
    load = Load(apps=args.apps, hours=args.hours, hopping=None, tumbling_s=(60,), users_per_app=200)
    until = datetime.now(UTC).replace(second=0, microsecond=0)
    with temporary_store() as (config, _data):
        t = time.perf_counter()
        populate(config, load, until)
        with connect(config) as client:    # the fill's progress rows put the watermark at its end: the passes set it
            client.command("ALTER TABLE query_watermarks_kept DELETE WHERE query_name = 'windows'",
                           settings={"mutations_sync": 1})
        print(f"{len(load.series)} series x {args.hours} h of 1-min windows, "
              f"filled in {time.perf_counter() - t:.0f} s; "
              f"{args.rules} rules, each matching {args.apps} series")
        text = rules_text(args.rules)
        first = until - timedelta(minutes=args.steady)
        print("first pass (new rules):", timed_pass(config, text, first))
        for k in range(1, args.steady + 1):
            print(f"steady pass {k} (one new window per rule and series):",
                  timed_pass(config, text, first + timedelta(minutes=k)))
            # 15 s later the watermark has not reached the next window's end: what 3 of 4 passes cost.
            print("  pass 15 s later (no new window):",
                  timed_pass(config, text, first + timedelta(minutes=k, seconds=15)))


if __name__ == "__main__":
    main()
