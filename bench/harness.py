"""What the benches share: a stack of their own (broker, store server, a warmed Spark session), the bench's event
mix and its backlog, drains timed with the machine's CPU and the JIT's, and how results are printed.

``bench.pipeline`` (the headline benchmark) is built from these, and so are ``bench.cluster``, ``bench.faults``
and the probes (``bench.probes``). Nothing here runs on its own: each bench's ``main`` decides what to measure.

- **stack**: :func:`bench_config` (free ports, a temporary data dir) and :func:`stack`: :func:`services` (broker,
  store server) and :func:`session` (the job's Spark session, warmed up on a topic of its own);
- **load**: :class:`Load` and :func:`records` (the event mix), :func:`produce_backlog`, :func:`live_load`;
- **drains and timers**: :func:`fresh` (a store database and checkpoints per run), :func:`drain`,
  :func:`drain_live`, :func:`drain_alone`, :func:`spark_count_only` (the read limit), :class:`Spent`,
  :func:`cpu_seconds`, :class:`JvmCpu` (the JVM's threads and Python workers by part), :func:`stage_breakdown`,
  :func:`stored_summary`;
- **output**: :func:`report` (a phase's result on stderr as it comes), :func:`emit` (the JSON summary).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from analytics.job import QUERIES
from analytics.vocabulary import ACCEPT_QUERY
from eventide.config import Config, load_config
from eventide.envelope import now_ms, uuid7
from stack import broker
from stack.services import free_port
from store.client import connect
from store.migrations import apply_migrations
from store.server import child as served_store

REPO = Path(__file__).resolve().parent.parent

APPS = [f"app-{a}" for a in range(5)]
METRICS = [f"metric_{m}" for m in range(10)]              # 5 apps x 10 names: 50 metric series
LOGGERS = ["app.http", "app.db"]
LEVEL_MIX = ["info"] * 6 + ["debug", "warning", "warning", "error"]


# The stack -----------------------------------------------------------------------------------------------------
def bench_config(stream: dict[str, Any] | None = None) -> Config:
    """The default configuration on free ports and a new temporary data dir, with ``stream`` overrides."""
    data = Path(tempfile.mkdtemp(prefix="eventide-bench-"))
    return load_config(environ={}, root=str(REPO),
                       paths={"data_dir": str(data), "cache_dir": str(REPO / ".cache")},
                       kafka={"port": free_port(), "controller_port": free_port()},
                       store={"port": free_port()},
                       stream=stream or {})


def warm_up(spark: Any, config: Config) -> None:
    """Spark's JVM and the Kafka connector warmed (code generation, class loading): the whole job drained over
    50,000 events of a topic of its own (produced once per broker), so no measured drain pays the JVM's start."""
    warm = config.model_copy(update={"kafka": config.kafka.model_copy(update={"events_topic": "warmup"})})
    broker.ensure_topics(warm)
    if not sum(topic_end_offsets(warm).values()):
        produce_backlog(warm, Load(events=50_000, seed=2), now_ms() - 3 * 3_600_000)
    drain(spark, fresh(warm, "warm"), QUERIES, 50_000)


@contextlib.contextmanager
def services(config: Config, keep_data: bool = False) -> Iterator[None]:
    """A broker and a store server of the bench's own (``config``'s ports and data dir). Afterwards the broker is
    stopped and the data dir removed (a 1M-event run leaves ~2 GB of checkpoints, accepted-events files and store
    behind) unless ``keep_data``."""
    broker.start(config)
    try:
        with served_store(config):   # the store the job writes to: its own, on a free port
            yield
    finally:
        broker.stop(config)
        if not keep_data:
            shutil.rmtree(config.data_dir, ignore_errors=True)


@contextlib.contextmanager
def session(config: Config, app_name: str = "eventide-bench") -> Iterator[Any]:
    """The job's Spark session on ``stream.master``, warmed up (:func:`warm_up`), stopped afterwards. Sessions one
    after the other share the JVM (PySpark starts one per process), so its JIT's compiled code too; each is a new
    Spark context (its own master, task slots, executor)."""
    from analytics.job import spark_session

    spark = spark_session(config, app_name=app_name)
    try:
        warm_up(spark, config)
        yield spark
    finally:
        spark.stop()


@contextlib.contextmanager
def stack(config: Config, keep_data: bool = False, app_name: str = "eventide-bench") -> Iterator[Any]:
    """:func:`services` and a warmed :func:`session`; yields the session."""
    with services(config, keep_data), session(config, app_name) as spark:
        yield spark


# The load ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Load:
    """A realistic event mix. Event time advances ``event_rate`` events per second from ``start_ms``; every
    ``late_fraction``-th event is sent up to ``max_offline_s`` after it happened (some land behind the watermark),
    every ``malformed_fraction``-th is broken in one of several ways (dead letters), every
    ``duplicate_fraction``-th is sent twice (counted once, as a duplicate)."""

    events: int
    event_rate: int = 1_000
    devices_per_app: int = 40
    users: int = 5_000
    active_users: int = 1_000          # a block of users active per minute of event time: sessions end
    skewed_fraction: float = 0.2
    late_fraction: float = 0.03
    max_offline_s: int = 120
    malformed_fraction: float = 0.005
    duplicate_fraction: float = 0.01   # re-sent: the same record again, right after (a retried send)
    seed: int = 1


def _malformed(i: int, good: dict[str, Any]) -> bytes:
    broken = dict(good)
    match i % 5:
        case 0:
            return b'{"v": 1, "id": "truncated'
        case 1:
            broken.pop("value", None)
            broken.pop("level", None)
        case 2:
            broken["event_time"] = str(broken["event_time"])
        case 3:
            broken["event_time"] = broken["sent_time"] + 1
        case _:
            broken["v"] = 2
    return json.dumps(broken).encode()


def records(load: Load, start_ms: int, clock: Callable[[], int] = now_ms) -> Iterator[tuple[bytes, bytes, str]]:
    """(key, value, what) per record, what in {"metric", "log", "late", "malformed", "duplicate"}. ``sent_time``
    is the device clock at encoding time, so ``corrected_event_time`` follows the load's event-time line."""
    rng = random.Random(load.seed)
    devices = [(app, f"{app}-dev-{d}", (rng.randrange(-3_600_000, 3_600_000)
                                        if rng.random() < load.skewed_fraction else 0))
               for app in APPS for d in range(load.devices_per_app)]
    late_every = round(1 / load.late_fraction) if load.late_fraction else 0
    bad_every = round(1 / load.malformed_fraction) if load.malformed_fraction else 0
    copy_every = round(1 / load.duplicate_fraction) if load.duplicate_fraction else 0
    for i in range(load.events):
        at = start_ms + i * 1000 // load.event_rate
        app, device, skew = devices[rng.randrange(len(devices))]
        block = (at // 60_000) % max(1, load.users // load.active_users)
        user = f"user-{block * load.active_users + rng.randrange(load.active_users)}"
        what = "metric"
        if late_every and i % late_every == late_every // 2:
            at -= rng.randrange(load.max_offline_s * 1000)
            what = "late"
        now = clock()
        event: dict[str, Any] = {"v": 1, "id": uuid7(now), "app": app, "device": device, "user": user,
                                 "event_time": at + skew, "sent_time": now + skew}
        if i % 10 == 9:
            event.update(kind="log", name=LOGGERS[i % 2], level=LEVEL_MIX[rng.randrange(len(LEVEL_MIX))],
                         message="request done")
            what = "log" if what == "metric" else what
        else:
            event.update(kind="metric", name=METRICS[rng.randrange(len(METRICS))],
                         value=round(rng.lognormvariate(3, 1), 3))
        if bad_every and i % bad_every == bad_every - 1:
            yield device.encode(), _malformed(i, event), "malformed"
        else:
            value = json.dumps(event, separators=(",", ":")).encode()
            yield device.encode(), value, what
            if copy_every and i % copy_every == copy_every // 3:
                yield device.encode(), value, "duplicate"


def producer(config: Config) -> Producer:
    return Producer({"bootstrap.servers": config.kafka.bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                     "compression.type": "lz4", "acks": "all", "queue.buffering.max.messages": 1_000_000})


def produce_backlog(config: Config, load: Load, start_ms: int) -> dict[str, int]:
    out = producer(config)
    counts: dict[str, int] = defaultdict(int)
    for key, value, what in records(load, start_ms):
        while True:
            try:
                out.produce(config.kafka.events_topic, value, key)
                break
            except BufferError:
                out.poll(0.05)
        counts[what] += 1
    if out.flush(120):
        raise RuntimeError("backlog not acknowledged by Kafka")
    return dict(counts)


# Measuring -----------------------------------------------------------------------------------------------------
def cpu_seconds() -> float:
    """Busy CPU time of the whole machine (user + system, every core), from /proc/stat.

    The machine runs nothing else during a benchmark, so this is the pipeline's CPU: the JVM, Spark's Python
    workers and the broker serving the reads. A per-process sum misses Spark's short-lived Python workers, whose
    parent ignores SIGCHLD (their time is never added to anyone's children time)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class CollectorTime:
    """Seconds this process has spent in Python's cyclic collector, and its collections, by generation (from
    :func:`install`, through ``gc.callbacks``)."""

    seconds: ClassVar[list[float]] = [0.0, 0.0, 0.0]
    collections: ClassVar[list[int]] = [0, 0, 0]
    _started: ClassVar[float | None] = None

    @classmethod
    def install(cls) -> None:
        if cls._hook not in gc.callbacks:
            gc.callbacks.append(cls._hook)

    @classmethod
    def _hook(cls, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            cls._started = time.perf_counter()
        elif cls._started is not None:
            cls.seconds[info["generation"]] += time.perf_counter() - cls._started
            cls.collections[info["generation"]] += 1
            cls._started = None

    @classmethod
    def snapshot(cls) -> tuple[list[float], list[int]]:
        return list(cls.seconds), list(cls.collections)


# Threads of the Spark JVM by part, by their names (/proc/<pid>/task/<tid>/comm keeps the first 15 characters).
# Local mode runs the driver and the executor in one JVM; what runs where on a cluster is told apart by name.
JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")   # as jit_cpu_s always counted
# the collector and the JVM's own housekeeping (code cache sweeper, periodic tasks): they serve both sides
GC_THREADS = ("GC Thread", "ParGC Thread", "G1 ", "VM Thread", "VM Periodic Tas", "Sweeper thread", "Service Thread")
EXECUTOR_THREADS = ("Executor task ",      # Spark's task threads: "Executor task launch worker for task ..." (4.1
                    # and 4.2); 4.2 runs tasks in threads named "Executor task i..." as well, counted as driver before
                    "rocksdb:", "state-store-mai", "kafka-fetched-d", "executor-heartb", "executor-kill-m",
                    "stateConnection")      # the state server a task runs for its Python stateful processor


def _thread_part(name: str) -> str:
    if name.startswith(JIT_THREADS):
        return "jit"
    if name.startswith(GC_THREADS):
        return "gc"
    if name.startswith(EXECUTOR_THREADS):
        return "executor"
    return "driver_jvm"


def _stat(path: Path) -> tuple[str, int, float] | None:
    """(name, parent pid, user + system CPU seconds) of a process or thread; None once it has ended."""
    try:
        stat = (path / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (stat[stat.index("(") + 1:stat.rindex(")")], int(fields[1]),
            (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))


def _rss_mb(pid: int | str, field: str = "VmHWM") -> float | None:
    """A process's peak resident memory (``VmHWM``, since its start or its last :func:`_reset_peak_rss`) or its
    current one (``VmRSS``), in MB."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith(f"{field}:")), None)
    return None if kib is None else round(kib / 1024, 1)


def _reset_peak_rss(pid: int | str) -> bool:
    """Restart a process's VmHWM from its current RSS (Linux >= 4.0), so a peak is one drain's."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class JvmCpu:
    """CPU of the Spark JVM's threads by part (the JIT's compiler threads, the collector, the executor's task
    threads, the driver's), and of Spark's Python workers (processes under the JVM, counted as the executor's),
    from creation to :meth:`stop`.

    Spark generates and loads new classes for every query it plans, and HotSpot compiles their hot methods (and
    Spark's own) while the job runs: in a drain of a few hundred thousand events that is a visible share of the
    machine's CPU. HotSpot starts extra compiler threads as its queues grow and ends them once idle, and a thread's
    time leaves ``/proc`` with it, so two readings (before and after a drain) miss most of it: the compiler threads
    are read every ``POLL_S`` meanwhile, each one's CPU counted from its first reading (0 for a thread started
    since). The other threads and the Python workers live long (pooled, reused), so they are read every
    ``ALL_EVERY`` polls: reading all ~300 of the JVM's threads takes ~6 ms, CPU and GIL taken from the job's driver.
    A worker or thread that ends between two readings loses what it spent since the last one. The poller's own
    CPU (it runs in the driver's Python process) is kept in ``own_cpu_s``."""

    POLL_S = 0.1
    ALL_EVERY = 10

    def __init__(self, spark: Any) -> None:
        self.pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
        self._tasks = Path(f"/proc/{self.pid}/task")
        self._thread: dict[str, tuple[str, str]] = {}   # thread id -> (part, name with digits as N), read once
        self._workers: dict[str, bool] = {str(self.pid): False}   # pid -> runs under the JVM
        self._start = {**self._read_threads(every=True), **self._read_workers()}
        self._last = dict(self._start)
        self.own_cpu_s = 0.0
        self._stopped = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="jvm-cpu", daemon=True)
        self._poller.start()

    def _read_threads(self, every: bool) -> dict[str, float]:
        """CPU seconds of each JVM thread alive now (``every``: else the compiler threads and threads not seen yet,
        each one's name read once: a compiler thread may live less than a second)."""
        cpu = {}
        for tid in os.listdir(self._tasks):
            known = self._thread.get(tid)
            if not every and known is not None and known[0] != "jit":
                continue
            stat = _stat(self._tasks / tid)
            if stat is None:   # the thread ended meanwhile
                continue
            if known is None:
                self._thread[tid] = (_thread_part(stat[0]), "".join("N" if c.isdigit() else c for c in stat[0]))
            cpu[tid] = stat[2]
        return cpu

    def _under_jvm(self, pid: str) -> bool:
        """Whether a process descends from the JVM (Spark's Python daemon and the workers it forks); decided once
        per process, from its parents'."""
        if pid in self._workers:   # the JVM itself is there, as not under itself
            return self._workers[pid]
        jvm, chain = str(self.pid), []
        while pid not in self._workers:
            stat = _stat(Path(f"/proc/{pid}"))
            if stat is None or stat[1] <= 1:
                self._workers.update(dict.fromkeys([*chain, pid], False))
                return False
            chain.append(pid)
            pid = str(stat[1])
        under = pid == jvm or self._workers[pid]
        self._workers.update(dict.fromkeys(chain, under))
        return under

    def _read_workers(self) -> dict[str, float]:
        cpu = {}
        for pid in os.listdir("/proc"):
            if pid.isdigit() and self._under_jvm(pid):
                stat = _stat(Path(f"/proc/{pid}"))
                if stat is not None:
                    cpu[f"p{pid}"] = stat[2]
        return cpu

    def _poll(self) -> None:
        polls = 0
        while not self._stopped.wait(self.POLL_S):
            polls += 1
            every = polls % self.ALL_EVERY == 0
            self._last.update(self._read_threads(every))
            if every:
                self._last.update(self._read_workers())
        self.own_cpu_s = time.thread_time()

    def _part(self, key: str) -> str:
        """The part a reading's key (a thread id, or ``p<pid>`` for a Python worker) counts in."""
        return "python_workers" if key.startswith("p") else self._thread[key][0]

    def measuring_s(self) -> float:
        """The poller's own CPU seconds so far (the bench's, not the job's: it runs in the driver's Python process)."""
        if self._poller.ident is None or not self._poller.is_alive():
            return self.own_cpu_s
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(self._poller.ident))
        except OSError:   # it ended meanwhile
            return self.own_cpu_s

    def jit_s(self) -> float:
        """The compiler threads' CPU seconds since creation, as of the poller's last reading (while it runs)."""
        last = dict(self._last)   # one C-level copy: the poller updates it meanwhile
        return sum(cpu - self._start.get(key, 0.0) for key, cpu in last.items() if self._part(key) == "jit")

    def stop(self) -> dict[str, Any]:
        """Stop reading; CPU seconds since creation by part (``jit``, ``gc``, ``executor``, ``python_workers``,
        ``driver_jvm``) and the driver-side and executor JVM threads' by name (``driver_jvm_threads``,
        ``executor_threads``)."""
        self._stopped.set()
        self._poller.join()
        self._last.update({**self._read_threads(every=True), **self._read_workers()})
        parts: dict[str, float] = dict.fromkeys(("jit", "gc", "executor", "python_workers", "driver_jvm"), 0.0)
        names: dict[str, dict[str, float]] = {"driver_jvm": defaultdict(float), "executor": defaultdict(float)}
        for key, cpu in self._last.items():
            spent = cpu - self._start.get(key, 0.0)
            part = self._part(key)
            parts[part] += spent
            if part in names:
                names[part][self._thread[key][1]] += spent
        return {**parts, "driver_jvm_threads": dict(names["driver_jvm"]), "executor_threads": dict(names["executor"])}


class Spent:
    """Wall time, the machine's CPU and its parts (the JVM's threads by part, Spark's Python workers, the driver's
    Python process) and the drivers' peak memory, from its creation to :meth:`per` (one drain)."""

    def __init__(self, spark: Any) -> None:
        self._jvm = JvmCpu(spark)
        self._peaks_reset = _reset_peak_rss("self") and _reset_peak_rss(self._jvm.pid)
        # the peaks include what the processes held before (earlier drains' leftovers in a long bench)
        self._rss_start = {"driver_python_rss_start_mb": _rss_mb("self", "VmRSS"),
                           "jvm_rss_start_mb": _rss_mb(self._jvm.pid, "VmRSS")}
        self._python = resource.getrusage(resource.RUSAGE_SELF)
        CollectorTime.install()
        self._collector = CollectorTime.snapshot()
        self._cpu, self._t = cpu_seconds(), time.perf_counter()

    def jit_s(self) -> float:
        """The JIT's CPU seconds so far (:meth:`JvmCpu.jit_s`)."""
        return self._jvm.jit_s()

    def measuring_s(self) -> float:
        """The bench's own CPU seconds so far, reading the JVM's threads (:meth:`JvmCpu.measuring_s`)."""
        return self._jvm.measuring_s()

    def per(self, events: int) -> dict[str, Any]:
        """What was spent so far, and the rates for ``events`` events."""
        seconds, cpu = time.perf_counter() - self._t, cpu_seconds() - self._cpu
        usage = resource.getrusage(resource.RUSAGE_SELF)
        jvm = self._jvm.stop()
        collector_s, collections = CollectorTime.snapshot()
        collector = {"seconds_by_generation": [round(b - a, 3) for a, b in zip(self._collector[0], collector_s,
                                                                                  strict=True)],
                     "collections_by_generation": [b - a for a, b in zip(self._collector[1], collections,
                                                                          strict=True)]}
        python = (usage.ru_utime + usage.ru_stime - self._python.ru_utime - self._python.ru_stime
                  - self._jvm.own_cpu_s)
        return {"seconds": round(seconds, 2), "events_per_s": round(events / seconds), "cpu_s": round(cpu, 1),
                "cpu_us_per_event": round(cpu * 1e6 / events, 1),
                "job_cpu_us_per_event": round((cpu - self._jvm.own_cpu_s) * 1e6 / events, 1),
                "jit_cpu_s": round(jvm["jit"], 1),
                "driver": {**driver_figures(python, jvm, cpu, events, self._jvm.own_cpu_s,
                                            _rss_mb("self"), _rss_mb(self._jvm.pid), self._peaks_reset),
                           **self._rss_start, "driver_python_collector": collector}}


class CpuByMinute:
    """The machine's CPU per event in each minute of a live load (and what a last, shorter stretch took), also
    without the load generator's own CPU, the job's alone (neither the load generator's nor the bench's reading of
    the JVM's threads), and with the JIT's share: a run's average hides a young JVM's compiling, which fades as the
    job runs on. Reads every ``every_s`` in a thread of its own until :meth:`stop`."""

    def __init__(self, spent: Spent, loader_pid: int, events: Callable[[], int], every_s: float = 60.0) -> None:
        self._spent, self._loader, self._events, self._every = spent, Path(f"/proc/{loader_pid}"), events, every_s
        self._readings = [self._read()]
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-by-minute", daemon=True)
        self._thread.start()

    def _read(self) -> tuple[float, float, float, float, float, int]:
        loader = _stat(self._loader)
        return (time.perf_counter(), cpu_seconds(), loader[2] if loader else 0.0, self._spent.measuring_s(),
                self._spent.jit_s(), self._events())

    def _run(self) -> None:
        while not self._stopped.wait(self._every):
            self._readings.append(self._read())

    def stop(self) -> list[dict[str, Any]]:
        """One entry per stretch read: its seconds, events produced, and CPU µs per event (the machine's, without
        the load generator's, the job's alone, the JIT's)."""
        self._stopped.set()
        self._thread.join()
        last = self._read()
        if last[0] - self._readings[-1][0] >= 1.0:
            self._readings.append(last)
        out = []
        for (t0, cpu0, load0, own0, jit0, n0), (t1, cpu1, load1, own1, jit1, n1) in itertools.pairwise(self._readings):
            events = max(n1 - n0, 1)
            out.append({"seconds": round(t1 - t0, 1), "events": n1 - n0,
                        "machine_cpu_us_per_event": round((cpu1 - cpu0) * 1e6 / events, 1),
                        "without_load": round((cpu1 - cpu0 - (load1 - load0)) * 1e6 / events, 1),
                        "job": round((cpu1 - cpu0 - (load1 - load0) - (own1 - own0)) * 1e6 / events, 1),
                        "jit_us_per_event": round((jit1 - jit0) * 1e6 / events, 1)})
        return out


def driver_figures(python: float, jvm: dict[str, Any], machine: float, events: int, measuring: float,
                   python_peak_mb: float | None, jvm_peak_mb: float | None, peaks_reset: bool) -> dict[str, Any]:
    """The driver's CPU per event (its Python process + the JVM's driver-side threads) beside the executor's (task
    threads, their helpers, Python workers), the JIT's and the collector's, which local mode shares; the ceiling
    the driver sets, ``1 / driver CPU per event``; and the two processes' peak RSS during the drain."""

    def us(seconds: float) -> float:
        return round(seconds * 1e6 / events, 2)

    driver = python + jvm["driver_jvm"]
    attributed = driver + jvm["executor"] + jvm["python_workers"] + jvm["jit"] + jvm["gc"] + measuring
    top = sorted(jvm["driver_jvm_threads"].items(), key=lambda kv: -kv[1])[:8]
    return {"driver_cpu_s": round(driver, 3), "driver_us_per_event": us(driver),
            "driver_ceiling_events_per_s": round(events / driver) if driver > 0 else None,
            "driver_python_us_per_event": us(python), "driver_jvm_us_per_event": us(jvm["driver_jvm"]),
            "executor_us_per_event": us(jvm["executor"] + jvm["python_workers"]),
            "executor_threads_us_per_event": us(jvm["executor"]),
            "python_workers_us_per_event": us(jvm["python_workers"]),
            "jit_us_per_event": us(jvm["jit"]), "gc_us_per_event": us(jvm["gc"]),
            # the broker, the store server, and whatever else the machine ran
            "rest_of_machine_us_per_event": us(machine - attributed),
            "measuring_cpu_s": round(measuring, 2),
            "driver_jvm_threads_us_per_event": {name: us(cpu) for name, cpu in top},
            "executor_threads_by_name_us_per_event": {name: us(cpu) for name, cpu in sorted(
                jvm["executor_threads"].items(), key=lambda kv: -kv[1])[:8]},
            "driver_python_peak_rss_mb": python_peak_mb, "jvm_peak_rss_mb": jvm_peak_mb,
            "peak_rss_of": "the drain" if peaks_reset else "the process"}


def stage_breakdown(queries: list[Any]) -> dict[str, Any]:
    """Per query: Spark's durationMs summed over data batches, state operator metrics, and sink stages."""
    from analytics import sinks

    out: dict[str, Any] = {}
    for query in queries:
        batches = [p for p in query.recentProgress if p["numInputRows"]]
        durations: dict[str, int] = defaultdict(int)
        per_batch: dict[str, list[float]] = defaultdict(list)
        state: dict[str, float] = defaultdict(float)
        for p in batches:
            for k, v in p["durationMs"].items():
                durations[k] += v
                per_batch[k].append(v / 1000)
            for op in p.get("stateOperators", []):
                for k in ("numRowsTotal", "numRowsUpdated", "allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs",
                          "memoryUsedBytes", "numRowsDroppedByWatermark"):
                    state[k] = state[k] + op.get(k, 0) if k != "numRowsTotal" else op.get(k, 0)
                for k, v in (op.get("customMetrics") or {}).items():
                    state[f"custom.{k}"] += v
        stages = {stage: v for (q, stage), v in sinks.sink_seconds.items() if q == query.name}
        out[query.name] = {"batches": len(batches), "input_rows": sum(p["numInputRows"] for p in batches),
                           "duration_ms": dict(durations), "state": dict(state),
                           # per micro-batch: its fixed costs show here when batches are small (freshness)
                           "duration_batch_ms": {k: _percentiles_ms(v) for k, v in per_batch.items()},
                           "sink_s": {stage: round(sum(v), 3) for stage, v in stages.items()},
                           # per micro-batch: what one batch waits for each sink stage (e.g. the store write)
                           "sink_batch_ms": {stage: _percentiles_ms(v) for stage, v in stages.items()}}
    return out


def fresh(config: Config, label: str, **stream: Any) -> Config:
    """Same broker and topic; its own store database and checkpoints, and ``stream`` overrides."""
    slug = f"{label}_{int(time.time() * 1000) % 10**9}"
    cfg = config.model_copy(update={
        "store": config.store.model_copy(update={"database": f"b_{slug}"}),
        "stream": config.stream.model_validate({**config.stream.model_dump(), **stream,
                                                "checkpoint_dir": config.data_dir / "checkpoints" / slug}),
    })
    apply_migrations(cfg)
    return cfg


def _percentiles_ms(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000, 1)

    return {"n": len(ordered), "p50": at(0.5), "p95": at(0.95), "max": at(1.0)}


def drain(spark: Any, config: Config, only: tuple[str, ...], events: int) -> dict[str, Any]:
    """Run the job's ``only`` queries over the topic from its first offset until idle; events/s and CPU."""
    from analytics import sinks
    from analytics.job import run_until_idle

    sinks.sink_seconds.clear()
    spent = Spent(spark)
    queries = run_until_idle(spark, config, only)
    return {"queries": list(only), **_with_settings(spent.per(events), spark, config),
            "stages": stage_breakdown(queries)}


def _with_settings(measured: dict[str, Any], spark: Any, config: Config) -> dict[str, Any]:
    """A drain's figures with what the driver's share depends on: the master, the batch cap (the dedup horizon's
    ids are in :func:`stored_summary`)."""
    measured["driver"].update(master=spark.sparkContext.master,
                              max_offsets_per_trigger=config.stream.max_offsets_per_trigger)
    return measured


def drain_live(spark: Any, config: Config, events: int) -> dict[str, Any]:
    """The whole job as it runs live (every query at once, processing-time triggers: the readers take each accept
    batch while ``accept`` reads the next) over the backlog; timed until both readers have committed the batch
    holding the topic's last offsets, and the batch without data that may follow it."""
    from analytics import accepted_log, sinks
    from analytics.job import start_queries
    from analytics.vocabulary import WINDOWS_QUERY

    sinks.sink_seconds.clear()
    end = topic_end_offsets(config)
    readers = [config.checkpoint_dir / q for q in QUERIES if q != ACCEPT_QUERY]
    spent = Spent(spark)
    queries = start_queries(spark, config)
    try:
        while True:
            time.sleep(0.05)
            failed = [q for q in queries if q.exception() is not None]
            if failed:
                raise RuntimeError(f"query {failed[0].name} failed: {failed[0].exception()}")
            published = accepted_log.metas(config)
            last = published[-1] if published else None
            reached = last is not None and {int(p): o for p, o in last.end_offsets.get(
                config.kafka.events_topic, {}).items()} == end
            if reached and all(accepted_log.last_read(r) == last.batch_id for r in readers):
                break
        # As a drain's last trigger does, the readers' next trigger may run a batch without data that only moves the
        # watermark (closing windows and sessions); it is part of the work.
        read_last = {q.name: q.lastProgress["batchId"] for q in queries if q.name != ACCEPT_QUERY}
        while not all(q.lastProgress["batchId"] > read_last[q.name]
                      or q.status["message"] == "Waiting for data to arrive"
                      for q in queries if q.name in read_last):
            time.sleep(0.05)
        measured = _with_settings(spent.per(events), spark, config)
    finally:
        for query in queries:
            query.stop()
    windows_query = next(q for q in queries if q.name == WINDOWS_QUERY)
    return {"queries": list(QUERIES), "mode": "live", **measured, "accept_batches": len(published),
            "windows_batches": len([p for p in windows_query.recentProgress if p["numInputRows"]]),
            "stages": stage_breakdown(queries)}


def topic_end_offsets(config: Config) -> dict[int, int]:
    """The events topic's end offset per partition (every record of the backlog is below it)."""
    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap, "group.id": f"ends-{time.time()}"})
    try:
        topic = config.kafka.events_topic
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: _end_offset(consumer, TopicPartition(topic, p)) for p in partitions}
    finally:
        consumer.close()


def _end_offset(consumer: Consumer, partition: TopicPartition, attempts: int = 20) -> int:
    """A partition's end offset; retried while the broker, just started, has no leader for it yet."""
    for _ in range(attempts - 1):
        try:
            return consumer.get_watermark_offsets(partition, timeout=10)[1]
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.NOT_LEADER_FOR_PARTITION:
                raise
        time.sleep(0.5)
    return consumer.get_watermark_offsets(partition, timeout=10)[1]


def driver_per_batch(drains: list[dict[str, Any]]) -> dict[str, Any]:
    """The driver's CPU of drains of one backlog cut into different numbers of ``accept`` batches (each drain's
    ``batches`` and ``driver``) as ``start + batches × per batch``, by least squares: what a drain pays once (the
    queries' starts, their first planning) and what it pays per batch (every query's planning, its Spark job, progress
    reports). Each reader takes one ``accept`` batch per batch, so per batch means every query once."""
    counts = [d["batches"] for d in drains]
    cpu = [d["driver"]["driver_cpu_s"] for d in drains]
    if len(set(counts)) < 2:
        return {}
    mean_n, mean_cpu = sum(counts) / len(counts), sum(cpu) / len(cpu)
    per_batch = (sum((n - mean_n) * (c - mean_cpu) for n, c in zip(counts, cpu, strict=True))
                 / sum((n - mean_n) ** 2 for n in counts))
    start = mean_cpu - per_batch * mean_n
    return {"driver_start_s": round(start, 3), "driver_s_per_batch": round(per_batch, 3),
            "residuals_s": [round(c - start - per_batch * n, 3) for n, c in zip(counts, cpu, strict=True)]}


def drain_alone(spark: Any, config: Config, query: str, events: int) -> dict[str, Any]:
    """One query alone; a query reading the accepted-events log gets it filled first (not timed)."""
    from analytics.job import run_until_idle

    if query != ACCEPT_QUERY:
        run_until_idle(spark, config, (ACCEPT_QUERY,))
    return drain(spark, config, (query,), events)


def spark_count_only(spark: Any, config: Config, events: int) -> dict[str, Any]:
    """The read limit: Spark's Kafka source over the same topic, counting records and nothing else."""
    from analytics.job import kafka_records

    total = [0]

    def count(batch: Any, _: int) -> None:
        total[0] += batch.count()

    cpu, t = cpu_seconds(), time.perf_counter()
    query = (kafka_records(spark, config).writeStream.foreachBatch(count)
             .option("checkpointLocation", str(config.checkpoint_dir / "count_only"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    seconds, cpu = time.perf_counter() - t, cpu_seconds() - cpu
    return {"records": total[0], "seconds": round(seconds, 2), "events_per_s": round(total[0] / seconds),
            "cpu_us_per_event": round(cpu * 1e6 / max(total[0], 1), 1)}


def stored_summary(config: Config) -> dict[str, Any]:
    """Rows stored per table, and the largest dedup memory a batch was checked against (ids, bytes on disk)."""
    with connect(config) as ch:
        stored: dict[str, Any] = {
            t: ch.query(f"SELECT count() FROM {t} FINAL").result_rows[0][0]
            for t in ("window_aggregates", "sliding_windows", "sessions", "stragglers", "dead_letters", "duplicates")}
        ids, size, memory = ch.query("SELECT max(horizon_ids), max(horizon_bytes), max(horizon_memory_bytes) "
                                     "FROM dedup_state FINAL").result_rows[0]
        # The dedup state is held per Kafka partition, in the task that reads it: its largest partition's share.
        part_ids, part_memory = ch.query("SELECT max(horizon_ids), max(horizon_memory_bytes) "
                                         "FROM dedup_partitions FINAL").result_rows[0]
    stored["dedup_horizon_ids_max"] = ids
    stored["dedup_horizon_bytes_per_1m_ids"] = round(size / ids * 1e6) if ids else None
    stored["dedup_memory_bytes_per_1m_ids"] = round(memory / ids * 1e6) if ids else None
    stored["dedup_partition_ids_max"] = part_ids
    stored["dedup_partition_memory_bytes_max"] = part_memory
    return stored


# A live load ---------------------------------------------------------------------------------------------------
def live_load(bootstrap: str, topic: str, rate: int, seconds: float) -> None:
    """Produce ``rate`` on-time events/s for ``seconds`` (run in its own process by ``freshness``)."""
    cfg = load_config(environ={}, root=str(REPO), kafka={"bootstrap_servers": bootstrap, "events_topic": topic})
    out = producer(cfg)
    load = Load(events=int(rate * seconds), event_rate=rate, late_fraction=0, malformed_fraction=0,
                duplicate_fraction=0, seed=7)
    start, sent = time.monotonic(), 0

    def paced_clock() -> int:
        # The n-th event is sent when it is due, not before: sent ahead of its event time, the job would
        # dead-letter it (event_time after sent_time).
        nonlocal sent
        ahead = start + sent / rate - time.monotonic()
        if ahead > 0.005:
            time.sleep(ahead)
        sent += 1
        return now_ms()

    # Event times start 10 ms back: the clock may read up to 5 ms before an event is due, never after its time.
    for key, value, _ in records(load, now_ms() - 10, clock=paced_clock):
        while True:
            try:
                out.produce(topic, value, key)
                break
            except BufferError:
                out.poll(0.05)
        out.poll(0)
    out.flush(60)


# Output --------------------------------------------------------------------------------------------------------
def report(phase: str, result: Any) -> Any:
    """Print a phase's result as soon as it is known (stderr), so a long run shows progress."""
    print(f"[{phase}] {json.dumps(result, default=str)}", file=sys.stderr, flush=True)
    return result


def emit(summary: dict[str, Any], out: Path | None) -> None:
    """Print a benchmark's JSON summary (stdout) and also write it to ``out`` when given."""
    text = json.dumps(summary, indent=1, default=str)
    print(text)
    if out:
        out.write_text(text)
