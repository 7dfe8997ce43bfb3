"""The fault suite, longer, with figures (issue 12): faults injected, events checked, events lost and counted twice.

Runs the scenarios of tests/support/fault_injection.py (the ones tests/integration/test_faults.py runs small)
on a broker, store and Spark session of its own:

- ``fuzz``: ``--fuzz`` fuzzed records among ``--fuzz-good`` good events;
- ``job_kills``: the stream job SIGKILLed ``--job-kills`` times while it drains ``--events`` workload events,
  compared table by table with an uninterrupted run;
- ``broker_kills``: the broker SIGKILLed ``--broker-kills`` times while the SDK (``--sdk-events``) and a gateway
  client (``--gateway-batches`` of 20) produce; every acknowledged event counted by id;
- ``store_outage``: the store stopped for ``--outage-s`` while the job writes, compared with an uninterrupted run.
- ``spool_full``: an SDK app with no broker records ``--spool-events`` events into a spool on a 256 KiB file system;
  every event spooled whole or counted as dropped, then the spool replayed to the broker, each spooled event once.
- ``webhook``: the alert delivery threads against a local webhook that answers 400 to one notification, hangs on
  another and resets the connection of a third; ``--webhook-later`` later notifications must arrive within the
  deadline (and the three be recorded as failed deliveries).

Prints one JSON summary (and writes it to ``--out``):

    .venv/bin/python -m bench.faults --out /tmp/faults.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.harness import REPO, emit, report
from eventide.config import load_config
from stack import broker
from stack.services import free_port
from store.server import child as served_store
from tests.support import fault_injection as faults
from tests.support.stack import fresh_stack

SCENARIOS = ("fuzz", "job_kills", "broker_kills", "store_outage")
SCENARIOS += ("spool_full",)
SCENARIOS += ("webhook",)


def comparison_figures(c: faults.Comparison, seconds: float) -> dict[str, Any]:
    expected, seen = c.window_events
    return {"faults": c.faults, "records_sent": c.events_sent, "events_counted_expected": expected,
            "events_counted": seen, "lost": max(0, expected - seen), "double_counted": max(0, seen - expected),
            "rows_compared": sum(c.rows.values()), "rows_differing": sum(c.differing.values()),
            "identical": c.identical, "seconds": round(seconds, 1),
            **{k: v for k, v in c.extra.items() if k != "waits"},
            **({"store_wait_log_lines": len(c.extra["waits"])} if "waits" in c.extra else {})}


def spool_full_figures(config: Any, parent: Path, events: int) -> dict[str, Any]:
    """The SDK's spool on a full file system (tests/support/fault_injection.py ``spool_on_a_full_disk``), as figures."""
    from tests.support.sdk import fresh_topic

    t = time.perf_counter()
    outcome = faults.spool_on_a_full_disk(fresh_topic(config, "spool-full", parent), parent, events=events)
    s, delivered = outcome.stats, outcome.delivered_values
    uncounted = s["enqueued"] - s["spooled"] - s["dropped"]
    return report("spool_full", {
        "faults": 1, "how": outcome.how, "events_recorded": s["enqueued"], "spooled": s["spooled"],
        "dropped_spool_full": s["dropped_spool_full"], "dropped_spool_error": s["dropped_spool_error"],
        "uncounted": uncounted, "torn_segments": outcome.torn_segments, "unparsable_lines": outcome.unparsable_lines,
        "replayed": outcome.replay_stats["replayed"], "delivered": len(delivered),
        "lost": abs(uncounted) + len(set(outcome.spooled_values) - set(delivered)),
        "double_counted": len(delivered) - len(set(delivered)), "seconds": round(time.perf_counter() - t, 1)})


def webhook_figures(config: Any, later: int) -> dict[str, Any]:
    """Alert webhooks that refuse, hang or reset one notification each (tests/support/fault_injection.py
    ``webhook_faults``), as figures: how late the later notifications arrived against the deadline."""
    t = time.perf_counter()
    outcome = faults.webhook_faults(config, later=later)
    late = [s for s, after in outcome.delivered_after_s.items() if after > outcome.deadline_s + 0.5]
    arrivals = sorted(outcome.delivered_after_s.values())
    return report("webhook", {
        "faults": len(outcome.bad), "later_notifications": later, "delivered": len(arrivals),
        "deadline_s": outcome.deadline_s, "latest_arrival_s": round(arrivals[-1], 3) if arrivals else None,
        "late": len(late), "failures_recorded": {s: f[0] for s, f in outcome.failures.items()},
        "lost": later - len(arrivals) + len(set(outcome.bad) - set(outcome.failures)),
        "double_counted": sum(n - 1 for s, n in outcome.requests.items() if s not in outcome.bad),
        "seconds": round(time.perf_counter() - t, 1)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated subset of {SCENARIOS}")
    parser.add_argument("--fuzz", type=int, default=100_000)
    parser.add_argument("--fuzz-good", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=3_000, help="workload events of the job-kill and outage runs")
    parser.add_argument("--job-kills", type=int, default=5)
    parser.add_argument("--broker-kills", type=int, default=3)
    parser.add_argument("--sdk-events", type=int, default=20_000)
    parser.add_argument("--gateway-batches", type=int, default=500)
    parser.add_argument("--outage-s", type=float, default=60)
    parser.add_argument("--spool-events", type=int, default=20_000, help="events of the full-disk spool scenario")
    parser.add_argument("--webhook-later", type=int, default=50, help="later notifications of the webhook run")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    chosen = set(args.scenarios.split(","))

    data = Path(tempfile.mkdtemp(prefix="eventide-faults-"))
    config = load_config(environ={}, root=str(REPO),
                         paths={"data_dir": str(data), "cache_dir": str(REPO / ".cache")},
                         kafka={"port": free_port(), "controller_port": free_port()},
                         store={"port": free_port()},
                         stream={"master": "local[2]", "trigger_interval_s": 1, "shuffle_partitions": 2},
                         sdk={"health_interval_s": 0})   # the SDK's own health metrics would be counted too
    summary: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(), "args": vars(args)}
    broker.start(config)
    try:
        with served_store(config):
            from analytics.job import spark_session

            spark = spark_session(config, app_name="eventide-faults")
            if "fuzz" in chosen:
                t = time.perf_counter()
                outcome = faults.fuzz(fresh_stack(config, "fuzz"), spark, bad=args.fuzz, good=args.fuzz_good)
                summary["fuzz"] = report("fuzz", {
                    **asdict(outcome), "faults": outcome.bad_sent,
                    "lost": max(0, outcome.good_sent - outcome.counted),
                    "double_counted": max(0, outcome.counted - outcome.good_sent),
                    "bad_not_dead_lettered": outcome.bad_sent - outcome.dead_letters,
                    "seconds": round(time.perf_counter() - t, 1)})
            if "job_kills" in chosen:
                t = time.perf_counter()
                outcome_c = faults.kill_the_job(config, spark, kills=args.job_kills, events=args.events)
                summary["job_kills"] = report("job_kills", comparison_figures(outcome_c, time.perf_counter() - t))
            if "broker_kills" in chosen:
                t = time.perf_counter()
                with faults.killable_broker(config, data / "killable") as own:
                    produced = faults.kill_the_broker(fresh_stack(own, "broker_kills", partitions=2), spark,
                                                      sdk_events=args.sdk_events,
                                                      gateway_batches=args.gateway_batches,
                                                      kills=args.broker_kills)
                ids = produced.accepted_ids
                summary["broker_kills"] = report("broker_kills", {
                    "faults": produced.broker_kills, "sdk_events": produced.sdk_events,
                    "sdk_spooled": produced.sdk_spooled, "sdk_dropped": produced.sdk_dropped,
                    "gateway_events_acknowledged": len(produced.gateway_acknowledged),
                    "gateway_answers": produced.gateway_answers, "records_on_topic": produced.records_on_topic,
                    "events_checked": produced.sdk_events + len(produced.gateway_acknowledged),
                    "accepted_ids": len(ids), "distinct_accepted_ids": len(set(ids)),
                    "stored_duplicates": produced.stored_duplicates, "stored": produced.stored,
                    "lost": produced.lost, "double_counted": produced.double_counted,
                    "seconds": round(time.perf_counter() - t, 1)})
            if "store_outage" in chosen:
                t = time.perf_counter()
                store_dir = data / "outage-store"
                own_store = load_config(environ={}, root=str(REPO), paths={"data_dir": str(store_dir)},
                                        store={"port": free_port()})
                with served_store(own_store, log=store_dir / "store.log") as process:
                    outcome_c = faults.store_away(config, spark, own_store, process, outage_s=args.outage_s,
                                                  log_dir=store_dir, events=args.events)
                summary["store_outage"] = report("store_outage",
                                                 comparison_figures(outcome_c, time.perf_counter() - t))
            if "spool_full" in chosen:
                summary["spool_full"] = spool_full_figures(config, data / "spool-full", args.spool_events)
            if "webhook" in chosen:
                summary["webhook"] = webhook_figures(fresh_stack(config, "webhook"), args.webhook_later)
            spark.stop()
    finally:
        broker.stop(config)
        shutil.rmtree(data, ignore_errors=True)
    parts = [summary[s] for s in SCENARIOS if s in summary]
    summary["total"] = {"faults": sum(p["faults"] for p in parts), "lost": sum(p["lost"] for p in parts),
                        "double_counted": sum(p["double_counted"] for p in parts)}
    emit(summary, args.out)


if __name__ == "__main__":
    main()
