"""ClickHouse schema as ordered, idempotent migrations (``NNNN_name.sql``), applied by
:func:`store.migrations.apply_migrations` — the one function tests, the demo and production use."""
