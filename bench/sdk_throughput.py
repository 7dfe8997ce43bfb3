"""SDK hot path and throughput: what one call costs the application, and how many events/s one process gets
into Kafka (acknowledged, ``acks=all``).

Starts its own broker (free ports, temporary data dir). Three measurements:

1. hot-path latency per call (median, p99), each call timed with ``perf_counter_ns`` while the background sender
   runs, for a histogram observation, a counter increment with user and tag, and a log line;
2. the same calls' mean cost from a tight loop (``timeit``-style, no per-call timer);
3. sustained throughput: N histogram observations from one thread with the ``block`` policy (so nothing is
   dropped), timed from the first call until ``flush()`` reports every event acknowledged by Kafka.

    .venv/bin/python -m bench.sdk_throughput --events 2000000
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from eventide.config import Config, load_config
from ingest.sdk import Client
from stack import broker
from stack.services import free_port

REPO = Path(__file__).resolve().parent.parent


def per_call_ns(call: Callable[[], None], calls: int) -> tuple[float, float]:
    """(median, p99) of single timed calls, in ns."""
    clock = time.perf_counter_ns
    samples = []
    for _ in range(calls):
        start = clock()
        call()
        samples.append(clock() - start)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99)]


def loop_mean_ns(call: Callable[[], None], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        call()
    return (time.perf_counter_ns() - start) / calls


def hot_path(config: Config, calls: int) -> None:
    cfg = config.model_copy(update={"sdk": config.sdk.model_copy(update={"buffer_capacity": 4 * calls})})
    with Client("bench", "bench-host", config=cfg) as events:
        latency = events.histogram("latency_ms")
        orders = events.counter("orders")
        cases: dict[str, Callable[[], None]] = {
            "histogram.observe(12.5)": lambda: latency.observe(12.5),
            'counter.inc(user="u-1", region="eu")': lambda: orders.inc(user="u-1", region="eu"),
            'log("info", "request done")': lambda: events.log("info", "request done"),
        }
        timer_overhead = per_call_ns(lambda: None, calls)[0]
        print(f"per-call timer overhead (empty lambda): {timer_overhead:.0f} ns median (included below)")
        for name, call in cases.items():
            median, p99 = per_call_ns(call, calls)
            mean = loop_mean_ns(call, calls)
            print(f"  {name:40s} median {median / 1000:.2f} µs  p99 {p99 / 1000:.2f} µs  "
                  f"loop mean {mean / 1000:.2f} µs")
        assert events.flush(120), "Kafka did not acknowledge the hot-path events"


def throughput(config: Config, events_n: int) -> None:
    cfg = config.model_copy(update={"sdk": config.sdk.model_copy(update={"overflow_policy": "block"})})
    events = Client("bench", "bench-host", config=cfg)
    latency = events.histogram("latency_ms")
    start = time.perf_counter()
    for i in range(events_n):
        latency.observe(i % 1000)
    recorded = time.perf_counter()
    assert events.flush(300), "Kafka did not acknowledge every event"
    done = time.perf_counter()
    stats = events.stats()
    events.close()
    assert stats.acknowledged == stats.produced == events_n and stats.dropped == 0, stats
    print(f"sustained: {events_n:,} events recorded in {recorded - start:.2f} s, all acknowledged by Kafka after "
          f"{done - start:.2f} s -> {events_n / (done - start):,.0f} events/s into Kafka "
          f"(recording alone {events_n / (recorded - start):,.0f} calls/s; blocked puts {stats.blocked_puts:,})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=2_000_000, help="events for the throughput run")
    parser.add_argument("--calls", type=int, default=200_000, help="timed calls per hot-path case")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="eventide-bench-sdk-"))
    config = load_config(environ={}, root=str(REPO), paths={"data_dir": str(data), "cache_dir": str(REPO / ".cache")},
                         kafka={"port": free_port(), "controller_port": free_port()},
                         sdk={"health_interval_s": 0})
    broker.start(config)
    try:
        broker.ensure_topics(config)
        with Client("bench", "warm-up", config=config) as warm:   # topic leader up, producer connected
            warm.counter("warm").inc()
            assert warm.flush(60)
        print(f"SDK defaults: buffer {config.sdk.buffer_capacity:,}, batch {config.sdk.batch_size:,}, "
              f"linger {config.sdk.linger_ms} ms, {config.sdk.compression}, acks=all, idempotent")
        hot_path(config, args.calls)
        throughput(config, args.events)
    finally:
        broker.stop(config)


if __name__ == "__main__":
    main()
