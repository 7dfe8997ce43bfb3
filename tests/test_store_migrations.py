"""Migrations: ordered, applied once, idempotent, through the same HTTP client as every component."""

from __future__ import annotations

import re

from eventide.config import load_config
from store.client import connect
from store.migrations import apply_migrations, migration_files, statements
from tests.conftest import own_database


def test_migration_files_are_ordered_and_numbered():
    names = [name for name, _ in migration_files()]
    assert names == sorted(names) and all(n[:4].isdigit() for n in names)


def test_statements_split_on_semicolons_at_line_end_and_drop_comments():
    sql = "-- a comment; not a statement\nCREATE TABLE a (x String DEFAULT ';');\n\nCREATE TABLE b (y UInt8);\n"
    assert statements(sql) == ["CREATE TABLE a (x String DEFAULT ';')", "CREATE TABLE b (y UInt8)"]


def test_apply_twice_applies_once_on_a_fresh_database(tmp_path, store_url):
    config = load_config(environ={}, root=str(tmp_path), store={"url": store_url, "database": own_database("m")})
    first = apply_migrations(config)
    assert first == [name for name, _ in migration_files()]
    assert apply_migrations(config) == []
    with connect(config) as client:
        tables = {r[0] for r in client.query("SHOW TABLES").result_rows}
    assert {"window_aggregates", "dead_letters", "schema_migrations"} <= tables


def test_a_statement_ending_in_a_comment_is_split_from_the_next():
    sql = "CREATE TABLE a (x UInt8) TTL x;   -- keep a month; or so\nCREATE VIEW v AS SELECT 1;\n"
    assert statements(sql) == ["CREATE TABLE a (x UInt8) TTL x", "CREATE VIEW v AS SELECT 1"]
    for name, text in migration_files():               # every statement of every file alone, none with two
        assert not any(re.search(r";[ \t]*(--[^\n]*)?\n", s) for s in statements(text)), name
