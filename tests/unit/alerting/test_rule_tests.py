"""`eventide alerts test FILE`: given a series' values in consecutive windows, the expected notifications, exactly."""

from __future__ import annotations

from pathlib import Path

from stack import cli
from tests.support.stack import REPO

P99_TEST = f"""
rule_files = ["{REPO / 'alerts.toml'}"]

[[test]]
name = "slow checkout"
[[test.input]]
series = {{ app = "checkout", kind = "metric", name = "latency_ms" }}
window_s = 60
values = {{ p99 = "150 150 90" }}
[[test.alert]]
at = 2
rule = "checkout p99 latency"
series = "checkout · metric · latency_ms"
status = "firing"
[[test.alert]]
at = 3
rule = "checkout p99 latency"
series = "checkout · metric · latency_ms"
status = "resolved"
"""


def written(tmp_path: Path, text: str) -> str:
    path = tmp_path / "alerts.test.toml"
    path.write_text(text)
    return str(path)


def test_the_demos_rules_pass_their_own_tests(capsys) -> None:
    assert cli.main(["alerts", "test", str(REPO / "alerts.test.toml")]) == 0
    assert capsys.readouterr().out.endswith("alerts.test.toml: 5 tests, all pass\n")


def test_expected_notifications_that_come_pass(tmp_path, capsys) -> None:
    assert cli.main(["alerts", "test", written(tmp_path, P99_TEST)]) == 0
    assert capsys.readouterr().out.endswith(": 1 tests, all pass\n")


def test_a_missing_and_an_unexpected_notification_each_fail_with_a_line(tmp_path, capsys) -> None:
    # Given a test expecting the alert to fire one window early (the rule's `for = 2` fires at the second),
    early = P99_TEST.replace("at = 2", "at = 1")
    assert cli.main(["alerts", "test", written(tmp_path, early)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == [
        "test 'slow checkout': expected firing of 'checkout p99 latency' [checkout · metric · latency_ms] at window "
        "1, but it did not come",
        "test 'slow checkout': unexpected firing of 'checkout p99 latency' [checkout · metric · latency_ms] at "
        "window 2"]


def test_a_notification_nobody_expected_fails(tmp_path, capsys) -> None:
    silent = P99_TEST.split("[[test.alert]]")[0]
    assert cli.main(["alerts", "test", written(tmp_path, silent)]) == 1
    assert "unexpected firing of 'checkout p99 latency'" in capsys.readouterr().err


def test_an_unknown_rule_and_a_bad_value_are_named(tmp_path, capsys) -> None:
    assert cli.main(["alerts", "test", written(tmp_path, P99_TEST.replace(
        'rule = "checkout p99 latency"\nseries = "checkout · metric · latency_ms"\nstatus = "resolved"',
        'rule = "no such rule"\nstatus = "resolved"'))]) == 1
    assert "test 'slow checkout': no rule is named 'no such rule'" in capsys.readouterr().err
    assert cli.main(["alerts", "test", written(tmp_path, P99_TEST.replace('"150 150 90"', '"150 fast 90"'))]) == 1
    assert "field test.0.input.0.values: p99: 'fast' is neither a number nor _" in capsys.readouterr().err


def test_a_rule_on_log_lines_reads_the_series_its_search_makes_per_app(tmp_path, capsys) -> None:
    # Given the demo's "payments declined" rule (app = "*") and counts of its lines in two apps,
    search = 'lines "payment declined" level=error'
    test = f"""
rule_files = ["{REPO / 'alerts.toml'}"]
[[test]]
name = "declined payments"
[[test.input]]
series = {{ app = "search", kind = "log", name = '{search}' }}
window_s = 60
values = {{ count = "30 0" }}
[[test.input]]
series = {{ app = "checkout", kind = "log", name = 'lines "payment declined"' }}   # another search: not read
window_s = 60
values = {{ count = "30 0" }}
[[test.alert]]
at = 1
rule = "payments declined"
series = 'search · log · {search}'
status = "firing"
"""
    # then only the series of the rule's own search fires, and resolves, each notification expected or named.
    assert cli.main(["alerts", "test", written(tmp_path, test)]) == 1
    assert capsys.readouterr().err.splitlines()[0].split(": ", 1)[1] == (
        f"test 'declined payments': unexpected resolved of 'payments declined' [search · log · {search}] at window 2")


def test_an_alert_with_other_labels_than_expected_fails_naming_both(tmp_path, capsys) -> None:
    # Given the slow-checkout test expecting the firing alert's labels, one of them wrong,
    labels = ('\n[test.alert.labels]\nalertname = "checkout p99 latency"\nseverity = "{severity}"\napp = "checkout"\n'
              'kind = "metric"\nname = "latency_ms"\nteam = "checkout"\n')
    right, wrong = (P99_TEST.replace('status = "firing"\n', 'status = "firing"' + labels.format(severity=s), 1)
                    for s in ("warning", "critical"))
    assert cli.main(["alerts", "test", written(tmp_path, right)]) == 0
    capsys.readouterr()
    # then the test fails with a line naming the labels it got and those expected.
    assert cli.main(["alerts", "test", written(tmp_path, wrong)]) == 1
    assert capsys.readouterr().err.splitlines()[0].split(": ", 1)[1] == (
        "test 'slow checkout': firing of 'checkout p99 latency' [checkout · metric · latency_ms] at window 2 has "
        'labels {alertname="checkout p99 latency", app="checkout", kind="metric", name="latency_ms", '
        'severity="warning", team="checkout"}, expected {alertname="checkout p99 latency", app="checkout", '
        'kind="metric", name="latency_ms", severity="critical", team="checkout"}')
