"""The alerting service: load and check the rules at startup, then evaluate and notify every interval.

    python -m alerting.service        (or: eventide alerts)
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from alerting.evaluator import evaluate
from alerting.notify import channels, deliver
from alerting.rules import load_rules
from eventide.config import Config, ConfigError, load_config
from store.migrations import apply_migrations

log = logging.getLogger("eventide.alerting")


def run(config: Config, once: bool = False) -> int:
    """Evaluate and notify until stopped (or once). Invalid rules stop startup with a message naming them."""
    rules = load_rules(config.alert_rules_file)
    apply_migrations(config)          # idempotent: the alert tables exist before the first pass
    log.info("alerting: %d rules from %s, every %ss", len(rules.rule), config.alert_rules_file,
             config.alerting.evaluation_interval_s)
    targets = channels(config)
    while True:
        started = time.monotonic()
        try:
            evaluate(config, rules)
            deliver(config, targets)
        except Exception:  # a store or broker hiccup: log it, try again next interval
            log.exception("alert evaluation failed; retrying next interval")
        if once:
            return 0
        time.sleep(max(0.0, config.alerting.evaluation_interval_s - (time.monotonic() - started)))


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
