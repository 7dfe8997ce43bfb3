"""Log search (dashboard/log_search.py), the pure part: how a search text is read (words, phrases, as ClickHouse's
tokenizer splits them), how a message is masked into a pattern, and the Logs page's links. What the store answers
is in tests/integration/test_log_search.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dashboard import log_search
from dashboard.log_search import logs_url, mask, parse_tag, parse_text, parse_time

# Reading a search text ------------------------------------------------------------------------------------------


def test_words_are_single_tokens_and_phrases_are_quoted_or_hold_separators():
    assert parse_text('Refused "Connection refused" db-12 TIMEOUT') == (
        ["refused", "timeout"], ["connection refused", "db 12"])


def test_a_quoted_single_word_is_a_word_repeats_count_once_and_an_unclosed_quote_runs_to_the_end():
    assert parse_text('"error" error ERROR "disk full') == (["error"], ["disk full"])


def test_terms_without_tokens_are_ignored():
    assert parse_text('  -  "" ... ') == ([], [])
    assert parse_text("") == ([], [])


def test_tokens_split_like_clickhouse_ascii_alphanumerics_and_non_ascii_characters():
    assert log_search.tokens("café-au-lait naïve_x /api/v2?id=7") == ["café", "au", "lait", "naïve", "x", "api",
                                                                     "v2", "id", "7"]
    assert parse_text("Ünïcode") == (["ünïcode"], [])


# Masking --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("message", "pattern"), [
    ("user u42 logged in from 10.0.3.7", "user <*> logged in from <*>.<*>.<*>.<*>"),
    ("GET /api/items/99887 200 in 187 ms", "GET /api/items/<*> <*> in <*> ms"),
    ("trace 550e8400-e29b-41d4-a716-446655440000 done", "trace <*> done"),
    ("lock 0xDEADbeef held", "lock <*> held"),
    ("commit deadbeefcafe by bob", "commit <*> by bob"),
    ("connection refused to db-12", "connection refused to db-<*>"),
    ("disk full", "disk full"),
])
def test_variable_parts_of_a_message_are_masked(message, pattern):
    assert mask(message) == pattern


# Links ----------------------------------------------------------------------------------------------------------

def test_a_logs_link_carries_every_filter_and_its_times_read_back():
    since, until = datetime(2026, 11, 26, 18, 0, tzinfo=UTC), datetime(2026, 11, 26, 18, 10, 30, 250_000, tzinfo=UTC)
    url = logs_url(apps=["shop"], levels=["error", "critical"], since=since, until=until, text='"db down"',
                   tags=[("region", "eu")])
    assert url == ("logs?app=shop&level=error&level=critical&from=2026-11-26T18%3A00%3A00.000Z"
                   "&to=2026-11-26T18%3A10%3A30.250Z&q=%22db+down%22&tag=region%3Deu")
    assert parse_time("2026-11-26T18:10:30.250Z") == until
    assert parse_time("2026-11-26 18:00:00") == since                   # naive: UTC
    assert parse_time(str(int(until.timestamp() * 1000))) == until      # epoch milliseconds
    assert logs_url() == "logs"
    with pytest.raises(ValueError):
        parse_time("yesterday")


def test_tag_filters_are_key_equals_value():
    assert parse_tag("region=eu") == ("region", "eu")
    assert parse_tag("k=a=b") == ("k", "a=b")
    assert parse_tag("region") is None and parse_tag("=eu") is None


# Drill-down clicks ----------------------------------------------------------------------------------------------

def test_a_clicked_point_names_its_trace_and_bucket():
    from dashboard import common

    state = {"selection": {"points": [
        {"curve_number": 1, "x": "2026-11-26 18:00:15"},                 # a 10 s bar reports its middle
        {"curve_number": 0, "x": "2026-11-26T18:00:20+00:00"},
        {"curve_number": 5, "x": "2026-11-26 18:00:00"},                 # no such trace
    ]}}
    picked = common.selected_points(state, ["shop", "search"])
    assert [(name, common.bucket_start(t, 10)) for name, t in picked] == [
        ("search", datetime(2026, 11, 26, 18, 0, 10, tzinfo=UTC)),
        ("shop", datetime(2026, 11, 26, 18, 0, 20, tzinfo=UTC))]
    assert common.selected_points(None, ["shop"]) == []
