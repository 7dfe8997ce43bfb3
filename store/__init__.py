"""ClickHouse access shared by the stream job, the dashboard and the tests."""
