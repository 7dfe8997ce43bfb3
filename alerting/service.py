"""The alerting service: load and check the rules at startup, then evaluate every interval; notifications are
delivered by threads of their own (:mod:`alerting.delivery`), so a slow or broken receiver never delays an
evaluation.

    python -m alerting.service        (or: eventide alerts)
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Callable

import uvicorn

from alerting.delivery import Delivery, deliver, receiver_deliveries
from alerting.dispatch import GroupNotifier
from alerting.evaluator import evaluate
from alerting.notify import Channel, channels
from alerting.rules import rules_for
from eventide.config import Config, ConfigError, load_config
from eventide.envelope import now_ms
from store.migrations import apply_migrations

log = logging.getLogger("eventide.alerting")


def run(config: Config, once: bool = False, stop: threading.Event | None = None,
        on_tick: Callable[[float, float], None] | None = None, targets: list[Channel] | None = None) -> int:
    """Evaluate and notify until ``stop`` is set (or once: one evaluation, then deliver what is pending and
    return). Invalid rules stop startup with a message naming them. ``on_tick(started, seconds)`` is called after
    each evaluation with its monotonic start and duration (for monitoring and tests); ``targets``: the channels
    (default: the configured ones, :func:`alerting.notify.channels`)."""
    rules = rules_for(config)
    apply_migrations(config)          # idempotent: the alert tables exist before the first pass
    log.info("alerting: %d rules from %s, every %ss", len(rules.rule), config.alert_rules_file,
             config.alerting.evaluation_interval_s)
    targets = channels(config) if targets is None else targets
    receivers = receiver_deliveries(config, rules)
    grouping = GroupNotifier(config, rules) if rules.routing is not None else None
    if once:
        try:
            evaluate(config, rules)
            if grouping is not None:
                grouping.flush(now_ms())
            deliver(config, targets, receivers)
        except Exception:  # a store or broker hiccup: logged, as a long-running service would
            log.exception("alert evaluation failed")
        return 0
    stop = stop or threading.Event()
    api = _serve_api(config)
    delivery = Delivery(config, targets, receivers=receivers).start()
    interval = config.alerting.evaluation_interval_s
    next_evaluation = time.monotonic()
    try:
        while not stop.is_set():
            if time.monotonic() >= next_evaluation:
                started = time.monotonic()
                try:
                    evaluate(config, rules)
                except Exception:  # a store hiccup: log it, try again next interval
                    log.exception("alert evaluation failed; retrying next interval")
                next_evaluation = started + interval
                if on_tick is not None:
                    on_tick(started, time.monotonic() - started)
            wait = next_evaluation - time.monotonic()
            if grouping is not None:
                retry_s = 0.0
                try:
                    grouping.flush(now_ms())
                except Exception:   # a store hiccup: groups stay due; try again in a second, not in a busy loop
                    log.exception("alert grouping failed; retrying")
                    retry_s = 1.0
                due = grouping.next_due_ms()
                if due is not None:     # a group or a resend falls due before the next evaluation
                    wait = min(wait, max(retry_s, (due - now_ms()) / 1000))
            delivery.wake()       # never waits for a delivery
            stop.wait(max(0.0, wait))
    finally:
        delivery.stop()
        if api is not None:
            api.should_exit = True
    return 0


def _serve_api(config: Config) -> uvicorn.Server | None:
    """The silences API (``alerting/api.py``) in a thread of the service, when ``alerting.api_port`` is set."""
    a = config.alerting
    if not a.api_port:
        return None
    from alerting.api import server_config

    server = uvicorn.Server(server_config(config))
    threading.Thread(target=server.run, daemon=True, name="eventide-alerting-api").start()
    log.info("alerting: silences API on http://%s:%d/api/v2/silences", a.api_host, a.api_port)
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config")
    parser.add_argument("--once", action="store_true", help="one evaluation and delivery, then exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        return run(load_config(args.config), args.once)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
