"""Demo load: several apps and devices emitting metrics and logs, some with skewed clocks, some late, a few bad.

Every device gets a fixed clock offset (most 0; ``demo.skewed_device_fraction`` of them up to
``±demo.max_clock_skew_s``), so the job's clock correction has something to correct. A fraction of events is sent
late (as if buffered offline: ``event_time`` in the past), a small fraction is malformed on purpose so the
dead-letter path shows up on the dashboard, and another is sent twice (a client retrying), counted once. Every few
minutes the first app has an incident: a burst of "payment declined" error lines (:func:`burst_line`), which the
demo's rule on log lines (alerts.toml) fires on.

An app of the demo written with the SDK, like any user's app, so it lives with the launcher that starts it
(``eventide load``, ``./run demo``) and not in ``ingest/``, which holds only what gets events in.
"""

from __future__ import annotations

import argparse
import logging
import random
import time

from eventide.config import Config, load_config
from eventide.envelope import LEVELS, encode, metric_event, now_ms, offset_clock
from ingest.sdk import Client

log = logging.getLogger(__name__)

_MALFORMED = (b"{not json", b'{"v":1,"kind":"metric"}', b'{"v":2,"id":"x"}', b"[]")
_LEVEL_WEIGHTS = (0.2, 0.6, 0.12, 0.07, 0.01)


def make_devices(config: Config, rng: random.Random) -> list[Client]:
    """One SDK client per (app, device); each device's clock has its own fixed offset."""
    demo = config.demo
    devices = []
    for app in demo.apps:
        for n in range(demo.devices_per_app):
            skewed = rng.random() < demo.skewed_device_fraction
            offset = int(rng.uniform(-1, 1) * demo.max_clock_skew_s * 1000) if skewed else 0
            devices.append(Client(app, f"{app}-device-{n}", config=config, clock=offset_clock(offset)))
    return devices


def emit_one(client: Client, config: Config, rng: random.Random) -> None:
    demo = config.demo
    if rng.random() < demo.malformed_fraction:
        client.send_raw(rng.choice(_MALFORMED))
        return
    event_time = client.clock()
    if rng.random() < demo.duplicate_fraction:
        # A retried send: the very same envelope (same id) twice; the job keeps the first copy.
        copy = encode(metric_event(app=client.app, device=client.device, name="retried_ms", value=1.0,
                                   event_time=event_time, sent_time=event_time))
        client.send_raw(copy)
        client.send_raw(copy)
        return
    if rng.random() < demo.late_event_fraction:
        event_time -= int(rng.uniform(0, demo.max_lateness_s) * 1000)
    # Users come and go: each minute a different block of them is active, so their sessions end.
    first = now_ms() // 60_000 * demo.active_users_per_minute
    user = f"user-{(first + rng.randrange(demo.active_users_per_minute)) % demo.users}"
    tags = {"region": rng.choice(("eu", "us", "ap"))}
    roll = rng.random()
    if roll < 0.55:
        # Heavy-tailed latency: what p99 is for.
        client.metric("latency_ms", round(rng.lognormvariate(3.5, 0.6), 3), user=user, tags=tags,
                      event_time=event_time)
    elif roll < 0.8:
        client.metric("cart_value", round(rng.uniform(5, 250), 2), user=user, tags=tags, event_time=event_time)
    else:
        level = rng.choices(LEVELS, weights=_LEVEL_WEIGHTS)[0]
        client.log(level, f"demo {level} message", name="app.server", user=user, event_time=event_time, **tags)


BURST_LOGGER = "payments"


def in_burst(config: Config, t_ms: int) -> bool:
    """Whether ``t_ms`` lies in one of the first app's error bursts (``demo.error_burst_*``)."""
    every = config.demo.error_burst_every_s * 1000
    return every > 0 and t_ms % every < config.demo.error_burst_s * 1000


def burst_message(rng: random.Random) -> str:
    """The text of one line of an error burst: a declined payment, its order and the issuer's answer varying."""
    order = rng.randrange(10_000, 99_999)
    reason = rng.choice(("issuer timeout", "insufficient funds", "card expired"))
    return f"payment declined for order o-{order}: {reason}"


def burst_line(client: Client, rng: random.Random) -> None:
    """One error line of an error burst, logged at level error by :data:`BURST_LOGGER`."""
    client.log("error", burst_message(rng), name=BURST_LOGGER)


def run(config: Config, rate: float | None = None, duration_s: float | None = None, seed: int | None = None) -> int:
    """Emit events at ``rate`` per second for ``duration_s`` seconds (forever when None), and the error bursts'
    lines besides. Returns events sent, burst lines included."""
    rng = random.Random(seed)
    rate = rate or config.demo.events_per_second
    devices = make_devices(config, rng)
    burst_devices = [d for d in devices if d.app == config.demo.apps[0]]
    sent = 0
    burst_lines = 0
    burst_sent = 0   # burst lines due since the load started (those of the calm between bursts are never owed)
    log_every = max(int(rate * 30), 1)
    next_log = log_every
    started = time.monotonic()
    try:
        while duration_s is None or time.monotonic() - started < duration_s:
            due = int((time.monotonic() - started) * rate)
            while sent < due:
                emit_one(rng.choice(devices), config, rng)
                sent += 1
            if in_burst(config, now_ms()):
                while burst_sent < int((time.monotonic() - started) * config.demo.error_burst_lines_per_s):
                    burst_line(rng.choice(burst_devices), rng)
                    burst_sent += 1
                    burst_lines += 1
            else:
                # The count restarts with each burst, so a burst never sends what the calm between owed.
                burst_sent = int((time.monotonic() - started) * config.demo.error_burst_lines_per_s)
            time.sleep(0.01)
            if sent >= next_log:
                log.info("sent %d events (and %d lines of error bursts)", sent, burst_lines)
                next_log += log_every
    finally:
        for client in devices:
            client.close()
    return sent + burst_lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config")
    parser.add_argument("--rate", type=float, help="events per second (default demo.events_per_second)")
    parser.add_argument("--duration", type=float, help="seconds (default: forever)")
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    sent = run(load_config(args.config), args.rate, args.duration, args.seed)
    log.info("done: %d events", sent)


if __name__ == "__main__":
    main()
