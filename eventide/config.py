"""The one typed configuration model shared by every component.

Loaded from one TOML file (``$EVENTIDE_CONFIG``, else ``./eventide.toml`` when present, else built-in defaults)
and then overridden by environment variables named ``EVENTIDE_<SECTION>__<FIELD>``, e.g.
``EVENTIDE_KAFKA__PORT=29092`` or ``EVENTIDE_STORE__URL=http://clickhouse:8123``. Override values are parsed as
JSON when they parse (numbers, lists, booleans) and taken as plain strings otherwise.

Relative paths are resolved against the directory of the config file (or the working directory when there is
no file), so a checkout is self-contained: broker data, chDB data, checkpoints and the jar cache live inside it.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tomllib
from ipaddress import ip_address
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "EVENTIDE_"
CONFIG_ENV = "EVENTIDE_CONFIG"
DEFAULT_CONFIG_FILE = "eventide.toml"
KNOWN_TOKENS = frozenset({"dev-token-change-me"})
"""Gateway tokens published with the project (eventide.toml's dev token): refused off loopback."""
MIN_TOKEN_LENGTH = 16
"""Shortest gateway token accepted off loopback."""
MIN_DASHBOARD_PASSWORD_LENGTH = 12
"""Shortest shared dashboard password accepted (``dashboard.sign_in = "password"``)."""


class ConfigError(ValueError):
    """A configuration problem; the message names the offending field."""


def _is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1); a name, ``0.0.0.0`` or ``""`` is not."""
    if host.lower() == "localhost":
        return True
    try:
        return ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PathsConfig(_Section):
    data_dir: Path = Path("var")
    """Broker logs, chDB data, Spark checkpoints, process logs and pid files."""
    cache_dir: Path = Path(".cache")
    """Downloaded jars (Kafka broker, Spark-Kafka connector). Safe to keep across clean clones."""


class MavenConfig(_Section):
    repository: str = "https://repo1.maven.org/maven2/"
    """Maven repository the broker and connector jars are resolved from (a mirror URL works too)."""
    token_provider_fallback: str = "4.2.0"
    """Version of spark-token-provider-kafka-0-10 used only if the one matching the connector is missing (a release
    of the same Spark line; the helper serves Kafka delegation tokens alone, which this project does not use)."""
    connector_fallback: str | None = "4.2.0"
    """Version of spark-sql-kafka-0-10 used only if the one matching pyspark is missing (an earlier patch release
    of the same Spark line: Maven Central as reachable here lacks 4.2.1)."""


class KafkaConfig(_Section):
    bootstrap_servers: str = ""
    """An existing cluster (production). Empty: the CLI manages a local single-node KRaft broker."""
    version: str = "4.1.2"
    scala_version: str = "2.13"
    host: str = "127.0.0.1"
    port: int = Field(19092, ge=1, le=65535)
    controller_port: int = Field(19093, ge=1, le=65535)
    heap: str = "512m"
    start_timeout_s: float = Field(90.0, gt=0)
    events_topic: str = "eventide.events"
    dead_letter_topic: str = "eventide.events.dead-letter"
    events_partitions: int = Field(4, ge=1)
    replication_factor: int = Field(1, ge=1)
    min_insync_replicas: int = Field(1, ge=1)
    """Topics' ``min.insync.replicas``: with ``acks=all`` a write succeeds once this many replicas have it."""
    events_retention_ms: int = Field(7 * 24 * 3600 * 1000, ge=-1)
    dead_letter_retention_ms: int = Field(14 * 24 * 3600 * 1000, ge=-1)
    max_message_bytes: int = Field(1024 * 1024, ge=1024)
    """Broker-side limit; larger than the envelope limit so oversize records reach the job and are dead-lettered."""

    @property
    def bootstrap(self) -> str:
        return self.bootstrap_servers or f"{self.host}:{self.port}"

    @property
    def dead_letter_max_message_bytes(self) -> int:
        """The dead-letter topic's largest message, and so its producers' limit: twice ``max_message_bytes``, so that
        any record the events topic took fits whole, with its reason and source headers."""
        return 2 * self.max_message_bytes

    @property
    def managed(self) -> bool:
        """True when the project runs its own local broker."""
        return not self.bootstrap_servers

    @model_validator(mode="after")
    def _isr_within_replicas(self) -> KafkaConfig:
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(f"min_insync_replicas ({self.min_insync_replicas}) must not exceed "
                             f"replication_factor ({self.replication_factor})")
        return self


class StoreConfig(_Section):
    url: str = ""
    """A ClickHouse server, ``http(s)://user:pass@host:port``. Empty: the embedded store, a chDB directory
    (``<data_dir>/clickhouse``) served by ``eventide store serve`` at ``http://host:port``. Every component talks
    to either through clickhouse-connect's HTTP client (docs/architecture.md, "Store access")."""
    host: str = "127.0.0.1"
    """Embedded store only: where ``eventide store serve`` listens (keep it on loopback)."""
    port: int = Field(18123, ge=1, le=65535)
    """Embedded store only: its HTTP port."""
    password: str = ""
    """Password of the store's ``default`` (writer) user (``EVENTIDE_STORE__PASSWORD``): for a server URL without
    one in it. Embedded store: empty means the password generated on first start into
    ``<data_dir>/store-credentials.json`` (mode 0600, read by every local component); set, it replaces that one."""
    reader_user: str = "reader"
    """The read-only user the dashboard and the alert evaluator connect as (ClickHouse ``readonly=2``: reads only,
    settings changeable within the caps below)."""
    reader_password: str = ""
    """Its password (``EVENTIDE_STORE__READER_PASSWORD``). Embedded store: empty means the generated one. Server
    URL: empty means the dashboard and evaluator use the writer's credentials (a warning is logged)."""
    database: str = "eventide"
    max_query_size: int = Field(256 * 1024, ge=1024)
    """Embedded store: longest statement text in bytes (ClickHouse's ``max_query_size``); longer: 413. An insert's
    data after ``FORMAT <name>`` does not count."""
    max_insert_bytes: int = Field(1024**3, ge=1024)
    """Embedded store: largest request body after decompression (an insert's data); larger: 413. The body is
    streamed to a temporary file beside the data directory, never held whole in memory."""
    http_max_field_value_size: int = Field(128 * 1024, ge=4096)
    """Embedded store: largest request head (request line with its URL parameters, and all headers); larger: 431."""
    max_connections: int = Field(1024, ge=4)
    """Embedded store: open client connections at most; one over it is closed at once (ClickHouse's
    ``max_connections``)."""
    max_concurrent_queries: int = Field(32, ge=1)
    """Embedded store: queries running at once at most (each on a thread of its own); one over it is answered 503
    TOO_MANY_SIMULTANEOUS_QUERIES at once (ClickHouse's ``max_concurrent_queries``)."""
    max_concurrent_queries_for_user: int = Field(16, ge=1)
    """Embedded store: queries of one user (the writer, or the reader) at once at most, counted from the start of a
    query until its answer is sent (as ClickHouse counts them); one over it is answered 503
    TOO_MANY_SIMULTANEOUS_QUERIES at once (ClickHouse's ``max_concurrent_queries_for_user``). Each user's queries
    run on threads of their own, this many. At most half of ``max_concurrent_queries``, neither user can keep the
    other from running queries."""
    max_unsent_answer_bytes_for_user: int = Field(8 * 1024**2, ge=0)
    """Embedded store: bytes of one user's answers held in memory, computed but not yet sent, at most. A new query
    of a user already over it is answered 503 at once; an answer that would take it over is dropped (503), unless it
    is the user's only one (an answer up to ``max_result_bytes`` can always be sent)."""
    http_send_timeout_s: float = Field(30.0, gt=0)
    """Embedded store: an answer must be sent whole within this long once it is ready (ClickHouse's
    ``http_send_timeout``); from a client that reads it slower, or not at all, the connection is closed and the
    answer dropped."""
    http_headers_timeout_s: float = Field(5.0, gt=0)
    """Embedded store: a request's head (request line and headers) must arrive whole within this long."""
    http_receive_timeout_s: float = Field(300.0, gt=0)
    """Embedded store: a request's body must arrive whole within this long from its start; else 408."""
    keep_alive_timeout_s: float = Field(10.0, gt=0)
    """Embedded store: an idle client connection is closed after this long (ClickHouse's ``keep_alive_timeout``)."""
    max_execution_time: float = Field(600.0, gt=0)
    """Embedded store: every query's ``max_execution_time`` in seconds, a cap a client cannot raise."""
    max_memory_usage: int = Field(4 * 1024**3, gt=0)
    """Embedded store: every query's ``max_memory_usage`` in bytes, a cap a client cannot raise."""
    max_result_bytes: int = Field(512 * 1024**2, gt=0)
    """Embedded store: every query's ``max_result_bytes`` (``result_overflow_mode = 'throw'``), a cap a client
    cannot raise: results are built whole in memory before they are sent."""
    start_timeout_s: float = Field(60.0, gt=0)
    """How long ``stack up`` waits for the embedded store to answer."""
    write_retry_s: float = Field(600.0, gt=0)
    """How long the stream job keeps retrying a micro-batch's writes while the store is unreachable."""

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if url.startswith("chdb:"):
            raise ValueError("chdb:// is no longer a store URL: leave url empty and the embedded chDB store is "
                             "served by `eventide store serve` (one process owns the directory)")
        if url and not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return url

    @property
    def embedded(self) -> bool:
        """True when the project serves its own chDB store (``eventide store serve``)."""
        return not self.url


class EnvelopeConfig(_Section):
    max_record_bytes: int = Field(64 * 1024, ge=256)


class HoppingWindow(_Section):
    length_s: int = Field(gt=0)
    hop_s: int = Field(gt=0)

    @model_validator(mode="after")
    def _hop_divides_length(self) -> HoppingWindow:
        if self.length_s % self.hop_s:
            raise ValueError(f"hop_s ({self.hop_s}) must divide length_s ({self.length_s})")
        return self


class SeriesSelector(_Section):
    """Selects series by app (``*`` = any), kind and name."""

    app: str = "*"
    kind: Literal["metric", "log"] = "metric"
    name: str = Field(min_length=1)


class StreamConfig(_Section):
    master: str = "local[*]"
    """``local[*]`` (the job's own process), or a cluster's master, e.g. ``spark://host:7077``: then start the job
    with ``eventide job --submit`` (spark-submit)."""
    driver_host: str = ""
    """On a cluster: the address executors reach the driver at (``spark.driver.host``). Empty: Spark's default."""
    driver_memory: str = "2g"
    shuffle_partitions: int | None = Field(None, ge=1)
    """State stores of each stateful query (Spark's shuffle partitions); a query's checkpoint fixes it when it is
    created. Unset: ``partitions`` below. On a cluster choose 2-3x the cores of the largest one you expect."""
    allowed_lateness_s: float = Field(30.0, ge=0)
    """Watermark delay D: watermark = max corrected_event_time of earlier batches - D."""
    tumbling_windows_s: list[int] = Field(default_factory=lambda: [10, 60])
    hopping_windows: list[HoppingWindow] = Field(default_factory=lambda: [HoppingWindow(length_s=300, hop_s=60)])
    sliding_window_s: int = Field(300, gt=0)
    """L of the trailing window (t_e - L, t_e] computed for every event of the sliding series."""
    sliding_log_levels: list[Literal["debug", "info", "warning", "error", "critical"]] = Field(
        default_factory=lambda: ["warning", "error", "critical"])
    """Log events at these levels get sliding windows (per app and logger), e.g. to spot error bursts."""
    sliding_series: list[SeriesSelector] = Field(default_factory=list)
    """Further series (typically metrics) that get sliding windows."""
    session_gap_s: int = Field(300, gt=0)
    """G: a session is a run of events of one (app, user) each less than G after the previous."""
    session_buckets: int = Field(64, ge=1)
    """Session keys (of every app) are spread over this many state rows (each with one timer) of the stateful query;
    fixed when its checkpoint is created (``analytics.keyed.layout``)."""
    session_memory_s: int = Field(86_400, ge=0)
    """How long an emitted session is remembered, so a late event that would join it is attributed to it."""
    series_tag_keys: list[str] = Field(default_factory=list)
    """Tag keys that, with (app, kind, name), identify a series."""
    deduplicate: bool = True
    """Drop re-sent copies of an event (same ``id``) before any window; off: every copy counts (at-least-once)."""
    dedup_horizon_s: float | None = Field(None, gt=0)
    """Duplicates (same ``id``) reaching the broker within this time of the first copy are dropped. Default:
    allowed lateness + the longest tumbling, hopping or sliding window or session gap (docs/time-semantics.md)."""
    accepted_retention_s: int = Field(3_600, gt=0)
    """Accepted-events files (the ``accept`` query's output) are deleted this long after their newest event reached
    the broker (by the wall clock), once every stateful query has read them and they are outside the dedup horizon
    of the newest batch (so a catch-up on an old backlog keeps what its duplicates are checked against)."""
    trigger_interval_s: float = Field(5.0, gt=0)
    """How often the windows and sessions queries take a batch: the accept batches of about this long, handed over
    together (a reader batch, ``analytics.reader_batches``); their watermark advances between these batches."""
    accept_interval_s: float | None = Field(None, gt=0)
    """How often the ``accept`` query reads Kafka: each of its batches makes its log lines searchable and its events
    counted. Default: ``trigger_interval_s`` (every accept batch is a reader batch of its own). Shorter makes log
    lines fresher at the cost of ``accept``'s fixed cost per batch. Never longer than ``trigger_interval_s`` (a
    longer value is taken as ``trigger_interval_s``)."""
    accept_busy_interval_s: float = Field(2.0, gt=0)
    """How often a live ``accept`` reads Kafka while the stream carries ``accept_busy_rate`` events a second or
    more (``analytics.accept.pacing``): each batch's fixed cost is paid less often where it competes with the
    events' own work, for log lines and window rows that move this often instead of every ``accept_interval_s``.
    At least ``accept_interval_s`` and at most ``trigger_interval_s``; equal to ``accept_interval_s``: every batch
    at ``accept_interval_s`` whatever the rate."""
    accept_busy_rate: float = Field(5_000, gt=0)
    """Events a second (a batch's records ÷ the time since the previous batch began) from which ``accept`` takes its
    batches every ``accept_busy_interval_s``."""
    provisional_windows: bool = True
    """While ``accept`` runs more often than the trigger (a live job), the tumbling and hopping rows each accept
    batch's events changed are written too, merged from its window partials into the stored rows
    (``analytics.windows.provisional``): a window's count, rate, percentiles and distinct counts move at
    ``accept_interval_s`` instead of ``trigger_interval_s``. The ``windows`` query's own rows replace them; what is
    final is unchanged."""
    provisional_sessions: bool = True
    """Likewise for sessions: while ``accept`` runs more often than the trigger, the sessions in progress of the
    session keys each accept batch touched are written too (``analytics.keyed.provisional``), so open sessions move at
    ``accept_interval_s``. The ``keyed_windows`` query's own rows replace them; what is final is unchanged."""
    accepted_poll_interval_s: float = Field(0.5, gt=0)
    """How often the windows and sessions queries look for a newly accepted batch. Kept well under
    ``trigger_interval_s`` so they start within this time of ``accept`` publishing a batch instead of at their next
    common trigger (a whole interval later); an idle poll lists the accepted-events directory (~20 ms).
    Never longer than ``trigger_interval_s``."""
    max_offsets_per_trigger: int = Field(500_000, ge=1)
    """Most Kafka records one ``accept`` micro-batch reads. With a processing-time trigger it also caps the rate the
    job can sustain, at this many records per ``trigger_interval_s`` (500k per 5 s: 100k ev/s); it binds only
    while catching up on a backlog, where larger batches spread each batch's fixed costs over more events. Each
    batch is read by one Spark task per Kafka partition, which holds up to ``task_memory_bytes`` of it."""
    task_memory_bytes: int = Field(256 * 1024 * 1024, ge=64 * 1024)
    """Valid records an ``accept`` task holds in memory for its Kafka partition's share of a batch; beyond it, it
    writes them to its local disk (the Python worker's temporary directory, ``TMPDIR``) and reads them back mapped,
    holding only their narrow columns (a few hundred bytes a record) and one slice of the rest at a time
    (docs/operations.md, "Memory per task"). Typical batches stay under it and never touch the disk."""
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    kll_k: int = Field(200, ge=8, le=65535)
    hll_lg_k: int = Field(12, ge=4, le=21)
    checkpoint_dir: Path | None = None
    """Default: <data_dir>/checkpoints."""

    @property
    def partitions(self) -> int:
        """``shuffle_partitions``, else one per core of a local master (``local[N]``: N; ``local[*]``: this
        machine's; ``local``: 1) and 4 on a cluster. Each partition's task pays fixed costs per micro-batch
        (a state store commit, a Python worker's setup in ``keyed_windows``), so on a small machine fewer are faster
        (docs/performance.md#batch-size-and-state-partitions)."""
        if self.shuffle_partitions is not None:
            return self.shuffle_partitions
        local = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", self.master)
        if local is None:
            return 4
        cores = local.group(1)
        if cores is None:
            return 1
        return (os.cpu_count() or 1) if cores == "*" else int(cores)

    @property
    def accept_interval(self) -> float:
        """Seconds between ``accept``'s batches: ``accept_interval_s``, never longer than ``trigger_interval_s`` (the
        windows take whole accept batches)."""
        if self.accept_interval_s is None:
            return self.trigger_interval_s
        return min(self.accept_interval_s, self.trigger_interval_s)

    @property
    def accept_busy_interval(self) -> float:
        """Seconds between a busy stream's ``accept`` batches: ``accept_busy_interval_s``, at least
        ``accept_interval`` and at most ``trigger_interval_s``."""
        return min(max(self.accept_busy_interval_s, self.accept_interval), self.trigger_interval_s)

    @property
    def dedup_horizon_ms(self) -> int:
        if self.dedup_horizon_s is not None:
            return int(self.dedup_horizon_s * 1000)
        longest = max(*self.tumbling_windows_s, *(w.length_s for w in self.hopping_windows),
                      self.sliding_window_s, self.session_gap_s)
        return int((self.allowed_lateness_s + longest) * 1000)

    @field_validator("tumbling_windows_s")
    @classmethod
    def _positive_unique(cls, lengths: list[int]) -> list[int]:
        if not lengths or any(n <= 0 for n in lengths) or len(set(lengths)) != len(lengths):
            raise ValueError("must be a non-empty list of distinct positive window lengths in seconds")
        return lengths

    @field_validator("hopping_windows")
    @classmethod
    def _distinct_hopping(cls, windows: list[HoppingWindow]) -> list[HoppingWindow]:
        if len({(w.length_s, w.hop_s) for w in windows}) != len(windows):
            raise ValueError("hopping windows must be distinct (length_s, hop_s) pairs")
        return windows


class SdkConfig(_Section):
    """The Python ingest SDK (``ingest.sdk.Client``): buffer, overflow policy, sender, offline spool."""

    buffer_capacity: int = Field(100_000, ge=1)
    """Events held in memory between the application's calls and the background sender."""
    overflow_policy: Literal["block", "drop_oldest", "drop_newest"] = "drop_oldest"
    """When the buffer is full: wait for space (backpressure), evict the oldest event, or refuse the new one."""
    batch_size: int = Field(10_000, ge=1)
    """Most events the sender takes from the buffer per round."""
    linger_ms: int = Field(20, ge=0)
    """How long the sender (and the Kafka producer) wait to fill a batch."""
    compression: Literal["lz4", "zstd", "gzip", "snappy", "none"] = "lz4"
    delivery_timeout_s: float = Field(120.0, gt=0)
    """An event Kafka has not acknowledged within this time is moved to the spool."""
    reconnect_probe_s: float = Field(1.0, gt=0)
    """While offline, how often the sender checks whether the broker is back."""
    spool_dir: Path | None = None
    """Offline spool (one subdirectory per app and device). Default: <data_dir>/spool."""
    spool_max_bytes: int = Field(256 * 1024 * 1024, ge=4096)
    """Disk the spool may use; events that do not fit are dropped and counted."""
    spool_segment_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    health_interval_s: float = Field(10.0, ge=0)
    """How often the SDK emits its own health metrics (``eventide.sdk.*``); 0 turns them off."""


class GatewayToken(_Section):
    """One bearer token of ``gateway.tokens`` with what it may do: a TOML table
    ``{ token = "...", apps = ["checkout"], rate = 5000, burst = 10000 }``. A plain string in the list is a token
    with no app scope and no rate limit (the local/dev form)."""

    token: str = Field(min_length=1)
    apps: list[str] | None = None
    """The apps (envelope ``app``) this token may write; an event of another app is rejected. Absent: any app."""
    rate: float | None = Field(None, gt=0)
    """Events per second this token may send, on average (a token bucket); over it the gateway answers 429 with
    ``Retry-After``. Absent: no limit."""
    burst: int | None = Field(None, ge=1)
    """Events the token may send at once (the bucket's size): a batch of more events is refused (413). Default:
    one second's worth of ``rate``. Only with ``rate``."""

    @field_validator("apps")
    @classmethod
    def _apps_named(cls, apps: list[str] | None) -> list[str] | None:
        if apps is not None and (not apps or any(not app for app in apps)):
            raise ValueError("must list at least one non-empty app name (leave it out to allow every app)")
        return apps

    @model_validator(mode="after")
    def _burst_with_rate(self) -> GatewayToken:
        if self.burst is not None and self.rate is None:
            raise ValueError("burst needs a rate (events per second)")
        return self

    @property
    def bucket_size(self) -> int | None:
        """Events the token may send at once: ``burst``, else one second of ``rate``; None without a rate."""
        if self.rate is None:
            return None
        return self.burst if self.burst is not None else max(1, math.ceil(self.rate))


class GatewayConfig(_Section):
    """The HTTP gateway (``POST /v1/events``) for apps that cannot use the Python SDK."""

    host: str = "127.0.0.1"
    port: int = Field(8088, ge=1, le=65535)
    tokens: list[GatewayToken] = Field(default_factory=list)
    """Accepted bearer tokens: plain strings (any app, no rate limit: the local/dev form) or tables with an app
    scope and a rate limit (``GatewayToken``). The gateway does not start without at least one."""
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    max_batch_events: int = Field(5_000, ge=1)
    max_depth: int = Field(32, ge=2, le=256)
    """Deepest nesting of arrays and objects in one event (the envelope itself is 2: an object holding ``tags``);
    a deeper event is rejected without being parsed, so a nesting bomb costs neither stack nor time."""
    ack_timeout_s: float = Field(10.0, gt=0)
    """Longest wait for Kafka to acknowledge a batch before answering 503."""
    producers: int = Field(4, ge=1)
    """Transactional Kafka producers, i.e. batches written concurrently."""
    header_timeout_s: float = Field(10.0, gt=0)
    """Longest time from a connection (or the end of its previous response) to the end of a request's headers;
    then the gateway answers 408 and closes the connection (slow or silent clients hold no connection)."""
    receive_timeout_s: float = Field(30.0, gt=0)
    """Longest time to receive a request's whole body once its headers are in; then 408 and the connection closed."""
    keep_alive_s: float = Field(5.0, gt=0)
    """How long an idle keep-alive connection stays open between requests."""
    max_connections: int = Field(1024, ge=4)
    """Open client connections at most; one over it is closed at once (slow clients are also bounded by the
    timeouts above)."""

    @field_validator("tokens", mode="before")
    @classmethod
    def _plain_tokens(cls, tokens: Any) -> Any:
        # A plain string is the table form with nothing but the token.
        if isinstance(tokens, list):
            return [{"token": t} if isinstance(t, str) else t for t in tokens]
        return tokens

    @field_validator("tokens")
    @classmethod
    def _distinct_tokens(cls, tokens: list[GatewayToken]) -> list[GatewayToken]:
        seen: set[str] = set()
        for i, entry in enumerate(tokens):
            if entry.token in seen:
                raise ValueError(f"entry {i}: the same token is listed twice (one token, one scope and rate)")
            seen.add(entry.token)
        return tokens


class OtlpConfig(_Section):
    """OpenTelemetry OTLP/HTTP on the gateway (``POST /v1/logs``, ``POST /v1/metrics``): how OTLP records become v1
    envelopes (docs/ingest.md, "OpenTelemetry (OTLP/HTTP)")."""

    port: int = Field(4318, ge=0, le=65535)
    """A second port the gateway serves on (same host, same routes and tokens): OTLP/HTTP's standard port, where
    every OpenTelemetry SDK sends by default, so ``OTEL_EXPORTER_OTLP_ENDPOINT=http://<host>:4318`` is all an app
    needs. 0: only ``gateway.port``."""
    user_attribute: str = "enduser.id"
    """The record (else resource) attribute whose value becomes the envelope's ``user``."""
    default_device: str = "unknown"
    """``device`` of records whose resource has neither ``host.name`` nor ``service.instance.id``."""
    max_series_per_app: int = Field(10_000, ge=1)
    """Distinct metric series (name + point attributes) an app may have live; data points of further series are
    rejected (partial success) and counted."""
    series_ttl_s: float = Field(3_600.0, gt=0)
    """A series without a point for this long no longer counts against ``max_series_per_app``."""
    max_cumulative_series: int = Field(200_000, ge=1)
    """Cumulative series whose last point the gateway keeps to turn the next one into a delta (least recently
    seen forgotten first; a forgotten series' next point is a new baseline)."""
    histogram_max_events: int = Field(128, ge=1)
    """Most sample events one histogram data point becomes (its bucket counts scaled down beyond this)."""
    clock_window_s: float = Field(600.0, gt=0)
    """A device's clock offset is the smallest (receive time - latest record time) of its requests in this period."""
    clock_threshold_ms: int = Field(2_000, ge=0)
    """Offsets smaller than this (in magnitude) are taken as 0: export batching delays records by about this much."""
    max_devices: int = Field(100_000, ge=1)
    """Clock offset estimates the gateway keeps, one per resource (least recently seen forgotten first)."""
    max_future_s: float = Field(300.0, ge=0)
    """A record more than this ahead of its request's (clock-corrected) send time is rejected."""
    max_age_s: float = Field(7 * 86_400.0, gt=0)
    """A record whose corrected time is more than this before the gateway received it is rejected."""
    max_clock_offset_s: float = Field(86_400.0, gt=0)
    """A request whose latest record time is further than this from its receive time (either way) gives no clock
    offset estimate: its records are judged by the device's estimate so far, so one record dated far off can
    neither move a device's correction nor get its own time accepted."""
    max_records_per_request: int = Field(10_000, ge=1)
    """Log records or data points in one request at most; more: 413, nothing mapped. As many as
    ``max_series_per_app``, so an SDK's export of every live series of an app fits (SDKs export them all at once;
    log batches are 512 records)."""
    max_envelopes_per_request: int = Field(50_000, ge=1)
    """Events one request may become at most, bounded before mapping (a histogram point becomes up to
    ``histogram_max_events`` + 2); more: 413, nothing mapped. About 380 fully sampled histogram points."""
    min_request_cost: int = Field(1, ge=1)
    """What a request takes from its token's rate limit at least, one without records too. Otherwise each record
    takes the events it becomes, at least one."""


def http_url(url: str) -> str:
    """``url`` if a webhook may POST to it; raises ValueError saying why not."""
    # The URL goes into the request line as it is: printable ASCII only, so no request can be malformed by it.
    if not url.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    if any(not (32 < ord(c) < 127) for c in url):
        raise ValueError("must be printable ASCII without spaces (percent-encode other characters)")
    return url


class AlertingConfig(_Section):
    """The alert evaluator: rules file, schedule and where notifications go."""

    rules_file: Path = Path("alerts.toml")
    """TOML file of ``[[rule]]`` tables (see ``alerting/rules.py``); relative to the config file."""
    evaluation_interval_s: float = Field(15.0, gt=0)
    webhook_url: str = ""
    """POSTed a JSON body per firing/resolved transition; empty: no webhook."""
    webhook_attempts: int = Field(5, ge=1)
    """Attempts per notification and channel (webhook and Kafka) before it is recorded as a failed delivery."""
    webhook_backoff_s: float = Field(1.0, gt=0)
    """First retry delay; doubles on each further attempt (a longer ``Retry-After`` answer wins)."""
    webhook_timeout_s: float = Field(5.0, gt=0)
    """Longest wait for one attempt (connect, send, answer); then the attempt counts as failed and is retried."""
    delivery_deadline_s: float = Field(120.0, gt=0)
    """Longest time one notification is tried, from its first attempt: past it, it is recorded as failed and the
    channel goes on. Each notification has its own attempts and deadline."""
    delivery_concurrency: int = Field(4, ge=1, le=64)
    """Notifications a channel sends at once, so one that hangs does not hold up the others."""
    alerts_topic: str = "eventide.alerts"
    """Kafka topic that receives every firing/resolved transition (key: rule name)."""
    api_host: str = "127.0.0.1"
    api_port: int = Field(0, ge=0, le=65535)
    """Port of the silences API (Alertmanager's ``/api/v2/silences``, ``alerting/api.py``); 0: not served."""
    api_tokens: list[str] = Field(default_factory=list)
    """Bearer tokens the silences API accepts (at least 16 characters each); needed when ``api_port`` is set."""
    api_request_timeout_s: float = Field(10.0, gt=0)
    """Longest time the silences API waits for a request's headers, and then again for its body: a client that
    sends nothing or trickles it gets 408 and is disconnected, holding no connection for longer."""
    api_max_connections: int = Field(64, ge=4)
    """Open connections to the silences API at most (its users are a few people and the dashboard); one more is
    closed at once."""

    @field_validator("api_tokens")
    @classmethod
    def _api_tokens(cls, tokens: list[str]) -> list[str]:
        short = [i for i, t in enumerate(tokens) if len(t) < 16]
        if short:
            raise ValueError(f"entry {short[0]}: a token of at least 16 characters (e.g. `openssl rand -hex 24`)")
        return tokens

    @model_validator(mode="after")
    def _api_needs_tokens(self) -> AlertingConfig:
        if self.api_port and not self.api_tokens:
            raise ValueError("api_port is set but api_tokens is empty: the silences API would refuse everyone")
        return self

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, url: str) -> str:
        return http_url(url) if url else url


class DashboardConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8501, ge=1, le=65535)
    public_url: str = ""
    """Where users reach the dashboard (e.g. ``https://metrics.example.com``), for links in alert notifications;
    empty: ``http://<host>:<port>``."""
    refresh_s: float = Field(2.0, gt=0)
    """How often a page's charts refresh in place (a Streamlit fragment), until the sidebar's "Refresh every"
    picks another interval for the session."""
    stale_after_triggers: int = Field(3, ge=1)
    """A page's "data as of" line turns into a stale warning once the newest batch of the queries it reads is older
    than this many ``stream.trigger_interval_s``."""
    default_range_minutes: int = Field(15, ge=1)
    log_lines_per_page: int = Field(100, ge=1, le=10_000)
    """Logs page: the lines a search shows first (newest first), and how many more each "Load more" adds."""
    log_lines_max: int = Field(1_000, ge=1, le=100_000)
    """Logs page: the most lines "Load more" goes to; past it, narrow the search (time, app, level, words)."""
    log_count_max: int = Field(10_000, ge=1)
    """Logs page: matching lines are counted up to this many, then shown as "more than N" (an exact count of a
    common word over a day reads every matching granule; a capped one stops there)."""
    log_pattern_lines: int = Field(250_000, ge=1)
    """Logs page: the patterns view masks at most about this many lines, the newest (one regular expression pass
    each); a busier range shows the patterns of its newest minutes and says since when."""
    sign_in: Literal["none", "password", "oidc"] = "none"
    """Who may open the dashboard (docs/dashboard.md, "Sign-in"). ``none``: whoever reaches the port, so only on
    loopback: off loopback the dashboard refuses to start. ``password``: one shared ``password``, for a laptop or a
    small team. ``oidc``: OpenID Connect through Streamlit's ``st.login`` (the ``oidc_*`` fields), optionally limited
    to ``allowed_emails`` / ``allowed_domains``."""
    password: str = ""
    """``sign_in = "password"``: the shared password, at least ``MIN_DASHBOARD_PASSWORD_LENGTH`` characters. A
    secret: set ``EVENTIDE_DASHBOARD__PASSWORD``, never a committed file."""
    password_max_failures: int = Field(5, ge=1)
    """Wrong passwords one client address may try per ``password_failure_window_s``; past it every try from that
    address is refused unchecked until its oldest failure leaves the window."""
    password_failure_window_s: float = Field(300.0, gt=0)
    oidc_server_metadata_url: str = ""
    """``sign_in = "oidc"``: the provider's discovery document, ``<issuer>/.well-known/openid-configuration``;
    https, or http on loopback only (the keys that sign the identity come from it)."""
    oidc_client_id: str = ""
    """The dashboard's client id at the provider."""
    oidc_client_secret: str = ""
    """Its client secret. A secret: set ``EVENTIDE_DASHBOARD__OIDC_CLIENT_SECRET``, never a committed file."""
    oidc_redirect_uri: str = ""
    """The dashboard's public URL + ``/oauth2callback``, as registered with the provider. Empty:
    ``http://<host>:<port>/oauth2callback``, which is right on loopback only (off loopback it must be set)."""
    oidc_cookie_secret: str = ""
    """Signs the cookie that keeps a user signed in (30 days, Streamlit's). Empty: generated on first start into
    ``<data_dir>/dashboard/cookie-secret`` (mode 0600) and kept, so a restart signs nobody out."""
    oidc_prompt: str = "select_account"
    """The authorization request's ``prompt`` (Streamlit's default ``select_account``; some providers support only
    ``login``, ``consent`` or ``none``)."""
    allowed_emails: list[str] = Field(default_factory=list)
    """``sign_in = "oidc"``: signed-in users whose email is one of these may see the pages (any case). With
    ``allowed_domains`` also empty, every user the provider signs in for this client may."""
    allowed_domains: list[str] = Field(default_factory=list)
    """... or whose email's domain is exactly one of these (``example.com`` admits ``a@example.com``, not
    ``a@eu.example.com``). An email the provider marks unverified (``email_verified = false``) is never admitted."""

    @field_validator("allowed_emails")
    @classmethod
    def _emails_lower_case(cls, emails: list[str]) -> list[str]:
        return [email.strip().lower() for email in emails]

    @field_validator("allowed_domains")
    @classmethod
    def _domains_lower_case(cls, domains: list[str]) -> list[str]:
        return [domain.strip().lower().removeprefix("@") for domain in domains]

    @property
    def oidc_callback_url(self) -> str:
        """Where the provider sends a user back: ``oidc_redirect_uri``, or this server's own address."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return self.oidc_redirect_uri or f"http://{host}:{self.port}/oauth2callback"


MAX_RETENTION_DAYS = 3650
"""Ten years: the longest TTL of a table."""


class RetentionConfig(_Section):
    """How long the store keeps each family of tables: a ClickHouse TTL per table (``store.migrations`` sets it
    from these values on every migration run, so a changed value takes effect at the next start). Days; fractions
    allowed. Rows older than this (by the table's time column, e.g. ``window_start``) are deleted in merges.
    At most ``MAX_RETENTION_DAYS``: a TTL that ends past 2106 overflows ClickHouse's ``DateTime`` and wraps into the
    past, which would delete every row at once."""

    window_results_days: float = Field(90.0, gt=0, le=MAX_RETENTION_DAYS)
    """Tumbling and hopping window results and their corrections (``window_aggregates``, ``corrections``)."""
    keyed_windows_days: float = Field(30.0, gt=0, le=MAX_RETENTION_DAYS)
    """Sliding windows and sessions (``sliding_windows``, ``sessions``, ``open_sessions`` counted from when written)."""
    rejected_days: float = Field(30.0, gt=0, le=MAX_RETENTION_DAYS)
    """Dropped stragglers, duplicates and dead letters (``stragglers``, ``duplicates``, ``dead_letters``)."""
    progress_days: float = Field(30.0, gt=0, le=MAX_RETENTION_DAYS)
    """The job's per-batch progress and dedup state (``pipeline_progress``, ``dedup_state``). The newest watermark
    of each query (``query_watermarks_kept``, one row per query) is kept whatever this says."""
    alerts_days: float = Field(90.0, gt=0, le=MAX_RETENTION_DAYS)
    """Alert states, transitions, notifications and failed deliveries (``alert_states``, ``alert_transitions``,
    ``alert_notifications``, ``alert_delivery_failures``, ``alert_group_notifications``; silences counted from their
    end, ``alert_silences``)."""
    clocks_days: float = Field(30.0, gt=0, le=MAX_RETENTION_DAYS)
    """Device clock offsets (``device_clocks``, ``device_clocks_per_minute``)."""
    logs_days: float = Field(7.0, gt=0, le=MAX_RETENTION_DAYS)
    """Log lines (``logs``): usually the largest table, so the shortest default."""

    @property
    def shortest_days(self) -> float:
        """The shortest retention of any family: the longest range a dashboard page can show whole."""
        return min(self.model_dump().values())


class DemoConfig(_Section):
    events_per_second: float = Field(200.0, gt=0)
    apps: list[str] = Field(default_factory=lambda: ["checkout", "search", "mobile"])
    devices_per_app: int = Field(5, ge=1)
    users: int = Field(300, ge=1)
    active_users_per_minute: int = Field(30, ge=1)
    """Each minute another block of this many users sends, so sessions begin and end."""
    skewed_device_fraction: float = Field(0.2, ge=0, le=1)
    max_clock_skew_s: float = Field(3600.0, ge=0)
    late_event_fraction: float = Field(0.02, ge=0, le=1)
    max_lateness_s: float = Field(120.0, ge=0)
    malformed_fraction: float = Field(0.002, ge=0, le=1)
    duplicate_fraction: float = Field(0.002, ge=0, le=1)
    """Events sent twice (same id), as by a client retrying: the job counts them once."""
    error_burst_every_s: int = Field(300, ge=0)
    """Every this many seconds (on the clock's grid, so a burst fills whole minutes) the first app logs a burst of
    "payment declined" errors, which the demo's rule on log lines fires on. 0: no bursts."""
    error_burst_s: int = Field(60, ge=1)
    error_burst_lines_per_s: float = Field(2.0, gt=0)


class ClusterConfig(_Section):
    """``eventide cluster up``: a Spark standalone cluster and a multi-broker KRaft Kafka cluster on this machine
    (loopback), for running the job the way it runs in production (``eventide cluster submit``)."""

    host: str = "127.0.0.1"
    kafka_ports: list[int] = Field(default_factory=lambda: [19192, 19193, 19194])
    """One client listener per broker; the number of brokers is the length of this list."""
    kafka_controller_ports: list[int] = Field(default_factory=lambda: [19195, 19196, 19197])
    """One KRaft controller listener per broker (every broker is also a controller voter)."""
    replication_factor: int = Field(3, ge=1)
    """Replicas of every topic (and of Kafka's own offsets and transaction topics) on the cluster."""
    min_insync_replicas: int = Field(2, ge=1)
    """With ``acks=all``, writes go on while this many replicas are in sync: one broker may be lost."""
    spark_master_port: int = Field(17077, ge=1, le=65535)
    spark_master_webui_port: int = Field(18080, ge=1, le=65535)
    """The master's web UI; ``/json/`` there is how ``cluster status`` counts live workers."""
    spark_worker_webui_ports: list[int] = Field(default_factory=lambda: [18081, 18082])
    """One web UI port per worker; the number of workers is the length of this list."""
    spark_worker_cores: int = Field(1, ge=1)
    spark_worker_memory: str = "1g"
    """Memory a worker offers to executors (at least ``executor_memory``)."""
    spark_daemon_memory: str = "256m"
    """Heap of the master and worker daemons themselves (Spark's default, 1g, is sized for big clusters)."""
    executor_memory: str = "1g"
    executor_cores: int = Field(1, ge=1)
    executor_python: Path | None = None
    """Interpreter of the executors' Python workers; it needs this project's dependencies (pandas, pyarrow,
    datasketches). Default: the interpreter running ``eventide`` (the project's ``.venv/bin/python``)."""
    start_timeout_s: float = Field(90.0, gt=0)
    """How long ``cluster up`` waits for every broker and every worker to be up."""

    @model_validator(mode="after")
    def _consistent(self) -> ClusterConfig:
        if len(self.kafka_ports) != len(self.kafka_controller_ports):
            raise ValueError("kafka_ports and kafka_controller_ports need one entry per broker each")
        if self.replication_factor > len(self.kafka_ports):
            raise ValueError(f"replication_factor ({self.replication_factor}) exceeds the number of brokers "
                             f"({len(self.kafka_ports)})")
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(f"min_insync_replicas ({self.min_insync_replicas}) must not exceed "
                             f"replication_factor ({self.replication_factor})")
        if not self.spark_worker_webui_ports:
            raise ValueError("spark_worker_webui_ports: at least one worker")
        ports = [*self.kafka_ports, *self.kafka_controller_ports, self.spark_master_port,
                 self.spark_master_webui_port, *self.spark_worker_webui_ports]
        if len(set(ports)) != len(ports):
            raise ValueError(f"every cluster port must differ: {ports}")
        return self

    @property
    def kafka_bootstrap(self) -> str:
        return ",".join(f"{self.host}:{port}" for port in self.kafka_ports)

    @property
    def spark_master_url(self) -> str:
        return f"spark://{self.host}:{self.spark_master_port}"


class Config(_Section):
    """Everything every component needs to know. Build with :func:`load_config`."""

    root: Path = Path(".")
    """Directory relative paths are resolved against (the config file's directory)."""
    paths: PathsConfig = PathsConfig()
    maven: MavenConfig = MavenConfig()
    kafka: KafkaConfig = KafkaConfig()
    store: StoreConfig = StoreConfig()
    envelope: EnvelopeConfig = EnvelopeConfig()
    stream: StreamConfig = StreamConfig()
    sdk: SdkConfig = SdkConfig()
    gateway: GatewayConfig = GatewayConfig()
    otlp: OtlpConfig = OtlpConfig()
    alerting: AlertingConfig = AlertingConfig()
    dashboard: DashboardConfig = DashboardConfig()
    retention: RetentionConfig = RetentionConfig()
    demo: DemoConfig = DemoConfig()
    cluster: ClusterConfig = ClusterConfig()

    @model_validator(mode="after")
    def _distinct_ports(self) -> Config:
        ports = {"dashboard.port": self.dashboard.port, "gateway.port": self.gateway.port}
        if self.kafka.managed:
            ports |= {"kafka.port": self.kafka.port, "kafka.controller_port": self.kafka.controller_port}
        if self.store.embedded:
            ports["store.port"] = self.store.port
        c = self.cluster   # `cluster up` may run beside the local stack
        ports |= {f"cluster.kafka_ports.{i}": p for i, p in enumerate(c.kafka_ports)}
        ports |= {f"cluster.kafka_controller_ports.{i}": p for i, p in enumerate(c.kafka_controller_ports)}
        ports |= {"cluster.spark_master_port": c.spark_master_port,
                  "cluster.spark_master_webui_port": c.spark_master_webui_port}
        ports |= {f"cluster.spark_worker_webui_ports.{i}": p for i, p in enumerate(c.spark_worker_webui_ports)}
        seen: dict[int, str] = {}
        for field, port in ports.items():
            if port in seen:
                raise ValueError(f"{seen[port]} and {field} must differ (both {port})")
            seen[port] = field
        return self

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Config:
        """Settings that are fine on a laptop but unsafe where others can connect stop startup, naming the field:
        a known or short gateway token off loopback, a store reachable off loopback without a password, and a
        dedup horizon longer than the accepted-events files that hold its memory."""
        if not _is_loopback(self.gateway.host):
            for i, entry in enumerate(self.gateway.tokens):
                token = entry if isinstance(entry, str) else str(getattr(entry, "token", ""))
                if token in KNOWN_TOKENS or len(token) < MIN_TOKEN_LENGTH:
                    raise ValueError(
                        f"gateway.tokens.{i}: the gateway listens on {self.gateway.host} (gateway.host, not "
                        f"loopback), so its tokens must be secret: not a known default and at least "
                        f"{MIN_TOKEN_LENGTH} characters (set EVENTIDE_GATEWAY__TOKENS)")
        if self.store.embedded and not _is_loopback(self.store.host):
            raise ValueError(
                f"store.host: the embedded store (chDB, no ClickHouse access control) must listen on loopback, not "
                f"{self.store.host}; use a ClickHouse server (store.url) to share the store over a network")
        if not self.store.embedded:
            url = urlsplit(self.store.url)
            if not _is_loopback(url.hostname or "") and not (self.store.password or url.password):
                raise ValueError(
                    f"store.password: the store server {url.hostname} is not on loopback, so it needs a password "
                    f"(set EVENTIDE_STORE__PASSWORD)")
        stream = self.stream
        if stream.deduplicate and stream.dedup_horizon_ms > stream.accepted_retention_s * 1000:
            origin = ("" if stream.dedup_horizon_s is not None else
                      " (its default: allowed_lateness_s + the longest window or session gap)")
            raise ValueError(
                f"stream.dedup_horizon_s: {stream.dedup_horizon_ms / 1000:g} s{origin} exceeds "
                f"stream.accepted_retention_s ({stream.accepted_retention_s} s), which keeps the accepted ids the "
                f"horizon is checked against: raise accepted_retention_s or lower the horizon")
        return self

    @model_validator(mode="after")
    def _dashboard_sign_in(self) -> Config:
        """The dashboard shows every stored log line and the alert configuration: off loopback it needs a sign-in,
        and the sign-in chosen needs what it works with. Errors name the field to set."""
        d = self.dashboard
        if d.sign_in == "none" and not _is_loopback(d.host):
            raise ValueError(
                f"dashboard.sign_in: the dashboard listens on {d.host} (dashboard.host, not loopback), so it needs a "
                f"sign-in: \"oidc\" (EVENTIDE_DASHBOARD__SIGN_IN=oidc and the dashboard.oidc_* fields) or \"password\" "
                f"(EVENTIDE_DASHBOARD__SIGN_IN=password and EVENTIDE_DASHBOARD__PASSWORD); or set dashboard.host to "
                f"127.0.0.1")
        if d.sign_in == "password" and len(d.password) < MIN_DASHBOARD_PASSWORD_LENGTH:
            raise ValueError(
                f"dashboard.password: sign_in is \"password\", so the dashboard needs a shared password of at least "
                f"{MIN_DASHBOARD_PASSWORD_LENGTH} characters (set EVENTIDE_DASHBOARD__PASSWORD)")
        if d.sign_in != "oidc":
            for field in ("allowed_emails", "allowed_domains"):
                if getattr(d, field):
                    raise ValueError(f"dashboard.{field}: applies to sign_in = \"oidc\" only (sign_in is "
                                     f"\"{d.sign_in}\"), so it would admit or refuse no one")
            return self
        for field, variable in (("oidc_server_metadata_url", ""), ("oidc_client_id", ""),
                                ("oidc_client_secret", " (set EVENTIDE_DASHBOARD__OIDC_CLIENT_SECRET)")):
            if not getattr(d, field):
                raise ValueError(f"dashboard.{field}: sign_in is \"oidc\", so it must be set{variable}")
        metadata = urlsplit(d.oidc_server_metadata_url)
        if not (metadata.scheme == "https" or (metadata.scheme == "http" and _is_loopback(metadata.hostname or ""))):
            raise ValueError(
                f"dashboard.oidc_server_metadata_url: {d.oidc_server_metadata_url} must be https (http on loopback "
                f"only): the keys that sign a user's identity are read from it")
        if not d.oidc_redirect_uri and not _is_loopback(d.host):
            raise ValueError(
                f"dashboard.oidc_redirect_uri: the dashboard listens on {d.host} (not loopback), so the provider must "
                f"be told its public URL: set it to https://<public host>/oauth2callback")
        if not urlsplit(d.oidc_callback_url).path.endswith("/oauth2callback"):
            raise ValueError(f"dashboard.oidc_redirect_uri: {d.oidc_redirect_uri} must end in /oauth2callback "
                             f"(the path Streamlit receives the provider's answer on)")
        return self

    # Derived locations -------------------------------------------------------------------------------------
    def _abs(self, p: Path) -> Path:
        return p if p.is_absolute() else (self.root / p).resolve()

    @property
    def data_dir(self) -> Path:
        return self._abs(self.paths.data_dir)

    @property
    def cache_dir(self) -> Path:
        return self._abs(self.paths.cache_dir)

    @property
    def checkpoint_dir(self) -> Path:
        return self._abs(self.stream.checkpoint_dir) if self.stream.checkpoint_dir else self.data_dir / "checkpoints"

    @property
    def accepted_events_dir(self) -> Path:
        """The ``accept`` query's output, read by the stateful queries: beside their checkpoints, on storage every
        executor reads."""
        return self.checkpoint_dir / "accepted-events"

    @property
    def window_partials_dir(self) -> Path:
        """The ``accept`` query's per-batch window partials (``analytics.windows.partials``), read by ``windows``."""
        return self.checkpoint_dir / "window-partials"

    @property
    def reader_events_dir(self) -> Path:
        """The accepted events handed to the stateful queries, one reader batch per directory
        (``analytics.reader_batches``)."""
        return self.checkpoint_dir / "reader-events"

    @property
    def reader_partials_dir(self) -> Path:
        """The window partials handed to ``windows``, one reader batch per directory."""
        return self.checkpoint_dir / "reader-partials"

    @property
    def cluster_dir(self) -> Path:
        """``eventide cluster``: each broker's and worker's data, the shipped code, the cluster job's checkpoints."""
        return self.data_dir / "cluster"

    @property
    def executor_python(self) -> Path:
        """The Python of the cluster's executors (``cluster.executor_python``, default this interpreter)."""
        python = self.cluster.executor_python
        return self._abs(python) if python else Path(sys.executable)

    @property
    def spool_dir(self) -> Path:
        return self._abs(self.sdk.spool_dir) if self.sdk.spool_dir else self.data_dir / "spool"

    @property
    def alert_rules_file(self) -> Path:
        return self._abs(self.alerting.rules_file)

    @property
    def store_url(self) -> str:
        """Where every component sends its queries: the configured server, or the embedded store's server."""
        return self.store.url or f"http://{self.store.host}:{self.store.port}"

    @property
    def store_data_dir(self) -> Path:
        """The embedded store's chDB directory (only ``eventide store serve`` opens it)."""
        return self.data_dir / "clickhouse"


def _env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key == CONFIG_ENV or "__" not in key:
            continue
        path = key[len(ENV_PREFIX):].lower().split("__")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = overrides
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return overrides


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _describe(error: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "(root)"
        lines.append(f"  {field}: {item['msg']}")
    return "\n".join(lines)


def load_config(
    path: str | Path | None = None,
    environ: dict[str, str] | None = None,
    **overrides: Any,
) -> Config:
    """Load the configuration file, apply ``EVENTIDE_*`` env overrides, then keyword overrides (tests).

    Raises :class:`ConfigError` naming the field when anything is invalid.
    """
    environ = dict(os.environ if environ is None else environ)
    file = Path(path) if path else Path(environ[CONFIG_ENV]) if environ.get(CONFIG_ENV) else None
    if file is None and Path(DEFAULT_CONFIG_FILE).exists():
        file = Path(DEFAULT_CONFIG_FILE)
    data: dict[str, Any] = {}
    source = "built-in defaults"
    if file is not None:
        if not file.exists():
            raise ConfigError(f"config file {file} does not exist")
        try:
            data = tomllib.loads(file.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {file} is not valid TOML: {exc}") from exc
        source = str(file)
        data.setdefault("root", str(file.resolve().parent))
    else:
        data.setdefault("root", str(Path.cwd()))
    data = _deep_merge(data, _env_overrides(environ))
    data = _deep_merge(data, overrides)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None


def load_config_or_exit(path: str | Path | None = None) -> Config:
    """``load_config`` for a service's ``main``: an invalid configuration prints its message (naming the field)
    on stderr and exits with status 2, before anything starts."""
    try:
        return load_config(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from None


def to_environ(config: Config) -> dict[str, str]:
    """``EVENTIDE_*`` variables that make :func:`load_config` in a child process rebuild ``config`` exactly."""
    env: dict[str, str] = {}
    data = config.model_dump(mode="json")
    # Absolute locations, so the child need not share this process's working directory.
    data["paths"].update(data_dir=str(config.data_dir), cache_dir=str(config.cache_dir))
    data["stream"]["checkpoint_dir"] = str(config.checkpoint_dir)
    for section, fields in data.items():
        if not isinstance(fields, dict):
            continue
        for field, value in fields.items():
            env[f"{ENV_PREFIX}{section.upper()}__{field.upper()}"] = json.dumps(value)
    return env
