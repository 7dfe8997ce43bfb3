"""Every dashboard page says how fresh its data is, and refreshes in place at an interval the sidebar picks.

The wording is a pure function of (now, when each query's last batch was stored, the queries the page reads, the
stale threshold, the refresh interval): ``dashboard.common.freshness``. Pages draw it with ``show_freshness``
(tests/integration/test_dashboard.py checks a page against a real store).
"""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime, timedelta

import pytest

from analytics import vocabulary
from dashboard.common import age_text, freshness, parse_refresh, refresh_options, stale_after_s
from eventide.config import Config, DashboardConfig, load_config
from store import pipeline
from tests.support.stack import REPO

NOW = datetime(2026, 11, 28, 10, 42, 10, tzinfo=UTC)
STALE_AFTER_S = 15.0


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def built_in(tmp_path, **overrides: object) -> Config:
    """The built-in defaults (an empty config file, not the checked-in eventide.toml), with ``overrides``."""
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    return load_config(empty, environ={}, **overrides)


def test_fresh_data_reads_as_of_the_last_batch_and_how_far_behind_now_it_is():
    line = freshness(NOW, {"windows": ago(3)}, ["windows"], STALE_AFTER_S, 2.0)
    assert line.level == "fresh"
    assert line.text == "data as of 10:42:07 UTC · 3 s behind · refreshes every 2 s"


def test_a_page_reading_several_queries_is_as_fresh_as_the_oldest_of_them():
    batches = {"accept": ago(1), "windows": ago(4), "keyed_windows": ago(2)}
    line = freshness(NOW, batches, ["accept", "windows", "keyed_windows"], STALE_AFTER_S, 2.0)
    assert line.level == "fresh" and line.text.startswith("data as of 10:42:06 UTC · 4 s behind")


def test_only_the_queries_the_page_reads_count():
    line = freshness(NOW, {"windows": ago(2), "keyed_windows": ago(3_600)}, ["windows"], STALE_AFTER_S, 2.0)
    assert line.level == "fresh" and "2 s behind" in line.text


def test_a_part_that_moves_sooner_than_the_page_gets_its_own_age_from_its_newest_stamp():
    # The tumbling rows moved 1 s ago (a provisional round), the windows query's own batch is 4 s old, the sliding
    # windows' 6 s: the page is 6 s behind, its tumbling charts 1 s.
    batches = {"accept": ago(1.5), "windows": ago(4), "keyed_windows": ago(6), "provisional_windows": ago(1)}
    line = freshness(NOW, batches, ["accept", "windows", "keyed_windows"], STALE_AFTER_S, 2.0,
                     sooner={"tumbling windows": pipeline.WINDOW_ROWS, "log lines": [pipeline.ACCEPT_QUERY]})
    assert line.level == "fresh"
    assert line.text == "data as of 10:42:04 UTC · 6 s behind · tumbling windows 1 s behind · log lines 2 s behind " \
                        "· refreshes every 2 s"


def test_a_part_no_fresher_than_the_page_or_never_stored_adds_nothing():
    sooner = {"tumbling windows": pipeline.WINDOW_ROWS}
    same = freshness(NOW, {"windows": ago(3)}, ["windows"], STALE_AFTER_S, 2.0, sooner=sooner)
    assert same.text == "data as of 10:42:07 UTC · 3 s behind · refreshes every 2 s"
    within_a_second = freshness(NOW, {"windows": ago(3), "provisional_windows": ago(2.5)}, ["windows"],
                                STALE_AFTER_S, 2.0, sooner=sooner)
    assert "tumbling" not in within_a_second.text
    unstored = freshness(NOW, {"accept": ago(3)}, ["accept"], STALE_AFTER_S, 2.0, sooner=sooner)
    assert "tumbling" not in unstored.text


def test_a_fresh_part_does_not_make_a_stale_page_fresh():
    line = freshness(NOW, {"windows": ago(600), "provisional_windows": ago(1)}, ["windows"], STALE_AFTER_S, 2.0,
                     sooner={"tumbling windows": pipeline.WINDOW_ROWS})
    assert line.level == "stale"
    assert line.text.startswith("Stale: data as of 10:32:10 UTC · 10 min behind · tumbling windows 1 s behind")


def test_a_last_batch_older_than_the_threshold_is_marked_stale_and_says_what_to_check():
    line = freshness(NOW, {"windows": ago(600)}, ["windows"], STALE_AFTER_S, 2.0)
    assert line.level == "stale"
    assert line.text.startswith("Stale: data as of 10:32:10 UTC · 10 min behind")
    assert "no newer batch for over 15 s" in line.text and "is the stream job running" in line.text


def test_the_threshold_itself_is_still_fresh_and_just_past_it_is_stale():
    assert freshness(NOW, {"windows": ago(15)}, ["windows"], STALE_AFTER_S, 2.0).level == "fresh"
    assert freshness(NOW, {"windows": ago(16)}, ["windows"], STALE_AFTER_S, 2.0).level == "stale"


def test_no_batch_stored_yet_says_so_without_a_time():
    line = freshness(NOW, {}, ["accept", "windows"], STALE_AFTER_S, 2.0)
    assert line.level == "none"
    assert line.text.startswith("No batch stored yet: is the stream job running?")
    assert "None" not in line.text and "1970" not in line.text and "as of" not in line.text


def test_a_query_that_stored_no_batch_yet_makes_the_page_stale_and_is_named():
    line = freshness(NOW, {"windows": ago(2)}, ["windows", "keyed_windows"], STALE_AFTER_S, 2.0)
    assert line.level == "stale"
    assert line.text.startswith("data as of 10:42:08 UTC · 2 s behind")
    assert "no batch of keyed_windows stored yet" in line.text


def test_a_batch_of_another_day_shows_its_date():
    line = freshness(NOW, {"windows": ago(2 * 86_400 + 30)}, ["windows"], STALE_AFTER_S, 2.0)
    assert line.text.startswith("Stale: data as of 2026-11-26 10:41:40 UTC · 2 d behind")


def test_a_store_clock_ahead_of_the_dashboards_reads_zero_behind_never_negative():
    line = freshness(NOW, {"windows": NOW + timedelta(seconds=3)}, ["windows"], STALE_AFTER_S, 2.0)
    assert line.level == "fresh" and "· 0 s behind ·" in line.text


def test_the_line_says_the_refresh_interval_or_that_refresh_is_off():
    assert freshness(NOW, {"windows": ago(1)}, ["windows"], STALE_AFTER_S, 10.0).text.endswith(
        "refreshes every 10 s")
    assert freshness(NOW, {"windows": ago(1)}, ["windows"], STALE_AFTER_S, None).text.endswith("refresh off")


@pytest.mark.parametrize(("seconds", "text"), [(0, "0 s"), (59.6, "60 s"), (119, "119 s"), (120, "2 min"),
                                               (7_199, "119 min"), (7_200, "2 h"), (172_800, "2 d")])
def test_ages_are_whole_units_of_at_least_two(seconds: float, text: str):
    assert age_text(seconds) == text


def test_the_stale_threshold_is_three_trigger_intervals_by_default_and_follows_the_config(tmp_path):
    assert stale_after_s(built_in(tmp_path)) == 3 * 5.0
    config = built_in(tmp_path, stream={"trigger_interval_s": 1}, dashboard={"stale_after_triggers": 10})
    assert stale_after_s(config) == 10.0


def test_pages_refresh_every_2_s_by_default():
    assert DashboardConfig().refresh_s == 2                     # the model's default
    checked_in = tomllib.loads((REPO / "eventide.toml").read_text())
    assert checked_in["dashboard"]["refresh_s"] == 2            # and the shipped file's


def test_the_sidebar_offers_short_intervals_the_configured_one_and_off(tmp_path):
    assert refresh_options(built_in(tmp_path)) == [1, 2, 5, 10, 30, None]
    odd = built_in(tmp_path, dashboard={"refresh_s": 3600})
    assert refresh_options(odd) == [1, 2, 5, 10, 30, 3600, None]


@pytest.mark.parametrize(("param", "chosen"), [("off", None), ("10", 10.0), ("2.0", 2.0), (None, 2.0),
                                               ("0.001", 2.0), ("nan", 2.0), ("-5", 2.0), ("abc", 2.0)])
def test_a_refresh_in_the_url_is_taken_only_when_it_is_one_the_sidebar_offers(param: str | None, chosen: object):
    assert parse_refresh(param, [1.0, 2.0, 5.0, 10.0, 30.0, None], 2.0) == chosen


def test_the_store_names_the_queries_as_the_job_does():
    assert pipeline.QUERIES == (vocabulary.ACCEPT_QUERY, vocabulary.WINDOWS_QUERY, vocabulary.KEYED_WINDOWS_QUERY)
