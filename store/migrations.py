"""Apply ``sql/NNNN_*.sql`` in order, once each, to the configured store (chDB or a ClickHouse server), then set
every table's TTL from the configuration (``[retention]``).

The TTLs are not written in the migration files: a file is applied once, and a retention changed in the config has
to take effect at the next start. So after the files, each table's TTL is compared with the one the config asks
for and changed (``ALTER TABLE ... MODIFY TTL``) only when it differs: running the migrations again changes
nothing, and an unchanged retention never re-materializes a table's TTL.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from importlib import resources

from clickhouse_connect.driver.client import Client

from eventide.config import Config, RetentionConfig
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


# Every table of sql/ with its retention family (a ``RetentionConfig`` field, ``<family>_days``) and the time
# column its TTL counts from: the table's partition key where it has one (whole parts then expire together).
# tests/integration/test_retention.py fails for a table of sql/ missing here.
TTL_TABLES: dict[str, tuple[str, str]] = {
    "window_aggregates": ("window_results", "window_start"),
    "corrections": ("window_results", "window_start"),
    "sliding_windows": ("keyed_windows", "window_end"),
    "sessions": ("keyed_windows", "session_start"),
    "open_sessions": ("keyed_windows", "written_at"),
    "stragglers": ("rejected", "window_start"),
    "duplicates": ("rejected", "kafka_timestamp"),
    "dead_letters": ("rejected", "kafka_timestamp"),
    "kafka_data_loss": ("rejected", "detected_at"),
    "pipeline_progress": ("progress", "recorded_at"),
    "dedup_state": ("progress", "recorded_at"),
    "dedup_partitions": ("progress", "recorded_at"),
    "alert_states": ("alerts", "updated_at"),
    "alert_transitions": ("alerts", "recorded_at"),
    "alert_notifications": ("alerts", "delivered_at"),
    "alert_delivery_failures": ("alerts", "failed_at"),
    "alert_group_notifications": ("alerts", "decided_at"),
    "alert_silences": ("alerts", "ends_at"),
    "device_clocks": ("clocks", "last_received"),
    "device_clocks_per_minute": ("clocks", "minute"),
    "logs": ("logs", "corrected_event_time"),
}
# Tables without a TTL, and why: each holds a bounded number of rows whose loss would change results.
KEPT_WHOLE = {
    "query_watermarks_kept": "one row per streaming query: the finality clock (query_watermarks)",
    "keyed_sessions_covered": "one row: which provisional open sessions still stand (open_sessions_now)",
    "schema_migrations": "one row per migration file: the ledger of what was applied",
}
_TTL = re.compile(r" TTL (.+?)(?: SETTINGS |$)")


def ttl_expression(retention: RetentionConfig, family: str, column: str) -> str:
    """The TTL of a table of ``family`` counting from ``column``, as ClickHouse prints it (so it compares equal to
    ``system.tables.engine_full`` once set): whole days as days, else seconds."""
    days = getattr(retention, f"{family}_days")
    interval = (f"toIntervalDay({int(days)})" if float(days).is_integer()
                else f"toIntervalSecond({round(days * 86400)})")
    return f"toDateTime({column}) + {interval}"


def current_ttl(client: Client, database: str, table: str) -> str | None:
    """The TTL expression of ``table`` as ClickHouse prints it; None when it has none (or does not exist)."""
    rows = client.query("SELECT engine_full FROM system.tables WHERE database = {d:String} AND name = {t:String}",
                        parameters={"d": database, "t": table}).result_rows
    found = _TTL.search(rows[0][0]) if rows else None
    return found.group(1).strip() if found else None


def apply_retention(config: Config, client: Client) -> list[str]:
    """Set each table's TTL (``TTL_TABLES``) from ``config.retention`` where it differs; returns the tables changed.
    Tables not created (yet) by any migration are skipped."""
    database = config.store.database
    columns: dict[str, set[str]] = {}
    for table, name in client.query(
            "SELECT table, name FROM system.columns WHERE database = {d:String}", parameters={"d": database},
    ).result_rows:
        columns.setdefault(table, set()).add(name)
    changed = []
    for table, (family, column) in TTL_TABLES.items():
        if table not in columns:
            continue
        if column not in columns[table]:
            raise ValueError(f"{table}: no column {column} for its TTL to count from (store.migrations.TTL_TABLES)")
        wanted = ttl_expression(config.retention, family, column)
        if current_ttl(client, database, table) != wanted:
            client.command(f"ALTER TABLE {table} MODIFY TTL {wanted}")
            changed.append(table)
    return changed


def migration_files() -> list[tuple[str, str]]:
    """(file name, SQL text) of every migration, in the order they apply."""
    files = [f for f in resources.files("sql").iterdir() if f.name.endswith(".sql")]
    return [(f.name, f.read_text()) for f in sorted(files, key=lambda f: f.name)]


def statements(sql: str) -> list[str]:
    """Split a migration into statements (``;`` at a line end, or before a ``--`` comment ending the line);
    ``--`` comment lines are dropped. Each is sent alone: a ClickHouse server runs one statement per request."""
    body = "\n".join(line for line in sql.splitlines() if not line.strip().startswith("--"))
    return [s.strip() for s in re.split(r";[ \t]*(?:--[^\n]*)?(?:\n|$)", body) if s.strip()]


def apply_migrations(config: Config, url: str | None = None) -> list[str]:
    """Create the database, apply pending migrations, then set every table's TTL from ``config.retention``.
    Returns the names of the files applied now (idempotent: a second run applies and alters nothing)."""
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
        apply_retention(config, client)
    return applied_now
