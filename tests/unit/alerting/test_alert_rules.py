"""Alert rules and the alert state machine (pure): given these finished windows, these states and transitions."""

from __future__ import annotations

import pytest

from alerting.rules import AlertRule, parse_rules, quantile_of, rules_for
from alerting.state import AlertState, run
from eventide.config import ConfigError, load_config
from stack import cli
from tests.support.stack import REPO

P99_RULE = """
[[rule]]
name = "checkout p99 latency"
series = { app = "checkout", kind = "metric", name = "latency_ms" }
window_s = 60
statistic = "p99"
comparator = ">"
threshold = 250
for = 3
severity = "critical"
"""

MINUTE = 60_000


def p99_rule(**changes: object) -> AlertRule:
    return parse_rules(P99_RULE).rule[0].model_copy(update=changes)


def windows(*values: float | None, start: int = 100 * MINUTE) -> list[tuple[int, float | None]]:
    """Consecutive 1-minute windows (end ms, value)."""
    return [(start + (i + 1) * MINUTE, v) for i, v in enumerate(values)]


def test_a_valid_file_gives_typed_rules() -> None:
    [rule] = parse_rules(P99_RULE).rule
    assert (rule.statistic, rule.comparator, rule.threshold, rule.for_windows, rule.severity) == (
        "p99", ">", 250.0, 3, "critical")
    assert rule.series is not None and rule.series.app == "checkout"
    assert quantile_of("p99.9") == pytest.approx(0.999) and quantile_of("rate") is None


@pytest.mark.parametrize(("change", "message"), [
    ('statistic = "p99"', None),
    ('statistic = "p100"', "rule 'checkout p99 latency' (rule #1), field statistic: unknown statistic 'p100'"),
    ('statistic = "median"', "field statistic: unknown statistic 'median'"),
    ('comparator = "=>"', "field comparator: Input should be '>', '>=', '<', '<=', '==' or '!='"),
    ("for = 0", "field for: Input should be greater than or equal to 1"),
    ("keep_firing_for = -1", "field keep_firing_for: Input should be greater than or equal to 0"),
    ('severity = "page"', "field severity"),
    ('threshold = "high"', "field threshold"),
    ("colour = 1", "field colour: Extra inputs are not permitted"),
    ('statistic = "lag"', "statistic 'lag' describes the pipeline and takes no series"),
    ('statistic = "error_ratio"', 'error_ratio is computed from log levels: series.kind must be "log"'),
])
def test_an_invalid_rule_fails_naming_the_rule_and_field(change: str, message: str | None) -> None:
    key = change.split("=")[0].strip()
    lines = [line for line in P99_RULE.splitlines() if not line.startswith(f"{key} ")]
    text = "\n".join([*lines, change])
    if message is None:
        parse_rules(text)
        return
    with pytest.raises(ConfigError) as error:
        parse_rules(text, "alerts.toml")
    assert "invalid alert rules (alerts.toml)" in str(error.value)
    assert message in str(error.value)


LOG_RULE = """
[[rule]]
name = "declined"
window_s = 60
statistic = "rate"
comparator = ">"
threshold = 0.5
logs = { app = "checkout", text = 'declined "card expired" db-12', levels = ["critical", "error"], names = ["pay"], \
tags = { region = "eu" } }
"""


def test_a_rule_on_log_lines_is_a_search_named_in_words() -> None:
    [rule] = parse_rules(LOG_RULE).rule
    assert rule.logs is not None and rule.series is None
    assert rule.logs.described == 'lines declined "card expired" "db 12" level=error|critical logger=pay region=eu'
    assert rule.logs.series("checkout").label == f"checkout · log · {rule.logs.described}"


@pytest.mark.parametrize(("change", "message"), [
    ('statistic = "p99"', "a rule on log lines (logs) compares count or rate, not 'p99'"),
    ('series = { app = "checkout", kind = "log", name = "pay" }',
     "a rule reads a series or counts log lines (logs), not both"),
    ('logs = { levels = ["fatal"] }', "field logs.levels.0: Input should be 'debug'"),
    ('logs = { text = "' + "x" * 501 + '" }', "field logs.text: String should have at most 500 characters"),
    ('logs = { query = "x" }', "field logs.query: Extra inputs are not permitted"),
])
def test_an_invalid_rule_on_log_lines_fails_naming_the_field(change: str, message: str) -> None:
    key = change.split("=")[0].strip()
    lines = [line for line in LOG_RULE.splitlines() if not line.startswith(f"{key} ")]
    with pytest.raises(ConfigError) as error:
        parse_rules("\n".join([*lines, change]), "alerts.toml")
    assert message in str(error.value)


def test_a_rule_without_a_name_is_named_by_position_and_duplicates_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"rule #2, field name: Field required"):
        parse_rules(P99_RULE + '[[rule]]\nstatistic = "dead_letters"\ncomparator = ">"\nthreshold = 0\n')
    with pytest.raises(ConfigError, match="two rules are named 'checkout p99 latency'"):
        parse_rules(P99_RULE + P99_RULE)
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_rules("[[rule]\n")


def test_for_three_windows_goes_pending_then_fires_on_the_third_breach() -> None:
    state, transitions = run(p99_rule(), AlertState("checkout p99 latency", "checkout/latency_ms"),
                             windows(100, 300, 300, 300, 300))
    assert [(t.to, t.window_end_ms // MINUTE - 100) for t in transitions] == [("pending", 2), ("firing", 4)]
    assert (state.state, state.breaches, state.since_ms // MINUTE - 100) == ("firing", 4, 4)


def test_a_broken_streak_starts_over_and_a_firing_alert_resolves_on_its_first_good_window() -> None:
    _, transitions = run(p99_rule(), AlertState("r", "s"), windows(300, 300, 100, 300, 300, 300, 250, 300))
    assert [(t.to, t.window_end_ms // MINUTE - 100) for t in transitions] == [
        ("pending", 1), ("ok", 3), ("pending", 4), ("firing", 6), ("resolved", 7), ("pending", 8)]
    assert [t.notify for t in transitions] == [False, False, False, True, True, False]


def test_for_one_fires_at_once_and_missing_windows_never_breach() -> None:
    _, transitions = run(p99_rule(for_windows=1), AlertState("r", "s"), windows(None, 251, None))
    assert [(t.to, t.value) for t in transitions] == [("firing", 251), ("resolved", None)]


def test_keep_firing_for_two_rides_out_two_calm_windows_and_resolves_at_the_third() -> None:
    # Given a rule firing at once, kept firing 2 windows past its last breach,
    rule = p99_rule(for_windows=1, keep_firing_for=2)
    # when the value dips for one window, then two, then three,
    state, transitions = run(rule, AlertState("r", "s"), windows(300, 100, 300, 100, 100, 300, 100, 100, 100))
    # then only the third calm window in a row resolves it: a dip is not notified as resolved and fired again.
    assert [(t.to, t.window_end_ms // MINUTE - 100) for t in transitions] == [("firing", 1), ("resolved", 9)]
    assert (state.state, state.calm) == ("ok", 0)


def test_keep_firing_for_counts_calm_windows_across_a_restart_and_a_rule_without_it_resolves_at_once() -> None:
    rule = p99_rule(for_windows=1, keep_firing_for=2)
    state, _ = run(rule, AlertState("r", "s"), windows(300, 100))
    assert (state.state, state.calm) == ("firing", 1)
    _, transitions = run(rule, state, windows(300, 100, 100, 100))   # the same two windows again, then two more
    assert [(t.to, t.window_end_ms // MINUTE - 100) for t in transitions] == [("resolved", 4)]
    _, at_once = run(p99_rule(for_windows=1), AlertState("r", "s"), windows(300, 100))
    assert [t.to for t in at_once] == ["firing", "resolved"]


def test_re_evaluating_the_same_windows_after_a_restart_changes_nothing() -> None:
    rule = p99_rule()
    state, first = run(rule, AlertState("r", "s"), windows(300, 300, 300))
    again, repeated = run(rule, state, windows(300, 300, 300))
    assert [t.to for t in first] == ["pending", "firing"] and repeated == [] and again == state
    later, more = run(rule, state, windows(300, 300, 300, 100))
    assert [t.to for t in more] == ["resolved"] and later.state == "ok"
    assert len({t.key for t in first + more}) == 3


def test_a_rule_on_a_window_length_the_job_does_not_compute_is_refused_naming_it(tmp_path) -> None:
    # Given a job computing 10-s and 60-s tumbling windows and a rule on 30-s windows (it could never have a value),
    config = load_config(environ={}, root=str(REPO), stream={"tumbling_windows_s": [10, 60]})
    rules = tmp_path / "alerts.toml"
    rules.write_text(P99_RULE.replace("window_s = 60", "window_s = 30"))
    # then the evaluator refuses the file, naming the rule and the field.
    with pytest.raises(ConfigError, match=r"rule 'checkout p99 latency', field window_s: 30 is not a tumbling window"):
        rules_for(config, rules)
    rules.write_text(P99_RULE)
    assert [r.name for r in rules_for(config, rules).rule] == ["checkout p99 latency"]


def test_alerts_check_prints_every_problem_of_a_file_one_per_line_and_fails(tmp_path, capsys) -> None:
    # Given a file with an unknown statistic in one rule and a window length the job lacks in another,
    rules = tmp_path / "alerts.toml"
    rules.write_text(P99_RULE.replace("window_s = 60", "window_s = 30")
                     + P99_RULE.replace("checkout p99 latency", "other").replace('"p99"', '"p101"'))
    # then `eventide alerts check FILE` names both, one line each, and exits 1;
    assert cli.main(["alerts", "check", str(rules)]) == 1
    problems = capsys.readouterr().err.splitlines()[1:]
    assert len(problems) == 2
    assert problems[0].startswith("  rule 'other' (rule #2), field statistic: unknown statistic 'p101'")
    assert problems[1].startswith("  rule 'checkout p99 latency', field window_s: 30")
    # and the project's own rules file passes.
    assert cli.main(["alerts", "check", str(REPO / "alerts.toml")]) == 0
    assert capsys.readouterr().out.endswith("alerts.toml: 6 rules, no problems\n")
