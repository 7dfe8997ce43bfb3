"""Log search against a real store (dashboard/log_search.py): on lines inserted into ``logs`` as the stream job
writes them, a search by words, phrases, app, level, logger and tags returns exactly the expected lines, newest
first, page after page, marked late when their event was a dropped straggler; patterns count lines per masked
message and level; dead-lettered log records come with their reason."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dashboard import log_search
from dashboard.log_search import LogQuery, mask
from eventide.config import Config, load_config
from store.client import connect
from store.log_query import where_clause
from store.migrations import apply_migrations
from tests.support import dashboard_data as data
from tests.support.stack import own_database

_ids = itertools.count()


def log_line(t: datetime, message: str, *, app: str = "shop", level: str = "info", name: str = "app.server",
             device: str = "device-1", user: str = "", tags: dict[str, str] | None = None,
             event_id: str | None = None, offset: int | None = None) -> dict[str, Any]:
    """One accepted log line as the job writes it into ``logs`` (naive ``t`` is UTC; no clock offset)."""
    n = next(_ids)
    return {"corrected_event_time": t, "event_time": t, "received_time": t + timedelta(milliseconds=20),
            "app": app, "level": level, "name": name, "device": device, "user": user, "message": message,
            "tags": tags or {}, "event_id": event_id or f"ev-{n:06d}", "source_partition": 0,
            "source_offset": n if offset is None else offset}


# Against the store ----------------------------------------------------------------------------------------------

NOW = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
RANGE = (NOW - timedelta(hours=1), NOW + timedelta(minutes=1))


@pytest.fixture
def store(tmp_path, store_url) -> Config:
    config = load_config(environ={}, root=str(tmp_path), store={"url": store_url, "database": own_database("logs")})
    apply_migrations(config)
    return config


def insert(config: Config, table: str, rows: list[dict[str, Any]]) -> None:
    with connect(config) as client:
        data.insert_rows(client, table, rows)


def search(config: Config, limit: int = 100, offset: int = 0, span: tuple[datetime, datetime] = RANGE,
           **filters: Any) -> list[str]:
    """The messages of the matching lines of ``span`` in the answer's order."""
    with connect(config, role="reader") as client:
        lines = log_search.search_lines(client, LogQuery(*span, **filters), limit, offset)
    return lines["message"].tolist()


SEARCHED = [  # newest first
    ("Connection refused to db-12 after 30 ms", "shop", "error", "app.db", {"region": "eu"}),
    ("user u42 logged in", "shop", "info", "app.server", {"region": "us"}),
    ("connection to db-12 refused", "search", "error", "app.db", {"region": "us"}),
    ("Reconnection refused later", "search", "warning", "app.http", {}),
    ("db-120 refused connection", "shop", "error", "app.db", {"region": "eu", "version": "2"}),
]


@pytest.fixture
def searched(store: Config) -> Config:
    """The lines of ``SEARCHED``, a minute apart, and one matching line just before the searched range."""
    lines = [log_line(NOW - timedelta(minutes=i + 1), message, app=app, level=level, name=name, tags=tags)
             for i, (message, app, level, name, tags) in enumerate(SEARCHED)]
    lines.append(log_line(RANGE[0] - timedelta(seconds=1), "connection refused (before the range)"))
    insert(store, "logs", lines)
    return store


def messages(*indexes: int) -> list[str]:
    return [SEARCHED[i][0] for i in indexes]


def test_a_word_matches_whole_words_case_insensitively_newest_first(searched):
    assert search(searched, text="refused") == messages(0, 2, 3, 4)
    assert search(searched, text="CONNECTION") == messages(0, 2, 4)         # not "Reconnection"
    assert search(searched, text="connection refused") == messages(0, 2, 4)  # both words, anywhere
    assert search(searched, text="refuse") == []                              # whole words only


def test_a_phrase_matches_its_words_side_by_side(searched):
    assert search(searched, text='"connection refused"') == messages(0)
    assert search(searched, text="db-12") == messages(0, 2)                  # not db-120
    assert search(searched, text='"refused to" db-12') == messages(0)


def test_app_level_name_and_tag_filters_all_apply(searched):
    assert search(searched, apps=("shop",), levels=("error",)) == messages(0, 4)
    assert search(searched, names=("app.db",)) == messages(0, 2, 4)
    assert search(searched, levels=("error", "warning"), apps=("search",)) == messages(2, 3)
    assert search(searched, tags=(("region", "eu"),)) == messages(0, 4)
    assert search(searched, tags=(("region", "eu"), ("version", "2"))) == messages(4)
    assert search(searched, tags=(("region", "ap"),)) == []
    assert search(searched, text="refused", tags=(("region", "us"),), names=("app.db",)) == messages(2)


def test_user_text_is_a_parameter_never_sql(searched):
    assert search(searched, text="x') OR 1=1 --", apps=("shop' OR '1'='1",)) == []
    assert search(searched, tags=(("region']", "eu"),)) == []


def test_count_and_pickers_see_the_range(searched):
    with connect(searched, role="reader") as client:
        assert log_search.count_lines(client, LogQuery(*RANGE, text="refused")) == 4
        assert log_search.count_lines(client, LogQuery(*RANGE)) == 5
        # Capped: counted up to cap + 1 ("more than cap"), exactly below it.
        assert log_search.count_lines(client, LogQuery(*RANGE), cap=3) == 4
        assert log_search.count_lines(client, LogQuery(*RANGE, text="refused"), cap=10) == 4
        assert log_search.distinct_values(client, *RANGE, "app") == ["search", "shop"]
        assert log_search.distinct_values(client, *RANGE, "name") == ["app.db", "app.http", "app.server"]


GRANULE_ROWS = 8192
"""Rows per granule of ``logs`` (ClickHouse's default ``index_granularity``: the table does not set it)."""


def token_index_granules(plan: str) -> tuple[int, int]:
    """(granules kept, granules before) of the ``message_tokens`` skip index, from ``EXPLAIN indexes = 1``."""
    lines = [line.strip() for line in plan.splitlines()]
    start = lines.index("Name: message_tokens")
    granules = next(line for line in lines[start:] if line.startswith("Granules: "))
    kept, total = granules.removeprefix("Granules: ").split("/")
    return int(kept), int(total)


def test_a_word_search_reads_only_granules_the_token_index_keeps(store):
    # Four granules of one app, level and hour; the searched words are in one line of the newest granule only.
    lines = [log_line(NOW - timedelta(milliseconds=100 * k), "request served", offset=k)
             for k in range(1, 4 * GRANULE_ROWS)]
    lines.append(log_line(NOW, "upstream connection refused", offset=0))
    insert(store, "logs", lines)
    query = LogQuery(*RANGE, text='refused "connection refused"')
    where = where_clause(query)
    with connect(store, role="reader") as client:
        plan = "\n".join(r[0] for r in client.query(f"EXPLAIN indexes = 1 SELECT count() FROM logs WHERE {where.sql}",
                                                    parameters=where.parameters).result_rows)
        assert log_search.count_lines(client, query) == 1
    kept, total = token_index_granules(plan)
    assert total >= 4 and kept == 1, plan


def test_pages_of_lines_follow_each_other_newest_first(store):
    # 25 lines over 4 hours, past the first slice a search reads (log_search.FIRST_SLICE), two at each time: ties
    # are ordered by event id.
    day = (NOW - timedelta(days=1), RANGE[1])
    assert timedelta(seconds=1200 * 12) > log_search.FIRST_SLICE
    lines = [log_line(NOW - timedelta(seconds=1200 * (k // 2)), f"tick {k}", event_id=f"id-{k:02d}")
             for k in range(25)]
    insert(store, "logs", lines)
    pages = [search(store, limit=10, offset=offset, span=day) for offset in (0, 10, 20)]
    assert [len(p) for p in pages] == [10, 10, 5]
    assert [m for page in pages for m in page] == [f"tick {k}" for k in range(25)]
    assert search(store, limit=10, offset=30, span=day) == []
    assert search(store, limit=3, offset=11, span=day) == ["tick 11", "tick 12", "tick 13"]


def test_a_line_is_late_when_its_event_was_dropped_as_a_straggler(store):
    late = log_line(NOW - timedelta(minutes=3), "late line", event_id="ev-late", app="shop")
    same_id_other_app = log_line(NOW - timedelta(minutes=2), "on time", event_id="ev-late", app="search")
    on_time = log_line(NOW - timedelta(minutes=1), "on time too", event_id="ev-ok", app="shop")
    insert(store, "logs", [late, same_id_other_app, on_time])
    window = NOW - timedelta(minutes=3, seconds=5)
    # Dropped from two windows (a hopping event): one line, late once.
    insert(store, "stragglers", [
        {**data.straggler(NOW, offset, window_start=window, app="shop", kind="log", window_kind=kind),
         "event_id": "ev-late", "corrected_event_time": late["corrected_event_time"]}
        for offset, kind in ((late["source_offset"], "tumbling"), (late["source_offset"], "hopping"))])
    with connect(store, role="reader") as client:
        lines = log_search.search_lines(client, LogQuery(*RANGE), 10)
    assert list(zip(lines["message"], lines["late"], strict=True)) == [
        ("on time too", False), ("on time", False), ("late line", True)]


def test_patterns_count_lines_per_masked_message_and_level(store):
    at = [NOW - timedelta(seconds=s) for s in range(10)]
    insert(store, "logs", [
        log_line(at[5], "user u1 logged in"), log_line(at[1], "user u22 logged in"),
        log_line(at[3], "user u333 logged in"),
        log_line(at[2], "user u4 logged in", level="error"),
        log_line(at[4], "disk full on /dev/sda1", level="error"),
        log_line(at[0], "disk full on /dev/sdb1", level="error", app="search"),
    ])
    with connect(store, role="reader") as client:
        patterns = log_search.message_patterns(client, LogQuery(*RANGE), top=10)
        shop_errors = log_search.message_patterns(client, LogQuery(*RANGE, apps=("shop",), levels=("error",)))
    assert patterns[["pattern", "level", "lines"]].values.tolist() == [
        ["user <*> logged in", "info", 3],
        ["disk full on /dev/<*>", "error", 2],
        ["user <*> logged in", "error", 1],
    ]
    first = patterns.iloc[0]
    assert first["example"] in {"user u1 logged in", "user u22 logged in", "user u333 logged in"}
    assert first["newest"] == at[1]
    assert shop_errors[["pattern", "lines"]].values.tolist() == [["disk full on /dev/<*>", 1],
                                                                 ["user <*> logged in", 1]]


def test_the_store_masks_as_python_does(store):
    samples = ["user u42 logged in from 10.0.3.7", "trace 550e8400-e29b-41d4-a716-446655440000 0x1F",
               "commit deadbeefcafe v2 naïve 12ms", "nothing variable here", "a_b9 c-7 __x1"]
    with connect(store, role="reader") as client:
        masked = client.query("SELECT arrayMap(m -> replaceRegexpAll(m, {re:String}, {mask:String}), "
                              "{s:Array(String)})", parameters={"re": log_search.MASK_PATTERN, "mask": log_search.MASK,
                                          "s": samples}).result_rows[0][0]
    assert masked == [mask(s) for s in samples]


def test_dead_lettered_log_records_are_listed_with_their_reason(store):
    def dead(offset: int, raw: str, reason: str, seconds_ago: float) -> dict[str, Any]:
        row = data.dead_letter(NOW - timedelta(seconds=seconds_ago), offset, reason=reason)
        return {**row, "raw": raw, "raw_bytes": len(raw)}

    log = '{"v":1,"kind":"log","app":"shop","device":"d1","name":"app","level":"fatal","message":"boom"}'
    metric = '{"v":1,"kind":"metric","app":"shop","device":"d1","name":"x","value":"NaN"}'
    truncated = '{"v":1, "kind": "log","app":"search","message":"a very long mess'
    insert(store, "dead_letters", [dead(1, log, "level: not one of debug, info, warning, error, critical", 30),
                                   dead(2, metric, "value: not finite", 20),
                                   dead(3, truncated, "unparseable JSON", 10),
                                   dead(4, log, "too old", 7200)])
    with connect(store, role="reader") as client:
        found = log_search.dead_lettered_logs(client, *RANGE, limit=10)
        shop = log_search.dead_lettered_logs(client, *RANGE, limit=10, apps=["shop"])
    assert found[["source_offset", "reason", "app", "level", "message"]].values.tolist() == [
        [3, "unparseable JSON", "", "", ""],
        [1, "level: not one of debug, info, warning, error, critical", "shop", "fatal", "boom"],
    ]
    assert shop["source_offset"].tolist() == [1]


def test_patterns_of_a_busy_range_are_those_of_its_newest_minutes_up_to_a_line_budget(store):
    minute = NOW.replace(second=0) - timedelta(minutes=3)
    at = [minute + timedelta(minutes=m, seconds=s) for m in range(3) for s in (5, 10, 15)]
    insert(store, "logs", [log_line(at[0], "job 1 started"), log_line(at[1], "job 2 started"),
                           log_line(at[2], "job 3 started"),                               # the oldest minute: 3
                           log_line(at[3], "job 4 done"), log_line(at[4], "job 5 done"),    # the next one: 2
                           log_line(at[6], "job 6 done"), log_line(at[7], "job 7 failed")])  # the newest: 2

    def patterns(max_lines: int | None) -> tuple[list, datetime, int]:
        with connect(store, role="reader") as client:
            found = log_search.message_patterns(client, LogQuery(*RANGE), max_lines=max_lines)
        return found[["pattern", "lines"]].values.tolist(), found.attrs["since"], found.attrs["lines"]

    assert patterns(None) == ([["job <*> done", 3], ["job <*> started", 3], ["job <*> failed", 1]], RANGE[0], 7)
    assert patterns(7) == patterns(None)
    # 4 lines at most: the two newest minutes (4 lines); the oldest minute would make 7.
    assert patterns(4) == ([["job <*> done", 3], ["job <*> failed", 1]], minute + timedelta(minutes=1), 4)
    # The newest minute alone is over the budget: it is counted whole.
    assert patterns(1) == ([["job <*> done", 1], ["job <*> failed", 1]], minute + timedelta(minutes=2), 2)
