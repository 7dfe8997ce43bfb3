"""The fault scenarios of issue 12, shared by the fault suite (tests/integration/test_faults.py, small and bounded) and
the longer benchmark (bench/faults.py, figures). Each runs on the real broker, job and store and returns what it
counted; the callers decide what must hold.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from confluent_kafka import Producer
from fastapi.testclient import TestClient

from eventide.config import Config, to_environ
from eventide.envelope import encode, metric_event, now_ms
from ingest.gateway.app import create_app
from ingest.sdk import Client
from stack import broker, services
from stack.services import free_port
from tests.support.pipeline import Event, rows, run_job, wait_until
from tests.support.stack import fresh_stack, writer_url

S = 1000
# An hour boundary a day ago: recent enough for every table's TTL (device clocks keep 30 days), so every table
# the comparisons read holds rows.
T0 = now_ms() - now_ms() % 3_600_000 - 24 * 3_600_000
GATEWAY_TOKEN = "fault-suite"


def send(config: Config, records: list[tuple[str, bytes]]) -> None:
    """Produce (key, value) records as they are: the broker stamps them, the job sees raw bytes."""
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap, "acks": "all", "linger.ms": 20})
    for key, value in records:
        producer.produce(config.kafka.events_topic, value=value, key=key.encode())
        producer.poll(0)
    assert producer.flush(60) == 0


# Fuzzed records ------------------------------------------------------------------------------------------------
STRING_FIELDS, INTEGER_FIELDS = ("id", "kind", "app", "device", "name"), ("v", "event_time", "sent_time")


def fuzzed(rng: random.Random, good: dict[str, Any]) -> bytes:
    """One record that is not a valid envelope, of one of several kinds."""
    kind = rng.choices(range(7), weights=[20, 20, 30, 1, 5, 10, 14])[0]
    text = json.dumps(good)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 200))                          # random bytes
    if kind == 1:
        return text[: rng.randrange(1, len(text) - 1)].encode()              # truncated JSON
    if kind == 2:                                                            # a field of the wrong JSON type
        field_ = rng.choice([*STRING_FIELDS, *INTEGER_FIELDS, "value"])
        wrong: list[Any] = ([12, 1.5, True, [], {}] if field_ in STRING_FIELDS
                            else ["12", 1.5, True, []] if field_ in INTEGER_FIELDS else ["12", True, [], {}])
        return encode({**good, field_: rng.choice(wrong)})
    if kind == 3:
        return encode({**good, "name": "x" * rng.randrange(70_000, 80_000)})  # huge field
    if kind == 4:
        depth = rng.randrange(2_000, 20_000)
        return b'{"v":1,"deep":' + b"[" * depth + b"]" * depth + b"}"          # deep nesting
    if kind == 5:
        return text.encode().replace(b'"shop"', b'"sh\xff\xfep"')             # not UTF-8
    return encode({**good, "tags": {"k": rng.choice([1, None, [], {"x": "y"}])}} if rng.random() < 0.5
                  else {**good, "event_time": good["sent_time"] + rng.randrange(1, 10_000)})


@dataclass
class FuzzOutcome:
    bad_sent: int
    good_sent: int
    dead_letters: int
    without_reason: int
    reasons: int
    counted: int            # good events in the windows, and the sum of their values
    counted_sum: float
    expected_sum: float
    duplicates: int


def fuzz(config: Config, spark: Any, bad: int, good: int, seed: int = 12) -> FuzzOutcome:
    """``bad`` fuzzed records shuffled among ``good`` events in one 10 s window; the job drains them."""
    rng = random.Random(seed)
    events = [Event(T0 + (i % 50) * 100, float(i), device=f"d{i % 5}").envelope() for i in range(good)]
    records: list[tuple[str, bytes]] = [(e["device"], encode(e)) for e in events]
    records += [(f"fuzz-{i % 7}", fuzzed(rng, events[i % len(events)])) for i in range(bad)]
    rng.shuffle(records)
    send(config, records)
    run_job(spark, config)
    [window] = rows(config, "SELECT sum(event_count) AS n, sum(sum) AS total FROM window_aggregates FINAL "
                            "WHERE window_kind = 'tumbling' AND window_length_ms = 10000")
    [dead] = rows(config, "SELECT count() AS n, countIf(reason = '') AS without_reason, "
                          "uniqExact(reason) AS reasons FROM dead_letters FINAL")
    [dups] = rows(config, "SELECT count() AS n FROM duplicates FINAL")
    return FuzzOutcome(bad, good, dead["n"], dead["without_reason"], dead["reasons"], window["n"],
                       window["total"], float(sum(range(good))), dups["n"])


# Results compared between a faulted and an uninterrupted run ----------------------------------------------------
# Every table the dashboard reads, without what differs between two runs on two topics: when a row was written,
# the topic's name and the broker's timestamps (the events carry their own received_time, so every event time is
# the same in both), which micro-batch of a window query wrote a row (a restarted job may run a watermark-only
# batch the other did not: a row's version, not its values), and sketch bytes, whose layout depends on the order
# values arrived in (the quantiles and distinct counts derived from them are compared).
RESULT_QUERIES = {
    "window_aggregates": "SELECT * EXCEPT (written_at, version, value_sketch, users_sketch, devices_sketch) "
                         "FROM window_aggregates FINAL",
    "sliding_windows": "SELECT * EXCEPT (written_at, version) FROM sliding_windows FINAL",
    "sessions": "SELECT * EXCEPT (written_at, version) FROM sessions FINAL",
    "stragglers": "SELECT * EXCEPT (detected_at, batch_id) FROM stragglers FINAL",
    "corrections": "SELECT * EXCEPT (detected_at, batch_id) FROM corrections FINAL",
    "device_clocks": "SELECT * EXCEPT (recorded_at) FROM device_clocks FINAL",
    "dead_letters": "SELECT * EXCEPT (detected_at, source_topic, kafka_timestamp) FROM dead_letters FINAL",
    "duplicates": "SELECT * EXCEPT (detected_at, source_topic, kafka_timestamp) FROM duplicates FINAL",
    "logs": "SELECT * FROM logs",   # no FINAL: a line written twice must show as a difference
}
# kll_k above any window's value count: KLL compaction flips coins, so only an uncompacted sketch gives the same
# quantiles in two runs.
SETTINGS = {"max_offsets_per_trigger": 60, "trigger_interval_s": 0.5, "sliding_window_s": 60, "session_gap_s": 60,
            "kll_k": 4000}

Results = dict[str, list[tuple[Any, ...]]]


def _comparable(value: Any) -> Any:
    """A Map column (the logs' tags) comes back as a dict: as sorted (key, value) pairs it can be counted."""
    return tuple(sorted(value.items())) if isinstance(value, dict) else value


def results(config: Config) -> Results:
    return {table: sorted(tuple(map(_comparable, r.values())) for r in rows(config, sql))
            for table, sql in RESULT_QUERIES.items()}


def result_columns(config: Config, table: str) -> list[str]:
    return [r["name"] for r in rows(config, f"DESCRIBE ({RESULT_QUERIES[table]})")]


@dataclass
class Comparison:
    """A faulted run's results against an uninterrupted run of the same input."""

    faults: int
    events_sent: int
    rows: dict[str, int]                         # rows per table in the uninterrupted run
    differing: dict[str, int]                    # rows in one run and not in the other, per table
    window_events: tuple[int, int] = (0, 0)      # events counted by the finest tumbling windows: (expected, seen)
    extra: dict[str, Any] = field(default_factory=dict)
    # A few differing rows per table, as (column names, rows only in the uninterrupted run, rows only in the
    # faulted one): what a failure shows.
    examples: dict[str, tuple[list[str], list[tuple[Any, ...]], list[tuple[Any, ...]]]] = field(
        default_factory=dict)

    @property
    def identical(self) -> bool:
        return not any(self.differing.values())

    def explain(self) -> str:
        """The differing rows kept in ``examples``, table by table."""
        lines = []
        for table, (columns, only_expected, only_observed) in self.examples.items():
            lines.append(f"{table} ({self.differing[table]} rows differ): {', '.join(columns)}")
            lines += [f"  uninterrupted only: {row}" for row in only_expected]
            lines += [f"  faulted only:       {row}" for row in only_observed]
        return "\n".join(lines)


def events_counted(config: Config) -> int:
    """Events counted by the finest tumbling windows (each event once)."""
    [row] = rows(config, "SELECT sum(event_count) AS n FROM window_aggregates FINAL WHERE window_kind = 'tumbling' "
                         "AND window_length_ms = (SELECT min(window_length_ms) FROM window_aggregates "
                         "WHERE window_kind = 'tumbling')")
    return int(row["n"])


def compare(reference: Config, faulted: Config, faults: int, events_sent: int, examples: int = 8) -> Comparison:
    expected, observed = results(reference), results(faulted)
    differing, shown = {}, {}
    for table in RESULT_QUERIES:
        only_expected = Counter(expected[table]) - Counter(observed[table])
        only_observed = Counter(observed[table]) - Counter(expected[table])
        differing[table] = sum(only_expected.values()) + sum(only_observed.values())
        if differing[table]:
            shown[table] = (result_columns(reference, table), sorted(only_expected)[:examples],
                            sorted(only_observed)[:examples])
    return Comparison(faults, events_sent, {t: len(expected[t]) for t in RESULT_QUERIES}, differing,
                      (events_counted(reference), events_counted(faulted)), examples=shown)


def workload(rng: random.Random, events: int = 600) -> list[tuple[str, bytes]]:
    """Metrics and logs of 8 devices and 20 users, 2 per second of event time, with late events, re-sent copies
    and malformed records, in arrival order."""
    records: list[tuple[str, bytes]] = []
    for i in range(events):
        at = T0 + i * 500 - (rng.randrange(60_000, 200_000) if rng.random() < 0.05 else 0)
        event = Event(at, float(rng.randrange(100)), device=f"d{i % 8}", user=f"u{rng.randrange(20)}",
                      level="error" if rng.random() < 0.1 else None, name="db" if i % 10 == 0 else "latency_ms")
        value = encode(event.envelope())
        records.append((event.device, value))
        if rng.random() < 0.05:                                               # a re-sent copy, a little later
            records.append((event.device, value))
        if rng.random() < 0.01:
            records.append((event.device, value[:-3]))
    return records


def two_runs(kafka: Config, name: str, records: list[tuple[str, bytes]], store: Config | None = None,
             ) -> tuple[Config, Config]:
    """Two stacks fed the same records: the uninterrupted reference, already run, and the one to fault (its
    store ``store``'s when given)."""
    reference = fresh_stack(kafka, f"{name}_reference", **SETTINGS)
    own = kafka if store is None else kafka.model_copy(
        update={"store": kafka.store.model_copy(update={"url": writer_url(store)})})
    faulted = fresh_stack(own, f"{name}_faulted", **SETTINGS)
    for config in (reference, faulted):
        send(config, records)
    return reference, faulted


def kill_the_job(kafka: Config, spark: Any, kills: int, events: int = 600, seed: int = 7,
                 name: str = "kills") -> Comparison:
    """The job runs as its own process and is SIGKILLed (whole process group) ``kills`` times, each at a random
    moment after it committed a new windows batch; then it runs to the end. Compared with a run never killed."""
    rng = random.Random(seed)
    records = workload(rng, events)
    reference, faulted = two_runs(kafka, name, records)
    run_job(spark, reference)
    commits = faulted.checkpoint_dir / "windows" / "commits"
    done = 0
    for _ in range(kills):
        before = len(list(commits.glob("[0-9]*")))
        job = subprocess.Popen([sys.executable, "-m", "analytics.job"], env={**os.environ, **to_environ(faulted)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_until(lambda b=before: len(list(commits.glob("[0-9]*"))) > b, timeout_s=180)
            time.sleep(rng.uniform(0.0, 3.0))                                 # a random moment mid-stream
        finally:
            running = job.poll() is None
            with contextlib.suppress(ProcessLookupError):                      # the group is gone if the job ended
                os.killpg(job.pid, signal.SIGKILL)                            # no shutdown hooks, no final commit
            killed = job.wait() == -signal.SIGKILL
        done += running and killed          # a fault only if the kill met the job running (not one that had ended)
    expected = results(reference)
    unfinished = results(faulted) != expected
    run_job(spark, faulted)                                                   # restart, run to the end
    comparison = compare(reference, faulted, done, len(records))
    comparison.extra["unfinished_before_the_last_restart"] = unfinished
    return comparison


def store_away(kafka: Config, spark: Any, store: Config, store_process: subprocess.Popen[bytes], outage_s: float,
               log_dir: Path, events: int = 600, seed: int = 3, name: str = "outage") -> Comparison:
    """The store process (``store_process``, serving ``store``) is stopped once the faulted job committed two
    windows batches, and started again (same port, same directory) ``outage_s`` later; meanwhile the job's
    writes wait and retry. Compared with an uninterrupted run. ``extra["waits"]``: the job's log lines."""
    import logging

    from store import server

    records = workload(random.Random(seed), events)
    reference, faulted = two_runs(kafka, name, records, store)
    run_job(spark, reference)
    done = threading.Event()

    def stop_then_restart() -> None:
        wait_until(lambda: (faulted.checkpoint_dir / "windows" / "commits" / "1").exists(), timeout_s=300)
        store_process.send_signal(signal.SIGTERM)                              # the store goes away mid-run
        store_process.wait(timeout=60)
        time.sleep(outage_s)
        with server.child(store, log=log_dir / "store-2.log"):                 # same port, same directory
            done.wait(timeout=900)

    waits: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "store unreachable" in record.getMessage():
                waits.append(record.getMessage())

    handler, sinks_log = Collect(logging.WARNING), logging.getLogger("analytics.sinks")
    outage = threading.Thread(target=stop_then_restart)
    sinks_log.addHandler(handler)
    outage.start()
    try:
        run_job(spark, faulted)
    finally:
        done.set()
        sinks_log.removeHandler(handler)
    outage.join(timeout=120)
    with server.child(store, log=log_dir / "store-3.log"):
        comparison = compare(reference, faulted, 1, len(records))
    comparison.extra["waits"] = waits
    return comparison


# The broker killed under the SDK and the gateway ----------------------------------------------------------------
@contextmanager
def killable_broker(kafka: Config, data_dir: Path) -> Iterator[Config]:
    """A broker of its own (own ports and data), so killing it leaves the session's broker serving."""
    config = kafka.model_copy(update={
        "paths": kafka.paths.model_copy(update={"data_dir": data_dir / "data"}),
        "kafka": kafka.kafka.model_copy(update={"port": free_port(), "controller_port": free_port()}),
        "gateway": kafka.gateway.model_copy(update={"tokens": [GATEWAY_TOKEN], "ack_timeout_s": 3.0}),
        "sdk": kafka.sdk.model_copy(update={"reconnect_probe_s": 0.3, "spool_dir": data_dir / "spool"}),
    })
    broker.start(config)
    try:
        yield config
    finally:
        broker.stop(config)


@dataclass
class ProducedOutcome:
    """What the clients were told was written, and what the job stored."""

    broker_kills: int
    sdk_events: int                    # events the SDK took (it promises each arrives)
    sdk_spooled: int
    sdk_dropped: int
    gateway_acknowledged: list[float]  # values of the events of batches answered 200
    gateway_answers: dict[int, int]    # HTTP status -> how many answers
    records_on_topic: int              # every copy written, retries and replays included
    accepted_ids: list[str]            # ids in the accepted-events log (what every window counted)
    stored: dict[str, tuple[int, float]]   # per series: events and sum of values over the 60 s tumbling windows
    stored_duplicates: int

    @property
    def lost(self) -> int:
        expected = {"sdk_seq": self.sdk_events, "gateway_seq": len(self.gateway_acknowledged)}
        return sum(max(0, n - self.stored.get(name, (0, 0.0))[0]) for name, n in expected.items())

    @property
    def double_counted(self) -> int:
        expected = {"sdk_seq": self.sdk_events, "gateway_seq": len(self.gateway_acknowledged)}
        return sum(max(0, self.stored.get(name, (0, 0.0))[0] - n) for name, n in expected.items()) \
            + len(self.accepted_ids) - len(set(self.accepted_ids))


def kill_the_broker(config: Config, spark: Any, sdk_events: int, gateway_batches: int, batch_size: int = 20,
                    kills: int = 1, down_s: float = 3.0) -> ProducedOutcome:
    """An SDK app (~2k events/s) and a gateway client (batches of ``batch_size``, each retried with the same ids
    until answered 200) produce while the broker is SIGKILLed ``kills`` times, each restarted ``down_s`` later.
    Then the job drains what was written."""
    sdk = Client("sdk-app", "phone-1", config=config)
    sdk_seq = sdk.gauge("sdk_seq")
    acknowledged: list[float] = []
    answers: Counter[int] = Counter()

    def sdk_app() -> None:
        for i in range(sdk_events):
            sdk_seq.set(float(i))
            if i % 100 == 0:
                time.sleep(0.05)

    def gateway_app(client: TestClient) -> None:
        for b in range(gateway_batches):
            values = [float(b * batch_size + j) for j in range(batch_size)]
            at = now_ms()
            batch = [metric_event(app="gateway-app", device="box-1", name="gateway_seq", value=v, event_time=at,
                                  sent_time=at, event_id=f"gw-{v:.0f}") for v in values]
            deadline = time.monotonic() + 120
            while True:                     # the same batch, same ids, until the gateway says it is written
                status = client.post("/v1/events", headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"},
                                     json=batch).status_code
                answers[status] += 1
                if status == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if status == 200:
                acknowledged.extend(values)
            time.sleep(0.02)

    assert sdk.flush(30)                    # the topic's leader is up before the stream starts
    with TestClient(create_app(config)) as gateway:
        producers = [threading.Thread(target=sdk_app), threading.Thread(target=gateway_app, args=(gateway,))]
        for p in producers:
            p.start()
        for _ in range(kills):
            time.sleep(1.0)
            pid = services.state(config, broker.SERVICE).pid
            assert pid is not None
            os.killpg(pid, signal.SIGKILL)                                    # no shutdown, no flush
            time.sleep(down_s)
            broker.start(config)
        for p in producers:
            p.join(timeout=600)
    assert sdk.flush(120)
    stats = sdk.stats()
    sdk.close()
    on_topic = len(broker.read_committed(config, timeout_s=60))
    run_job(spark, config)
    stored = {r["name"]: (r["n"], r["total"]) for r in rows(
        config, "SELECT name, sum(event_count) AS n, sum(sum) AS total FROM window_aggregates FINAL "
                "WHERE window_kind = 'tumbling' AND window_length_ms = 60000 GROUP BY name")}
    [dups] = rows(config, "SELECT count() AS n FROM duplicates FINAL")
    return ProducedOutcome(
        kills, sdk_events, stats.spooled, stats.dropped_oldest + stats.dropped_newest + stats.dropped_spool_full,
        acknowledged, dict(answers), on_topic,
        pq.read_table(config.accepted_events_dir, columns=["id"])["id"].to_pylist(), stored, dups["n"])


# The SDK's spool on a full disk ---------------------------------------------------------------------------------
@contextmanager
def size_limited_directory(parent: Path, size_bytes: int, mount: bool = True) -> Iterator[tuple[Path, int | None]]:
    """A directory where writing fails once ``size_bytes`` are used: a tmpfs of that size (this needs root, as the
    tests have here), unmounted afterwards. Where mounting is refused (or ``mount`` is False), the writing process
    must limit itself instead: the second value is then the ``RLIMIT_FSIZE`` it sets (a file's writes past it fail
    with ``EFBIG``, short first), so the scenario runs everywhere; otherwise None."""
    directory = parent / "size-limited"
    directory.mkdir(parents=True)
    mounted = mount and shutil.which("mount") is not None and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(directory)],
        capture_output=True).returncode == 0
    try:
        yield directory, None if mounted else size_bytes
    finally:
        if mounted and subprocess.run(["umount", str(directory)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(directory)], capture_output=True)    # still busy: detach it


def limit_file_size(limit: int | None) -> None:
    """In the process that writes to a ``size_limited_directory``: apply its file-size limit, if it has one."""
    if limit:
        import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a failed write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


_FULL_DISK_APP = """
import json, sys, time
from dataclasses import asdict
from eventide.config import load_config
from ingest.sdk import Client
from tests.support.fault_injection import limit_file_size
overrides, n, limit = json.loads(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
limit_file_size(limit)
events = Client("full-disk-app", "phone-3", config=load_config(environ={}, **overrides))
seq = events.gauge("seq")
for i in range(n):
    seq.set(i)
    if i % 250 == 249:
        time.sleep(0.02)        # batches of several sizes: some fit in what is left, some do not
flushed = events.flush(60)
events.close(10)
stats = events.stats()
print(json.dumps({"flushed": flushed, "dropped": stats.dropped, **asdict(stats)}), flush=True)
"""


@dataclass
class FullDiskOutcome:
    """An SDK app spooling to a full file system, then its spool replayed to a reachable broker."""

    how: str                      # "tmpfs" or "RLIMIT_FSIZE"
    recorded: int
    stats: dict[str, Any]         # the offline app's SdkStats when it closed
    segments: int
    torn_segments: int            # segments whose last byte is not a newline
    unparsable_lines: int
    spooled_values: list[float]   # the events in the spool, in file order
    replay_stats: dict[str, Any]
    delivered_values: list[float]  # the app's events on the topic after the replay, in order
    segments_left: int


def spool_on_a_full_disk(config: Config, parent: Path, events: int, size_bytes: int = 256 * 1024,
                         mount: bool = True) -> FullDiskOutcome:
    """An app records ``events`` gauge values with no broker reachable while its spool lies on a file system of
    ``size_bytes`` (``mount``: see ``size_limited_directory``); then a client of the same app and device, with the
    broker reachable, replays the spool. ``config``: a running broker and a fresh events topic."""
    from dataclasses import asdict

    with size_limited_directory(parent, size_bytes, mount) as (directory, limit):
        spool_dir = directory / "spool"
        offline = {"root": str(config.root),
                   "paths": {"data_dir": str(config.data_dir), "cache_dir": str(config.cache_dir)},
                   "kafka": {"bootstrap_servers": f"127.0.0.1:{free_port()}",       # nothing listens there
                             "events_topic": config.kafka.events_topic},
                   "sdk": {"reconnect_probe_s": 0.3, "health_interval_s": 0, "spool_dir": str(spool_dir)}}
        app = subprocess.run([sys.executable, "-c", _FULL_DISK_APP, json.dumps(offline), str(events),
                              json.dumps(limit)], cwd=Path(__file__).resolve().parents[2],
                             capture_output=True, text=True, timeout=300)
        assert app.returncode == 0, app.stderr[-3000:]
        stats = json.loads(app.stdout.strip().splitlines()[-1])

        segments = sorted(spool_dir.rglob("*.spool"))
        torn = unparsable = 0
        spooled: list[float] = []
        for segment in segments:
            data = segment.read_bytes()
            torn += bool(data) and not data.endswith(b"\n")
            for line in data.split(b"\n")[:-1]:
                try:
                    spooled.append(json.loads(line + b"}")["value"])
                except ValueError:
                    unparsable += 1

        back = config.model_copy(update={"sdk": config.sdk.model_copy(
            update={"spool_dir": spool_dir, "reconnect_probe_s": 0.3, "health_interval_s": 0})})
        replayer = Client("full-disk-app", "phone-3", config=back)
        try:
            assert replayer.flush(120), "the spool was not replayed"
        finally:
            replayer.close()
        replay_stats = asdict(replayer.stats())
        left = len(list(spool_dir.rglob("*.spool")))
    records = [json.loads(m.value()) for m in broker.read_committed(config, timeout_s=30)]
    delivered = [r["value"] for r in records if r.get("app") == "full-disk-app"]
    return FullDiskOutcome("tmpfs" if limit is None else "RLIMIT_FSIZE", events, stats, len(segments), torn,
                           unparsable, spooled, replay_stats, delivered, left)


# Alert webhooks that refuse, hang or reset --------------------------------------------------------------------
@dataclass(frozen=True)
class Received:
    """One request a :class:`WebhookReceiver` got."""

    at: float
    """``time.monotonic()`` when it arrived."""
    headers: dict[str, str]
    raw: bytes
    body: dict[str, Any] | None
    """The parsed body; None when it was not strict JSON (NaN, Infinity, invalid UTF-8)."""
    answer: str


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"not strict JSON: {name}")


class WebhookReceiver:
    """A real local webhook receiver (``http.server`` in a thread) that records every request and answers each as
    ``answer(body)`` says: ``"ok"`` (204), a status such as ``"400"`` or ``"503:2"`` (with ``Retry-After: 2``),
    ``"hang"`` (reads the request and never answers, until :meth:`close`) or ``"reset"`` (closes the connection
    with a TCP reset instead of answering). A body that is not strict JSON is answered 400."""

    def __init__(self, answer: Any = None) -> None:
        import contextlib
        import socket
        import struct
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.answer = answer or (lambda _body: "ok")
        self.received: list[Received] = []
        self.released = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body: dict[str, Any] | None
                try:
                    body = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
                    action = hook.answer(body)
                except ValueError:
                    body, action = None, "400"
                hook.received.append(Received(time.monotonic(), dict(self.headers.items()), raw, body, action))
                self.close_connection = True
                if action == "hang":
                    hook.released.wait(120)
                    return
                if action == "reset":       # SO_LINGER 0: close() sends RST, the client sees a reset connection
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    return
                status, _, retry_after = ("204" if action == "ok" else action).partition(":")
                self.send_response(int(status))
                if retry_after:
                    self.send_header("Retry-After", retry_after)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def finish(self) -> None:
                with contextlib.suppress(OSError):      # the connection was reset on purpose
                    super().finish()

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass                                     # resets and hangs are the point

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of(self, series: str) -> list[Received]:
        """Requests whose notification is about ``series``."""
        return [r for r in self.received if r.body is not None and r.body["series"] == series]

    def delivered(self) -> list[Received]:
        return [r for r in self.received if r.answer == "ok"]

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def store_transitions(config: Config, transitions: list[Any]) -> None:
    """Store ``alerting.state.Transition`` objects as the evaluator does (``alert_transitions``)."""
    from datetime import UTC, datetime

    from store.client import connect

    now = datetime.now(UTC)
    with connect(config) as client:
        client.insert("alert_transitions", [
            [t.key, t.rule, t.series, t.to, datetime.fromtimestamp(t.window_end_ms / 1000, UTC), t.value,
             t.threshold, t.severity, int(t.notify), now] for t in transitions],
            column_names=["transition_key", "rule", "series", "to_state", "window_end", "value", "threshold",
                          "severity", "notify", "recorded_at"])


def delivery_failures(config: Config) -> dict[str, tuple[str, int, int | None, float]]:
    """Failed deliveries by series: (reason, attempts, last HTTP status, ``failed_at`` as epoch seconds)."""
    from store.client import connect

    with connect(config) as client:
        rows = client.query("SELECT series, reason, attempts, last_status, toUnixTimestamp64Milli(failed_at) "
                            "FROM alert_delivery_failures FINAL").result_rows
    return {r[0]: (r[1], r[2], r[3], r[4] / 1000) for r in rows}


@dataclass
class WebhookFaultsOutcome:
    deadline_s: float
    bad: dict[str, str]
    """Series -> how the receiver treated its notification (400, hang, reset)."""
    delivered_after_s: dict[str, float]
    """Series of each later notification -> seconds from the start until the receiver had it."""
    failures: dict[str, tuple[str, int, int | None, float]]
    """Series -> (reason, attempts, last status, seconds from the start until the failure was recorded)."""
    requests: dict[str, int]
    """Series -> requests the receiver got for it."""


def webhook_faults(config: Config, later: int = 6, deadline_s: float = 1.5, timeout_s: float = 0.5,
                   attempts: int = 3, concurrency: int = 2) -> WebhookFaultsOutcome:
    """Given a receiver that answers 400 to one notification, hangs on another and resets the connection of a
    third (each the oldest of its series), and ``later`` notifications of other series stored after them, when the
    alerting service's delivery threads deliver them, then: how soon each later notification arrived and what was
    recorded for the three. ``config``: a migrated store; the webhook settings come from the arguments."""
    from alerting.delivery import Delivery
    from alerting.notify import WebhookChannel
    from alerting.state import Transition

    bad = {"refused": "400", "hung": "hang", "reset": "reset"}
    config = config.model_copy(update={"alerting": config.alerting.model_copy(update={
        "delivery_concurrency": concurrency, "delivery_deadline_s": deadline_s, "webhook_timeout_s": timeout_s})})
    window_end = now_ms() // 60_000 * 60_000
    transitions = [Transition("webhook faults", series, "firing", window_end - 60_000, 900.0, 500.0, "critical")
                   for series in bad]
    transitions += [Transition("webhook faults", f"later-{i}", "firing", window_end, 900.0, 500.0, "critical")
                    for i in range(later)]
    with WebhookReceiver(lambda body: bad.get(body["series"], "ok")) as receiver:
        channel = WebhookChannel(receiver.url, attempts, backoff_s=0.1, timeout_s=timeout_s, deadline_s=deadline_s)
        store_transitions(config, transitions)
        delivery = Delivery(config, [channel], refresh_every_s=0.5)
        started, wall = time.monotonic(), time.time()
        delivery.start()
        delivery.wake()
        try:
            wait_until(lambda: len(receiver.delivered()) >= later and len(delivery_failures(config)) >= len(bad),
                       timeout_s=4 * deadline_s + 10, interval_s=0.05)
        finally:
            delivery.stop()
        arrived = {r.body["series"]: r.at - started for r in receiver.delivered() if r.body is not None}
        requests = Counter(r.body["series"] for r in receiver.received if r.body is not None)
    failures = {s: (reason, n, status, at - wall) for s, (reason, n, status, at) in delivery_failures(config).items()}
    return WebhookFaultsOutcome(deadline_s, bad, arrived, failures, dict(requests))
