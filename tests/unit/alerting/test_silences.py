"""Silences as Alertmanager checks and applies them: given matchers and a span, which alerts are muted when."""

from __future__ import annotations

import pytest

from alerting.silences import muting, new_silence
from eventide.config import ConfigError

CHECKOUT = {"alertname": "slow", "app": "checkout", "severity": "warning"}


def test_a_silence_mutes_the_alerts_its_matchers_match_while_it_is_active() -> None:
    silence = new_silence(['app="checkout"', "severity=~warn.*"], 1_000, 2_000, "alice", "deploy")
    assert [silence.state(t) for t in (999, 1_000, 1_999, 2_000)] == ["pending", "active", "active", "expired"]
    assert muting([silence], CHECKOUT, 1_500) == [silence.id]
    assert muting([silence], CHECKOUT, 2_000) == []
    assert muting([silence], {**CHECKOUT, "app": "search"}, 1_500) == []
    assert muting([silence], {**CHECKOUT, "severity": "critical"}, 1_500) == []


@pytest.mark.parametrize(("matchers", "problem"), [
    (['app=~".*"'], "must not match the empty string"),
    (['app!="checkout"'], "must not match the empty string"),
    (["app=~("], "invalid regular expression"),
    ([], "must not match the empty string"),
])
def test_a_silence_that_would_mute_everything_or_cannot_be_read_is_refused(matchers: list[str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        new_silence(matchers, 0, 1, "alice", "deploy")


def test_a_silence_says_who_and_why_and_ends_after_it_starts() -> None:
    with pytest.raises(ConfigError, match="who creates it and why"):
        new_silence(['app="checkout"'], 0, 1, "", "deploy")
    with pytest.raises(ConfigError, match="end after it starts"):
        new_silence(['app="checkout"'], 5, 5, "alice", "deploy")
