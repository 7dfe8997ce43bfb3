"""Migrations are applied once, idempotently, through the same HTTP client as every component."""

from __future__ import annotations

from eventide.config import load_config
from store.client import connect
from store.migrations import apply_migrations, migration_files
from tests.support.stack import own_database


def test_apply_twice_applies_once_on_a_fresh_database(tmp_path, store_url):
    config = load_config(environ={}, root=str(tmp_path), store={"url": store_url, "database": own_database("m")})
    first = apply_migrations(config)
    assert first == [name for name, _ in migration_files()]
    assert apply_migrations(config) == []
    with connect(config) as client:
        tables = {r[0] for r in client.query("SHOW TABLES").result_rows}
    assert {"window_aggregates", "dead_letters", "schema_migrations"} <= tables
