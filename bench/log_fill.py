"""Log lines as the stream job writes them into ``logs``: the bench's 5 apps and 2 loggers, levels by ``LEVEL_P``,
messages from 340 templates (31 common and 3 rare shapes x 10 components; Zipf-like shares within a level, the rare
ones at 1e-4 to 2e-6 of the lines) with numbers, durations, UUIDs, trace ids, IPs and users filled in; tags
region/route/status (status by level); 1,000 users and 20 devices per app, UUIDv7 event ids. The lines cover a span
evenly; the history goes in as Arrow blocks of 1M lines, the newest minutes one 5 s micro-batch per insert, as the
job writes them, so the newest lines sit in the small parts background merges have not caught up with. The data
``bench.log_search`` searches.
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.dashboard_store import LEVEL_P, LOGS
from bench.dashboard_store import ms as _ms
from eventide.config import Config
from eventide.envelope import LEVELS
from store.client import connect

COMPONENTS = ("auth", "cart", "checkout", "payment", "search", "inventory", "session", "cache", "db", "mailer")
# (level, logger, text): every base is written once per component, so patterns are distinct per component. Slots:
# {c} component, {n} small number, {ms} duration, {bytes} size, {uuid}, {hex} trace id, {ip}, {user}, {route},
# {status}, {order}, {attempt}.
LOG_BASES = (
    ("debug", 0, "{c} cache lookup key {hex} hit in {ms} us"),
    ("debug", 0, "{c} parsed request headers for {route} ({n} headers)"),
    ("debug", 0, "{c} sql query took {ms} ms rows={n}"),
    ("debug", 0, "{c} acquired pool connection {n} after {ms} ms"),
    ("debug", 1, "{c} job {uuid} picked from queue at depth {n}"),
    ("debug", 1, "{c} heartbeat sent seq={n}"),
    ("info", 0, "{c} request {route} completed with status {status} in {ms} ms"),
    ("info", 0, "{c} user {user} signed in from {ip}"),
    ("info", 0, "{c} request {route} served {bytes} bytes to {ip}"),
    ("info", 0, "{c} session {uuid} started for user {user}"),
    ("info", 0, "{c} order {order} created by user {user} with {n} items"),
    ("info", 0, "{c} request {route} accepted, trace {hex}"),
    ("info", 1, "{c} job {uuid} finished in {ms} ms"),
    ("info", 1, "{c} batch of {n} events flushed in {ms} ms"),
    ("info", 1, "{c} scheduled task {n} ran, next run in {n} s"),
    ("info", 1, "{c} email queued for user {user} message {uuid}"),
    ("warning", 0, "{c} slow request {route} took {ms} ms (threshold 500 ms)"),
    ("warning", 0, "{c} retrying upstream call to {ip} attempt {attempt} of 5"),
    ("warning", 0, "{c} rate limit close for user {user}: {n} requests in 60 s"),
    ("warning", 0, "{c} response for {route} truncated at {bytes} bytes"),
    ("warning", 1, "{c} queue depth {n} above soft limit"),
    ("warning", 1, "{c} job {uuid} took {ms} ms, longer than expected"),
    ("error", 0, "{c} request {route} failed with status {status}: upstream timeout after {ms} ms"),
    ("error", 0, "{c} connection reset by peer {ip} while writing response"),
    ("error", 0, "{c} payment for order {order} declined: card expired"),
    ("error", 0, "{c} invalid token for user {user}: signature mismatch"),
    ("error", 1, "{c} job {uuid} failed: timeout after {ms} ms, attempt {attempt}"),
    ("error", 1, "{c} could not deliver message {uuid}: connection refused by {ip}"),
    ("critical", 0, "{c} database pool exhausted: {n} waiting, {n} in use"),
    ("critical", 1, "{c} worker {n} crashed: out of memory after {bytes} bytes"),
    ("critical", 1, "{c} disk usage at {n} percent on volume data-{n}"),
)
# Rare lines, as a share of all lines (spread over the components): the words a search looks for after an incident.
LOG_RARE = (
    ("warning", 0, "{c} certificate for api.example.com expires in {n} days", 1e-4),
    ("error", 1, "{c} deadlock detected on table orders, transaction {uuid} rolled back", 1e-5),
    ("critical", 1, "{c} segfault in native module at address 0x{hex}", 2e-6),
)
ROUTES = ("/", "/login", "/logout", "/cart", "/cart/items", "/checkout", "/checkout/pay", "/search", "/products",
          "/products/item", "/orders", "/orders/item", "/account", "/account/settings", "/api/v1/events",
          "/api/v1/metrics", "/health", "/static/app.js", "/images/item", "/recommendations")
REGIONS = ("eu-west", "us-east", "us-west", "ap-south")
STATUS_BY_LEVEL = {"debug": ("200", "200", "200", "304"), "info": ("200", "200", "201", "204"),
                   "warning": ("200", "404", "429", "408"), "error": ("500", "502", "503", "504"),
                   "critical": ("500", "503", "503", "503")}
_SLOT = re.compile(r"\{(\w+)\}")
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


@dataclass(frozen=True)
class LogLoad:
    """``lines`` log lines of the bench's 5 apps spread evenly over the ``hours`` before the bench's end."""

    lines: int
    hours: float = 24.0
    block: int = 1_000_000                 # rows per insert: one Arrow block, as a large micro-batch writes
    apps: int = 5
    users_per_app: int = 1000
    devices_per_app: int = 20
    anonymous: float = 0.15                # lines without a user
    live_minutes: float = 60.0             # the newest lines, written one micro-batch per insert
    trigger_s: int = 5                     # the stream job's micro-batch interval

    @property
    def per_hour(self) -> float:
        return self.lines / self.hours


@dataclass(frozen=True)
class _Template:
    level: str
    logger: int
    parts: tuple[str, ...]                 # literal text around the slots: len(parts) == len(slots) + 1
    slots: tuple[str, ...]


def _templates() -> tuple[list[_Template], np.ndarray]:
    """Every template and its share of the lines: by LEVEL_P per level, Zipf-like within a level, rare ones fixed."""
    rng = np.random.default_rng(38)
    templates: list[_Template] = []
    shares: list[float] = []
    comp_w = 1 / np.arange(1, len(COMPONENTS) + 1)
    comp_w /= comp_w.sum()
    rare_by_level = {lvl: sum(p for lv, _, _, p in LOG_RARE if lv == lvl) for lvl in LEVELS}
    for li, level in enumerate(LEVELS):
        bases = [(lg, text) for lv, lg, text in LOG_BASES if lv == level]
        w = 1 / np.arange(1, len(bases) + 1) ** 0.8
        w = rng.permutation(w / w.sum()) * (LEVEL_P[li] - rare_by_level[level])
        for (logger, text), wb in zip(bases, w, strict=True):
            for c, wc in zip(COMPONENTS, comp_w, strict=True):
                templates.append(_template(level, logger, text, c))
                shares.append(wb * wc)
        for lv, logger, text, p in LOG_RARE:
            if lv == level:
                for c in COMPONENTS:
                    templates.append(_template(level, logger, text, c))
                    shares.append(p / len(COMPONENTS))
    return templates, np.array(shares) / sum(shares)


def _template(level: str, logger: int, text: str, component: str) -> _Template:
    pieces = _SLOT.split(text.replace("{c}", component))
    return _Template(level, logger, tuple(pieces[0::2]), tuple(pieces[1::2]))


def _hex_strings(rng: np.random.Generator, n: int, groups: tuple[int, ...],
                 time_ms: np.ndarray | None = None) -> pa.Array:
    """``n`` random lowercase hex strings in dash-separated groups (a UUID: 8-4-4-4-12), built as one buffer;
    with ``time_ms``, a UUIDv7 (the SDK's ids): 48 bits of the time, then the version 7, then random digits."""
    digits = sum(groups)
    width = digits + len(groups) - 1
    codes = rng.integers(0, 16, (n, digits), dtype=np.uint8)
    if time_ms is not None:
        codes[:, :12] = (time_ms[:, None] >> np.arange(44, -1, -4)) & 0xF
        codes[:, 12] = 7
    nibbles = _HEX[codes]
    out = np.full((n, width), ord("-"), np.uint8)
    at = 0
    for i, g in enumerate(groups):
        out[:, at + i:at + i + g] = nibbles[:, at:at + g]
        at += g
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(out.tobytes())])


def _digits(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values.astype(np.int64)), pa.string())


def _log_block(load: LogLoad, start_ms: int, end_ms: int, n: int, first_offset: int, rng: np.random.Generator,
               templates: list[_Template], shares: np.ndarray) -> pa.Table:
    """``n`` lines with corrected event times in [start_ms, end_ms), in time order (as the job appends them)."""
    t = np.sort(rng.integers(start_ms, end_ms, n))
    app = rng.integers(0, load.apps, n)
    device = app * load.devices_per_app + rng.integers(0, load.devices_per_app, n)
    user = app * load.users_per_app + rng.integers(0, load.users_per_app, n)
    anonymous = rng.random(n) < load.anonymous
    which = rng.choice(len(templates), n, p=shares)
    level_of = np.array([LEVELS.index(tp.level) for tp in templates])
    logger_of = np.array([tp.logger for tp in templates])
    level = level_of[which]
    route = rng.integers(0, len(ROUTES), n)
    status_pick = rng.integers(0, 4, n)
    status_table = pa.array([s for lvl in LEVELS for s in STATUS_BY_LEVEL[lvl]])
    status = pc.take(status_table, pa.array(level * 4 + status_pick))
    routes, apps = pa.array(ROUTES), pa.array([f"app-{a}" for a in range(load.apps)])
    devices = pa.array([f"app-{a}-device-{d}" for a in range(load.apps) for d in range(load.devices_per_app)])
    users = pa.array([f"app-{a}-user-{u}" for a in range(load.apps) for u in range(load.users_per_app)] + [""])
    user_col = pc.take(users, pa.array(np.where(anonymous, len(users) - 1, user)))
    route_col = pc.take(routes, pa.array(route))

    # Messages, one template group at a time (each slot a vectorised column), put back into time order.
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(len(templates) + 1))
    pieces = []
    for k, tp in enumerate(templates):
        rows = order[bounds[k]:bounds[k + 1]]
        if not len(rows):
            continue
        m = len(rows)
        args: list[Any] = [tp.parts[0]]
        for slot, text in zip(tp.slots, tp.parts[1:], strict=True):
            args += [_slot(slot, rows, m, rng, user_col, route_col, status), text]
        pieces.append(pc.binary_join_element_wise(*args, "") if tp.slots else pa.array([tp.parts[0]] * m))
    message = pc.take(pa.concat_arrays(pieces), pa.array(np.argsort(order)))

    offset = rng.normal(0, 5_000, load.apps * load.devices_per_app).astype(np.int64)   # device clock offsets
    region = rng.integers(0, len(REGIONS), n)
    keys = pa.array(["region", "route", "status"] * n)
    items = pc.take(pa.concat_arrays([pc.take(pa.array(REGIONS), pa.array(region)), route_col, status]),
                    pa.array(np.stack([np.arange(n), n + np.arange(n), 2 * n + np.arange(n)], axis=1).ravel()))
    tags = pa.MapArray.from_arrays(pa.array(np.arange(0, 3 * n + 1, 3, dtype=np.int32)), keys, items)
    return pa.table({
        "corrected_event_time": _ms(t), "event_time": _ms(t - offset[device]),
        "received_time": _ms(t + rng.exponential(300, n).astype(np.int64)),
        "app": pc.take(apps, pa.array(app)), "level": pc.take(pa.array(LEVELS), pa.array(level)),
        "name": pc.take(pa.array(LOGS), pa.array(logger_of[which])), "device": pc.take(devices, pa.array(device)),
        "user": user_col, "message": message, "tags": tags, "event_id": _hex_strings(rng, n, (8, 4, 4, 4, 12), t),
        "source_partition": (device % 4).astype(np.int32),
        "source_offset": np.arange(first_offset, first_offset + n, dtype=np.int64)})


def _slot(slot: str, rows: np.ndarray, m: int, rng: np.random.Generator, user_col: pa.Array, route_col: pa.Array,
          status: pa.Array) -> pa.Array:
    idx = pa.array(rows)
    if slot == "user":
        named = pc.take(user_col, idx)
        return pc.if_else(pc.equal(named, ""), "anonymous", named)
    if slot == "route":
        return pc.take(route_col, idx)
    if slot == "status":
        return pc.take(status, idx)
    if slot == "uuid":
        return _hex_strings(rng, m, (8, 4, 4, 4, 12))
    if slot == "hex":
        return _hex_strings(rng, m, (16,))
    if slot == "ip":
        octets = [_digits(rng.integers(1, 255, m)) for _ in range(4)]
        return pc.binary_join_element_wise(*octets, ".")
    if slot == "order":
        return pc.binary_join_element_wise("ord-", _digits(rng.integers(10_000_000, 99_999_999, m)), "")
    values = {"n": lambda: rng.integers(0, 1000, m), "ms": lambda: rng.lognormal(3, 1.2, m),
              "bytes": lambda: rng.lognormal(8, 2, m), "attempt": lambda: rng.integers(1, 6, m)}[slot]()
    return _digits(values)


@dataclass
class LogFill:
    """How the lines went in: the history in large blocks, the newest minutes in the job's micro-batches."""

    bulk_lines: int = 0
    generate_s: float = 0.0
    bulk_insert_s: float = 0.0
    live_lines: int = 0
    live_inserts: int = 0
    live_insert_s: float = 0.0


def populate_logs(config: Config, load: LogLoad, until: datetime, database: str = "") -> LogFill:
    """Insert the load's lines into ``logs``, in time order: the history in blocks of ``load.block`` lines (what
    background merges leave), the last ``load.live_minutes`` one micro-batch (``load.trigger_s``) per insert, as
    the stream job writes them, so the newest lines sit in the small parts a running system has not merged yet."""
    end_ms = int(until.timestamp() * 1000)
    t0_ms = end_ms - int(load.hours * 3_600_000)
    live_ms = min(end_ms - t0_ms, load.live_minutes * 60_000)
    live_lines = round(load.lines * live_ms / (end_ms - t0_ms))
    bulk_lines = load.lines - live_lines
    rng = np.random.default_rng(38)
    templates, shares = _templates()
    blocks = -(-bulk_lines // load.block)
    fill = LogFill(bulk_lines=bulk_lines, live_lines=live_lines)
    with connect(config, database=database) as client:
        for b in range(blocks):
            n = min(load.block, bulk_lines - b * load.block)
            start = t0_ms + (end_ms - live_ms - t0_ms) * b // blocks
            stop = t0_ms + (end_ms - live_ms - t0_ms) * (b + 1) // blocks
            t = time.perf_counter()
            data = _log_block(load, start, stop, n, b * load.block, rng, templates, shares)
            fill.generate_s += time.perf_counter() - t
            t = time.perf_counter()
            client.insert_arrow("logs", data)
            fill.bulk_insert_s += time.perf_counter() - t
        if live_lines:
            t = time.perf_counter()
            data = _log_block(load, end_ms - live_ms, end_ms, live_lines, bulk_lines, rng, templates, shares)
            fill.generate_s += time.perf_counter() - t
            times = data.column("corrected_event_time").cast(pa.int64()).to_numpy()
            cuts = np.searchsorted(times, np.arange(end_ms - live_ms, end_ms + 1, load.trigger_s * 1000))
            t = time.perf_counter()
            for a, b in itertools.pairwise(cuts):
                if b > a:
                    client.insert_arrow("logs", data.slice(a, b - a))
                    fill.live_inserts += 1
            fill.live_insert_s = time.perf_counter() - t
    return fill

