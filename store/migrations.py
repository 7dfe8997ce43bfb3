"""Apply ``sql/NNNN_*.sql`` in order, once each, to the configured store (chDB or a ClickHouse server)."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from importlib import resources

from eventide.config import Config
from store.client import connect

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations
(
    name        String,
    checksum    String,
    applied_at  DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
ORDER BY name
"""


def migration_files() -> list[tuple[str, str]]:
    """(file name, SQL text) of every migration, in the order they apply."""
    files = [f for f in resources.files("sql").iterdir() if f.name.endswith(".sql")]
    return [(f.name, f.read_text()) for f in sorted(files, key=lambda f: f.name)]


def statements(sql: str) -> list[str]:
    """Split a migration into statements (``;`` at a line end); ``--`` comment lines are dropped."""
    body = "\n".join(line for line in sql.splitlines() if not line.strip().startswith("--"))
    return [s.strip() for s in re.split(r";\s*(?:\n|$)", body) if s.strip()]


def apply_migrations(config: Config, url: str | None = None) -> list[str]:
    """Create the database and apply pending migrations. Returns the names applied now (idempotent)."""
    database = config.store.database
    if not _IDENTIFIER.match(database):
        raise ValueError(f"store.database: {database!r} is not a plain identifier")
    with connect(config, database=None, url=url) as client:
        client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    applied_now: list[str] = []
    with connect(config, url=url) as client:
        client.command(_LEDGER)
        done = {row[0] for row in client.query("SELECT name FROM schema_migrations FINAL").result_rows}
        for name, sql in migration_files():
            if name in done:
                continue
            for statement in statements(sql):
                client.command(statement)
            client.insert("schema_migrations",
                          [[name, hashlib.sha256(sql.encode()).hexdigest(), datetime.now(UTC)]],
                          column_names=["name", "checksum", "applied_at"])
            applied_now.append(name)
    return applied_now
