"""Pipeline throughput, side by side with its read limit and a peer, in one run on one broker (issue 10).

Starts its own broker (free ports, temporary data dir), produces one realistic backlog (90 % metrics over 50
series, 10 % logs, 5,000 users, a few % late, some malformed, 1 % sent twice) and then, on that same topic:

- ``limit``: Spark's Kafka source reading the topic and only counting;
- ``full``: the whole job (every query: validation, dedup, dead letters + clock offsets, windows + stragglers,
  sliding + sessions)
  with the default window config, drained from the first offset with a fresh checkpoint and store;
- ``warm``: the full job drained once more in the same JVM, after a drain of the same size (``full``'s, or one of
  its own): HotSpot has compiled the job's code by then, as in a job that has run a while. A first drain pays part
  of that warm-up: every drain reports ``jit_cpu_s``, the CPU of the JVM's JIT compiler threads while it ran;
- ``live``: the same job as it runs live: every query at once with its processing-time trigger (the readers take
  each accept batch while ``accept`` reads the next), until both readers have committed the last batch; a drain
  with ``availableNow`` (``full``) runs ``accept`` to the end first and leaves cores idle meanwhile;
- ``nodedup``: the whole job with deduplication turned off (``stream.deduplicate = false``): its cost;
- ``queries``: each query of the job alone, same way (the stateful ones after ``accept`` filled their input);
- ``peer``: Quix Streams computing 1-s tumbling count + mean per series (``bench.quix_peer``, own process), and
  ``ours_peer``: our job configured for that same single tumbling window (the windows query alone);
- ``freshness`` (``--freshness-s``): a live load at ``--rate`` events/s while the job runs with its processing-time
  triggers; per event and per query, (end of the micro-batch that took it − its Kafka receive time), p50 / p95 / max
  and p95 by minute: ``log_line`` (accept: its log line searchable, at the latest), ``log_line_stored`` (when
  the task's insert of its log line returned, before the batch ends: searchable from then), ``window_row``
  (windows: its tumbling and hopping rows),
  ``window_row_provisional`` (its window rows moved: when the provisional rows of its accept batch were written, if
  that batch's events got one in every window they touched, else ``window_row``), ``sliding_or_session_processed``
  (keyed_windows), ``session_provisional`` (its open session moved: when the provisional sessions of its accept
  batch were written, if none of that batch's session keys was left to keyed_windows, else
  ``sliding_or_session_processed``); and the machine's CPU per event and per accept batch, also without the load
  generator's own CPU (``machine_cpu_us_per_event_without_load``: a drain's backlog was produced before), and the
  job's alone (``job_cpu_us_per_event``: without the load generator's CPU nor the bench's own reading of the JVM's
  threads, ~1.5 µs per event at 10,000 events/s; what compares with a drain's ``job_cpu_us_per_event``), all by
  minute with the JIT's share (``cpu_by_minute``: a young JVM's compiling fades over minutes).

Every drain also reports ``driver``: CPU per event of the driver (its Python process, this one, and the JVM's
driver-side threads) apart from the executor's (task threads, Python workers), the JIT's and the collector's, which
local mode runs in the same JVM; the ceiling the driver sets (``1 / driver CPU per event``); the peak RSS of the
driver's Python process and of the JVM during the drain (issue 40). ``batches`` drains the backlog again (warm) in
1, 2, 4 and 16 ``accept`` batches and splits the driver's CPU into what a drain pays once (the queries' starts) and what
it pays per batch; a running job pays only the second, so its driver CPU per event is that ÷ the batch size.
``--masters local[1],local[2]`` runs the phases once per master, each in a new Spark session (the JVM is the same:
its JIT is warm for the later ones), under ``by_master``, and each master's throughput over the first's under
``amdahl`` (2.0: all of it spreads over task slots).

Prints one JSON summary (and writes it to ``--out``). Each drain is timed from its first batch to its last
(Spark's JVM and the connector are warmed up on a separate topic first); CPU is the machine's busy time (run it
on an otherwise idle machine). The stack, the load and the drains are ``bench.harness``'s.

    .venv/bin/python -m bench.pipeline --events 500000
    .venv/bin/python -m bench.pipeline --events 200000 --phases limit,full --freshness-s 600 --rate 20000
    .venv/bin/python -m bench.pipeline --events 500000 --phases full,warm --masters 'local[1],local[2]'
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from analytics.accept import writer as accept_writer
from analytics.job import QUERIES
from analytics.keyed import provisional as provisional_sessions
from analytics.vocabulary import ACCEPT_QUERY
from analytics.windows import provisional
from bench.harness import (
    REPO,
    CpuByMinute,
    Load,
    Spent,
    bench_config,
    drain,
    drain_alone,
    drain_live,
    driver_per_batch,
    emit,
    fresh,
    live_load,
    produce_backlog,
    report,
    services,
    session,
    spark_count_only,
    stack,
    stage_breakdown,
    stored_summary,
    topic_end_offsets,
)
from eventide.config import Config
from eventide.envelope import now_ms
from stack import broker

PHASES = ("limit", "full", "warm", "live", "batches", "nodedup", "queries", "peer")
PROGRESS_KEPT = 100_000   # progress reports kept per query during the freshness phase (Spark's default: 100)


# The peer ------------------------------------------------------------------------------------------------------
def quix_peer(config: Config, events: int) -> dict[str, Any]:
    """Quix Streams in its own process (``bench.quix_peer``) over the same topic."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.quix_peer", "--bootstrap", config.kafka.bootstrap,
         "--topic", config.kafka.events_topic, "--events", str(events),
         "--state-dir", str(config.data_dir / "quix-state"),
         "--grace-ms", str(round(config.stream.allowed_lateness_s * 1000))],
        capture_output=True, text=True, timeout=3600, check=False, cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"quix peer failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# Freshness -----------------------------------------------------------------------------------------------------
def receive_times(config: Config) -> dict[int, Any]:
    """Per partition: Kafka timestamps (LogAppendTime = receive time, ms) indexed by offset."""
    import numpy as np

    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap, "group.id": f"fresh-{time.time()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    meta = consumer.list_topics(config.kafka.events_topic, timeout=10).topics[config.kafka.events_topic]
    out = {}
    for p in meta.partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(config.kafka.events_topic, p), timeout=10)
        stamps = np.zeros(high, dtype=np.int64)
        consumer.assign([TopicPartition(config.kafka.events_topic, p, low)])
        seen = low
        while seen < high:
            for m in consumer.consume(10_000, 1.0):
                if not m.error():
                    stamps[m.offset()] = m.timestamp()[1]
                    seen = m.offset() + 1
        out[p] = stamps
    consumer.close()
    return out


def _kafka_offsets(config: Config, query: str, value: Any) -> dict[str, Any]:
    """The events-topic offsets a progress report's source offset stands for: ``accept`` reports Kafka offsets
    themselves; a reader reports a position in the accepted-events log (None before its first batch), which stands
    for the Kafka offsets of the newest accept batch it has read."""
    from analytics import accepted_log

    if not value:
        return {}
    parsed = json.loads(value) if isinstance(value, str) else value
    if query == ACCEPT_QUERY:
        return parsed
    return accepted_log.kafka_offsets_reached(config, config.checkpoint_dir / query,
                                              int(parsed.get("logOffset", -1)))


FRESHNESS_OF = {ACCEPT_QUERY: "log_line", "windows": "window_row", "keyed_windows": "sliding_or_session_processed"}
"""What the end of each query's micro-batch makes visible in the store: ``accept`` writes every accepted log line
(``logs``) from its tasks; ``windows`` writes the tumbling and hopping rows (early results, then corrections) an
event counts in; ``keyed_windows`` has taken the event into its sliding windows and sessions by then and written
every row the event completed (a sliding or session row itself appears only once final: its window or gap over)."""


def _visible_at(config: Config, query: str, batches: list[tuple[int, str, int, dict[str, Any]]],
                stamps: dict[int, Any], at_ms: dict[int, int] | None = None,
                partition_at_ms: dict[tuple[int, int], int] | None = None) -> dict[int, Any]:
    """Per partition and offset: the end (epoch ms) of ``query``'s micro-batch that took the record, or ``at_ms`` of
    that batch, or ``partition_at_ms`` of that batch and partition, when given (those missing there count for none);
    inf where none did."""
    import numpy as np

    visible = {p: np.full(len(received), np.inf) for p, received in stamps.items()}
    for batch_id, ts, duration, source in batches:
        if at_ms is not None and batch_id not in at_ms:
            continue
        end_ms = (at_ms[batch_id] if at_ms is not None
                  else int(np.datetime64(ts.rstrip("Z"), "ms").astype(np.int64)) + duration)
        start = _kafka_offsets(config, query, source["startOffset"])
        end = _kafka_offsets(config, query, source["endOffset"])
        for partition, offsets in end.get(config.kafka.events_topic, {}).items():
            if partition_at_ms is not None:
                if (batch_id, int(partition)) not in partition_at_ms:
                    continue
                end_ms = partition_at_ms[(batch_id, int(partition))]
            lo = start.get(config.kafka.events_topic, {}).get(partition, 0)
            span = visible[int(partition)][lo:offsets]
            visible[int(partition)][lo:offsets] = np.minimum(span, end_ms)
    return visible


def _latencies(visible: dict[int, Any], stamps: dict[int, Any], t0: float) -> dict[str, Any]:
    """Per event made visible (``_visible_at``) minus its Kafka receive time (s): p50 / p95 / max, and p95 by minute
    of the run (a lag that grows shows there)."""
    import numpy as np

    seen = {p: np.isfinite(v) for p, v in visible.items()}
    if not any(s.any() for s in seen.values()):
        return {"events": 0}
    lat = np.concatenate([visible[p][s] - stamps[p][s] for p, s in seen.items()]) / 1000.0
    minute = np.concatenate([(visible[p][s] // 1000 - t0) // 60 for p, s in seen.items()])
    per_minute = {int(m): round(float(np.percentile(lat[minute == m], 95)), 2) for m in np.unique(minute)}
    return {"events": len(lat), "p50_s": round(float(np.percentile(lat, 50)), 2),
            "p95_s": round(float(np.percentile(lat, 95)), 2), "max_s": round(float(lat.max()), 2),
            "p95_by_minute_s": per_minute}


def freshness(spark: Any, config: Config, rate: int, seconds: float) -> dict[str, Any]:
    """The job (every query, processing-time trigger) under a live load at ``rate`` events/s for ``seconds``: per
    event and per query, the end of the micro-batch that took it minus its Kafka receive time (``FRESHNESS_OF`` says
    what that batch made visible), and the machine's CPU per event and per ``accept`` batch."""
    import numpy as np

    from analytics import sinks
    from analytics.job import start_queries

    sinks.sink_seconds.clear()
    provisional.outcomes.clear()
    provisional_sessions.outcomes.clear()
    accept_writer.lines_stored.clear()
    # Every progress report of the run is read back from the queries: Spark keeps the last 100 by default, fewer
    # than the readers' batches in a few minutes (they poll every stream.accepted_poll_interval_s).
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(PROGRESS_KEPT))
    queries = start_queries(spark, config)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    loader = subprocess.Popen([sys.executable, "-m", "bench.pipeline", "--live-load", config.kafka.bootstrap,
                               config.kafka.events_topic, str(rate), str(seconds)], cwd=REPO)
    spent, t0 = Spent(spark), time.time()
    by_minute = CpuByMinute(spent, loader.pid, lambda: sum(topic_end_offsets(config).values()))
    deadline = time.monotonic() + seconds + 300
    # until it has ended, not reaped: its CPU is still readable for the last stretch
    while os.waitid(os.P_PID, loader.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        if time.monotonic() > deadline:
            loader.kill()
            raise TimeoutError(f"the load generator ran past {seconds + 300:.0f} s")
        time.sleep(0.2)
    cpu_by_minute = by_minute.stop()
    loader.wait()
    # The load generator is the apps, not the backend: its CPU (the only child this process reaps meanwhile) is
    # reported apart, so the job's CPU per event compares with a drain's, whose backlog was produced beforehand.
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_cpu = after.ru_utime + after.ru_stime - reaped.ru_utime - reaped.ru_stime
    time.sleep(3 * config.stream.trigger_interval_s)      # let the last batches land
    produced = sum(topic_end_offsets(config).values())
    parts = spent.per(max(produced, 1))
    cpu, wall = parts["cpu_s"], parts["seconds"]
    # end of batch = trigger start + its duration: what the batch writes is in the store by then
    batches = {q.name: [(p["batchId"], p["timestamp"], p["durationMs"]["triggerExecution"],
                         json.loads(p.json)["sources"][0]) for p in q.recentProgress if p["numInputRows"]]
               for q in queries}
    stages = stage_breakdown(queries)
    for q in queries:
        q.stop()
    stamps = receive_times(config)
    visible = {q: _visible_at(config, q, batches.get(q, []), stamps) for q in QUERIES}
    by_query = {q: _latencies(visible[q], stamps, t0) for q in QUERIES}
    # A window row moves before the windows query takes its events once the provisional rows of the accept batch
    # that took them are written, if every window they touched got one (analytics.windows.provisional); an open
    # session likewise, if no session key of the batch was left to keyed_windows (analytics.keyed.provisional).
    def moved(query: str, outcomes: dict[int, tuple[int, int]]) -> tuple[dict[str, Any], int]:
        complete = {batch: written_ms for batch, (left, written_ms) in outcomes.items() if not left}
        at = _visible_at(config, ACCEPT_QUERY, batches.get(ACCEPT_QUERY, []), stamps, at_ms=complete)
        return _latencies({p: np.minimum(visible[query][p], at[p]) for p in stamps}, stamps, t0), len(complete)

    provisional_row, windows_complete = moved("windows", provisional.outcomes)
    session_moved, sessions_complete = moved("keyed_windows", provisional_sessions.outcomes)
    # A log line is searchable once its task's insert returned, before the batch ends (analytics.accept.writer).
    stored = _visible_at(config, ACCEPT_QUERY, batches.get(ACCEPT_QUERY, []), stamps,
                         partition_at_ms=dict(accept_writer.lines_stored))
    log_line_stored = _latencies({p: np.minimum(visible[ACCEPT_QUERY][p], stored[p]) for p in stamps}, stamps, t0)
    accept_batches = len(batches.get(ACCEPT_QUERY, []))
    # Events still unprocessed when the load stopped + 3 triggers never became queryable: a job that cannot keep
    # up shows here (and in a growing p95 per minute), not in the percentiles of the events it did process.
    return {"rate": rate, "seconds": seconds, "events_produced": produced,
            "trigger_interval_s": config.stream.trigger_interval_s,
            "accept_interval_s": config.stream.accept_interval,
            "accepted_poll_interval_s": config.stream.accepted_poll_interval_s,
            **{FRESHNESS_OF[q]: {**figures, "unprocessed_at_stop": produced - figures["events"]}
               for q, figures in by_query.items()},
            "log_line_stored": {**log_line_stored, "unprocessed_at_stop": produced - log_line_stored["events"]},
            "window_row_provisional": {**provisional_row,
                                       "unprocessed_at_stop": produced - provisional_row["events"],
                                       "accept_batches_complete": windows_complete},
            "session_provisional": {**session_moved, "unprocessed_at_stop": produced - session_moved["events"],
                                    "accept_batches_complete": sessions_complete},
            "cpu_share_of_machine": round(cpu / wall / (os.cpu_count() or 1), 2),
            "machine_cpu_us_per_event": round(cpu * 1e6 / max(produced, 1), 1),
            "load_generator_cpu_s": round(load_cpu, 1),
            "machine_cpu_us_per_event_without_load": round((cpu - load_cpu) * 1e6 / max(produced, 1), 1),
            # nor the bench's own reading of the JVM's threads: what compares with a drain's job_cpu_us_per_event
            "job_cpu_us_per_event": round((cpu - load_cpu - parts["driver"]["measuring_cpu_s"]) * 1e6
                                          / max(produced, 1), 1),
            "cpu_by_minute": cpu_by_minute,
            "accept_batches": accept_batches,
            "machine_cpu_s_per_accept_batch": round(cpu / max(accept_batches, 1), 3),
            "driver": parts["driver"], "jit_cpu_s": parts["jit_cpu_s"], "stages": stages}


def load(config: Config, events: int, summary: dict[str, Any]) -> int:
    """The backlog every phase drains, produced once onto the events topic; its counts in ``summary["load"]``.
    Returns the records produced (events and their copies)."""
    broker.ensure_topics(config)
    t = time.perf_counter()
    summary["load"] = produce_backlog(config, Load(events=events), now_ms() - 2 * 3_600_000)
    produced = sum(summary["load"].values())
    summary["load"]["produce_events_per_s"] = round(events / (time.perf_counter() - t))
    report("load", summary["load"])
    return produced


def run_phases(spark: Any, config: Config, phases: set[str], events: int, total_records: int,
               label: str = "") -> dict[str, Any]:
    """Each phase of ``phases`` in this session over the backlog (``events`` events, ``total_records`` records with
    the copies), and the shares derived from them; ``label`` prefixes the progress lines."""
    summary: dict[str, Any] = {}
    tag = f"{label} " if label else ""
    if "limit" in phases:
        summary["limit"] = report(f"{tag}limit", spark_count_only(spark, fresh(config, "limit"), events))
    if "full" in phases:
        cfg = fresh(config, "full")
        summary["full"] = drain(spark, cfg, QUERIES, events)
        summary["full"]["stored"] = stored_summary(cfg)
        report(f"{tag}full", summary["full"])
    if "warm" in phases:    # the same again, once HotSpot has compiled the job's code
        if "full" not in summary:
            drain(spark, fresh(config, "warming"), QUERIES, events)
        cfg = fresh(config, "warm")
        summary["full_warm"] = drain(spark, cfg, QUERIES, events)
        summary["full_warm"]["stored"] = stored_summary(cfg)
        report(f"{tag}full_warm", summary["full_warm"])
    if "batches" in phases:   # the driver's CPU per drain and per batch: the backlog cut into 1, 2, 4, 16 batches
        summary["by_batches"] = by_batches(spark, config, phases, events, total_records, tag)
    if "live" in phases:    # the same, as the live job runs: all three queries at once
        cfg = fresh(config, "live_drain")
        summary["full_live"] = drain_live(spark, cfg, events)
        summary["full_live"]["stored"] = stored_summary(cfg)
        report(f"{tag}full_live", summary["full_live"])
    if "nodedup" in phases:   # the cost of deduplication: the full job with it turned off
        cfg = fresh(config, "nodedup", deduplicate=False)
        summary["full_without_dedup"] = report(f"{tag}full_without_dedup", drain(spark, cfg, QUERIES, events))
    if "queries" in phases:
        summary["per_query"] = {q: report(f"{tag}{q}", drain_alone(spark, fresh(config, q), q, events))
                                for q in QUERIES}
    if "peer" in phases:
        summary["peer_quix"] = report(f"{tag}peer_quix", quix_peer(config, total_records))
        # The peer parses and aggregates: ours validates and deduplicates (accept), then aggregates.
        cfg = fresh(config, "ours_peer", tumbling_windows_s=[1], hopping_windows=[])
        summary["ours_peer"] = report(f"{tag}ours_peer", drain(spark, cfg, (ACCEPT_QUERY, "windows"), events))
    for drained, share in (("full", "full_share_of_limit"), ("full_warm", "full_warm_share_of_limit"),
                           ("full_live", "full_live_share_of_limit")):
        if "limit" in summary and drained in summary:
            summary[share] = round(summary[drained]["events_per_s"] / summary["limit"]["events_per_s"], 3)
    if "peer_quix" in summary and "ours_peer" in summary:
        summary["ours_over_quix"] = round(summary["ours_peer"]["events_per_s"]
                                          / summary["peer_quix"]["events_per_s"], 2)
    return summary


def by_batches(spark: Any, config: Config, phases: set[str], events: int, total_records: int, tag: str,
               counts: tuple[int, ...] = (1, 2, 4, 16)) -> dict[str, Any]:
    """Warm drains of the backlog in each of ``counts`` ``accept`` batches (``stream.max_offsets_per_trigger`` cut to
    fit), and the driver's CPU as ``start + batches × per batch`` (``harness.driver_per_batch``); from it, the
    driver's CPU per event of a running job (the starts paid long ago) and the ceiling it sets, by batch size.

    The drain in many small batches sets the slope, so the per-batch figure is less at the mercy of one drain's noise;
    the fit's residuals show whether a batch of 60k records costs the driver what one of 1M does."""
    if not {"full", "warm"} & phases:   # HotSpot compiles the job's code in a first drain
        drain(spark, fresh(config, "warming"), QUERIES, events)
    drains = {}
    for count in counts:
        cap = -(-total_records // count)
        drained = drain(spark, fresh(config, f"batches_{count}", max_offsets_per_trigger=cap), QUERIES, events)
        drains[count] = {"max_offsets_per_trigger": cap, "batches": drained["stages"][ACCEPT_QUERY]["batches"],
                         "events_per_s": drained["events_per_s"], "driver": drained["driver"]}
        report(f"{tag}batches_{count}", drains[count])
    fit = driver_per_batch(list(drains.values()))
    running = {}
    if fit.get("driver_s_per_batch", 0) > 0:
        for size in (250_000, 500_000, 1_000_000, 3_000_000):
            running[size] = {"driver_us_per_event": round(fit["driver_s_per_batch"] * 1e6 / size, 2),
                             "driver_ceiling_events_per_s": round(size / fit["driver_s_per_batch"])}
    return {"drains": drains, **fit, "running_job_by_batch_size": running}


def amdahl(by_master: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each master's throughput over the first's, per drain (e.g. ``local[2]/local[1]``): from the mean of its runs,
    and round by round (a master named again, ``local[1] #2``, is a repetition). 2.0 would be a job that spreads
    entirely over twice the task slots; what stays at 1 is the serial part. The sessions share one JVM, so the
    first master's first run is in the youngest JIT: alternated rounds show that and even out a moving load."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for name, result in by_master.items():
        runs.setdefault(name.split(" #")[0], []).append(result)
    drains = ("limit", "full", "full_warm", "full_live")

    def ratios(base: list[dict[str, Any]], other: list[dict[str, Any]]) -> dict[str, float]:
        out = {}
        for drained in drains:
            a = [run[drained]["events_per_s"] for run in base if drained in run]
            b = [run[drained]["events_per_s"] for run in other if drained in run]
            if a and b:
                out[drained] = round(sum(b) / len(b) / (sum(a) / len(a)), 3)
        return out

    first, *others = runs
    return {f"{other}/{first}": {**ratios(runs[first], runs[other]),
                                 "by_round": [ratios([a], [b])   # unequal counts: the rounds both ran
                                              for a, b in zip(runs[first], runs[other], strict=False)],
                                 "runs": {first: len(runs[first]), other: len(runs[other])}}
            for other in others}


# Main ----------------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {PHASES}")
    parser.add_argument("--freshness-s", type=float, default=0, help="live-load duration (0: skip)")
    parser.add_argument("--rate", type=int, default=20_000, help="live-load events/s")
    parser.add_argument("--stream", action="append", default=[], metavar="FIELD=JSON",
                        help="override a [stream] setting for every phase, e.g. --stream driver_memory='\"4g\"'")
    parser.add_argument("--masters", default="",
                        help="comma-separated Spark masters, e.g. 'local[1],local[2]': the phases run once per master "
                             "(a master named again runs again), each in a session of its own; results under "
                             "by_master, throughput ratios under amdahl")
    parser.add_argument("--out", type=Path, help="also write the JSON summary here")
    parser.add_argument("--keep-data", action="store_true",
                        help="keep the run's data directory (checkpoints, accepted-events files, store)")
    parser.add_argument("--live-load", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.live_load:
        bootstrap, topic, rate, seconds = args.live_load
        live_load(bootstrap, topic, int(rate), float(seconds))
        return
    phases = set(args.phases.split(","))
    config = bench_config(stream=dict((k, json.loads(v)) for k, v in (o.split("=", 1) for o in args.stream)))
    summary: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "events": args.events, "cores": os.cpu_count(),
                               "stream_overrides": args.stream}
    masters = [m.strip() for m in re.split(r",(?![^\[]*\])", args.masters) if m.strip()]   # local[2,3] is one
    if masters and args.freshness_s:
        parser.error("--masters and --freshness-s: one at a time")
    if not masters:
        with stack(config, keep_data=args.keep_data) as spark:
            produced = load(config, args.events, summary)
            summary.update(run_phases(spark, config, phases, args.events, produced))
            if args.freshness_s:
                live = config.model_copy(update={"kafka": config.kafka.model_copy(update={"events_topic": "live"})})
                broker.ensure_topics(live)
                summary["freshness"] = freshness(spark, fresh(live, "live"), args.rate, args.freshness_s)
    else:
        with services(config, keep_data=args.keep_data):
            produced = load(config, args.events, summary)
            summary["by_master"] = {}
            for n, master in enumerate(masters):
                repeat = masters[:n].count(master)
                name = f"{master} #{repeat + 1}" if repeat else master
                own = config.model_copy(update={"stream": config.stream.model_validate(
                    {**config.stream.model_dump(), "master": master})})
                with session(own) as spark:
                    summary["by_master"][name] = run_phases(spark, own, phases, args.events, produced, name)
        summary["amdahl"] = amdahl(summary["by_master"])
    emit(summary, args.out)


if __name__ == "__main__":
    main()
