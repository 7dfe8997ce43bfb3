"""`eventide stack up | status | down` on a fresh data directory: real broker, real topics, served and migrated
store."""

from __future__ import annotations

from confluent_kafka.admin import ConfigResource

from stack import broker, services
from stack.services import free_port
from store.client import connect
from tests.support.pipeline import eventide_cli


def test_stack_up_status_down(base_config, tmp_path):
    config = base_config.model_copy(update={
        "paths": base_config.paths.model_copy(update={"data_dir": tmp_path / "stack"}),
        "kafka": base_config.kafka.model_copy(update={"port": free_port(), "controller_port": free_port()}),
        "store": base_config.store.model_copy(update={"url": "", "port": free_port()}),   # its own embedded store
    })
    up = eventide_cli(config, "stack", "up")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        assert broker.is_reachable(config)
        admin = broker.admin(config)
        topics = admin.list_topics(timeout=10).topics
        assert len(topics[config.kafka.events_topic].partitions) == config.kafka.events_partitions
        resource = ConfigResource(ConfigResource.Type.TOPIC, config.kafka.events_topic)
        [described] = admin.describe_configs([resource]).values()
        assert described.result(timeout=10)["message.timestamp.type"].value == "LogAppendTime"
        with connect(config) as client:
            tables = {r[0] for r in client.query("SHOW TABLES").result_rows}
        assert {"window_aggregates", "dead_letters"} <= tables

        status = eventide_cli(config, "stack", "status")
        said = {line.split(":")[0]: line.rsplit(") ", 1)[-1]
                for line in status.stdout.splitlines() if line.startswith(("store:", "kafka:"))}
        assert said == {"store": "reachable", "kafka": "reachable"}, status.stdout     # not "NOT reachable"
        assert "kafka        running" in status.stdout
        assert "store        running" in status.stdout and config.store_url in status.stdout

        again = eventide_cli(config, "stack", "up")  # idempotent: nothing restarted, nothing re-created
        assert again.returncode == 0 and "already present" in again.stdout
    finally:
        down = eventide_cli(config, "stack", "down")
    assert down.returncode == 0 and "stopped kafka" in down.stdout and "stopped store" in down.stdout
    assert not services.state(config, broker.SERVICE).running
    assert not services.state(config, "store").running
    assert not broker.is_reachable(config, timeout_s=1)
