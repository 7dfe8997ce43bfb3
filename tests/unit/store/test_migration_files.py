"""Migrations: numbered and ordered, split into statements (applied to a real store: tests/integration)."""

from __future__ import annotations

import re

from store.migrations import migration_files, statements
from tests.support.stack import REPO


def test_migration_files_are_ordered_and_numbered():
    """Every ``.sql`` file of sql/ is a migration, named ``NNNN_<name>.sql``; the numbers run 1, 2, ... N with no
    gap and none twice (two helpers adding the same next number is the mistake this catches), and the files apply in
    that order."""
    on_disk = sorted(path.name for path in (REPO / "sql").glob("*.sql"))
    names = [name for name, _ in migration_files()]
    assert sorted(names) == on_disk
    assert all(re.fullmatch(r"\d{4}_[a-z0-9_]+\.sql", name) for name in names), names
    assert [int(name[:4]) for name in names] == list(range(1, len(on_disk) + 1)), names


def test_statements_split_on_semicolons_at_line_end_and_drop_comments():
    sql = "-- a comment; not a statement\nCREATE TABLE a (x String DEFAULT ';');\n\nCREATE TABLE b (y UInt8);\n"
    assert statements(sql) == ["CREATE TABLE a (x String DEFAULT ';')", "CREATE TABLE b (y UInt8)"]


def test_a_statement_ending_in_a_comment_is_split_from_the_next():
    sql = "CREATE TABLE a (x UInt8) TTL x;   -- keep a month; or so\nCREATE VIEW v AS SELECT 1;\n"
    assert statements(sql) == ["CREATE TABLE a (x UInt8) TTL x", "CREATE VIEW v AS SELECT 1"]
    for name, text in migration_files():               # every statement of every file alone, none with two
        assert not any(re.search(r";[ \t]*(--[^\n]*)?\n", s) for s in statements(text)), name
