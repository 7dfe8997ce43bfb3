"""The demo load's error bursts: whole minutes on the clock's grid, and lines the demo's rule on log lines counts."""

from __future__ import annotations

import random

from alerting.rules import parse_rules
from eventide.config import load_config
from stack.demo_load import burst_message, in_burst
from store.log_query import parse_text, tokens
from tests.support.stack import REPO

MINUTE = 60_000


def test_a_burst_fills_the_first_minute_of_every_five_and_nothing_else() -> None:
    config = load_config(environ={})
    start = 1_000 * 5 * MINUTE
    assert [in_burst(config, start + k * MINUTE // 2) for k in range(11)] == [True, True] + [False] * 8 + [True]
    assert not in_burst(config.model_copy(update={"demo": config.demo.model_copy(
        update={"error_burst_every_s": 0})}), start)


def test_every_burst_line_holds_the_demo_rules_phrase() -> None:
    rule = next(r for r in parse_rules((REPO / "alerts.toml").read_text()).rule if r.name == "payments declined")
    assert rule.logs is not None
    _, [phrase] = parse_text(rule.logs.text)
    rng = random.Random(3)
    for _ in range(50):
        assert " ".join(tokens(burst_message(rng).lower())).startswith(phrase)
