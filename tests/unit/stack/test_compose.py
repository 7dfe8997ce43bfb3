"""docker-compose.yml (production) checked against the code, statically: there is no Docker engine here.

Every eventide service's environment builds a valid configuration, its command is a valid ``eventide`` command line,
its published port is the one that configuration listens on, and only the gateway and the dashboard are published;
the Kafka brokers carry exactly the settings ``stack.broker`` gives its own brokers for that replication; the store
URL, the Spark master URL, the brokers' addresses and the checkpoint volume agree across services; secrets come from
the environment only; ClickHouse has a writer and a read-only user (deploy/clickhouse-users.xml), no passwordless
one, and each service holds only the store credentials it uses.
"""

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from eventide.config import Config, load_config
from stack import broker
from stack.cli import build_parser
from store.server.guard.policy import READER_SYSTEM_TABLES
from tests.support.stack import REPO

COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
KAFKA = sorted(name for name, s in SERVICES.items() if s.get("image", "").startswith("apache/kafka"))
EVENTIDE = sorted(name for name, s in SERVICES.items() if s.get("build") == ".")
SPARK_WORKERS = sorted(name for name, s in SERVICES.items() if "org.apache.spark.deploy.worker.Worker"
                       in s.get("command", []))
# What an operator must export; stand-ins here. ${VAR:-default} takes its default.
SECRETS = {"CLICKHOUSE_PASSWORD": "writer-s3cret", "CLICKHOUSE_READER_PASSWORD": "reader-s3cret",
           "EVENTIDE_GATEWAY_TOKENS": '["t0ken-of-at-least-16-chars"]',
           "DASHBOARD_SIGN_IN": "password", "DASHBOARD_PASSWORD": "a shared passphrase",
           "GRAFANA_ADMIN_PASSWORD": "grafana-s3cret"}
STORE_WRITERS = {"init", "stream-job", "alerting"}          # migrations, the job's sinks, the alert tables
STORE_READERS = {"dashboard", "alerting"}
REFERENCE = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def interpolate(value: Any) -> str:
    def one(match: re.Match[str]) -> str:
        name, kind, rest = match.groups()
        if name in SECRETS:
            return SECRETS[name]
        assert kind == "-", f"${{{name}}} has no default and is not a known secret"
        return rest
    return REFERENCE.sub(one, str(value))


def environment(service: str) -> dict[str, str]:
    return {key: interpolate(value) for key, value in SERVICES[service].get("environment", {}).items()}


def config_of(service: str) -> Config:
    return load_config(environ=environment(service), root=str(REPO))


def container_ports(service: str) -> set[int]:
    return {int(str(p).rsplit(":", 1)[-1]) for p in SERVICES[service].get("ports", [])}


def option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_the_compose_file_has_the_production_services():
    assert len(KAFKA) == 3
    assert {"clickhouse", "spark-master", "stream-job", "gateway", "alerting", "dashboard"} <= set(SERVICES)
    assert len(SPARK_WORKERS) == 2


@pytest.mark.parametrize("service", EVENTIDE)
def test_every_eventide_service_has_a_valid_config_and_command(service):
    config = config_of(service)                       # raises ConfigError naming the field
    command = SERVICES[service]["command"]
    if command[0] == "eventide":
        build_parser().parse_args(command[1:])        # exits (SystemExit) on an unknown command or option
    else:
        assert command[0] == "spark-class" and command[1].startswith("org.apache.spark.deploy.")
    assert not config.kafka.managed                                 # the cluster's brokers
    # The ClickHouse server for the services that use the store; the others (Spark daemons, gateway) get no store
    # settings and so no credential.
    assert config.store.embedded == (service not in STORE_WRITERS | STORE_READERS)
    assert config.kafka.replication_factor == 3 and config.kafka.min_insync_replicas == 2


@pytest.mark.parametrize(("service", "section"), [("gateway", "gateway"), ("dashboard", "dashboard")])
def test_published_ports_are_the_ports_the_config_listens_on(service, section):
    config = config_of(service)
    listens = getattr(config, section)
    assert listens.host == "0.0.0.0"                 # reachable from outside its container
    # the gateway also serves OTLP/HTTP's standard port (otlp.port), on the same host
    also = {config.otlp.port} if service == "gateway" and config.otlp.port else set()
    assert container_ports(service) == {listens.port} | also


def test_brokers_carry_the_settings_eventide_gives_its_own_brokers():
    config = config_of("stream-job")
    nodes = [broker.Node(int(environment(name)["KAFKA_NODE_ID"]), SERVICES[name]["hostname"], 9092, 9093,
                         Path("/var/lib/kafka"), name) for name in KAFKA]
    replication = broker.Replication(config.kafka.replication_factor, config.kafka.min_insync_replicas)
    for node in nodes:
        expected = dict(line.split("=", 1) for line in
                        broker.server_properties(config, node, nodes, replication).splitlines() if line)
        env = environment(node.service)
        actual = {key[len("KAFKA_"):].lower().replace("_", "."): value for key, value in env.items()
                  if key.startswith("KAFKA_")}
        expected.pop("listeners")                     # bound on every interface in a container
        assert actual.items() >= expected.items(), node.service
        assert len(base64.urlsafe_b64decode(env["CLUSTER_ID"] + "==")) == 16   # Kafka's Uuid
    assert config.kafka.bootstrap_servers.split(",") == [f"{n.host}:{n.port}" for n in nodes]


def test_only_the_gateway_and_the_dashboard_are_published_on_the_host():
    published = {name for name, service in SERVICES.items() if service.get("ports")}
    assert published == {"gateway", "dashboard", "grafana"}
    assert SERVICES["grafana"]["profiles"] == ["grafana"]     # started only when asked for
    for name, service in SERVICES.items():
        assert "network_mode" not in service, name     # host networking would publish every port


CLICKHOUSE_USERS = REPO / "deploy" / "clickhouse-users.xml"


def clickhouse_users() -> dict[str, ET.Element]:
    """The users the ClickHouse service gets from its mounted users file, by name."""
    mounts = dict(v.split(":", 1) for v in SERVICES["clickhouse"]["volumes"])
    assert mounts["./deploy/clickhouse-users.xml"] == "/etc/clickhouse-server/users.d/eventide.xml:ro"
    return {user.tag: user for user in ET.parse(CLICKHOUSE_USERS).getroot().find("users")}


def test_clickhouse_has_a_writer_and_a_read_only_user_with_passwords_from_the_environment():
    users = clickhouse_users()
    root = ET.parse(CLICKHOUSE_USERS).getroot()
    env = SERVICES["clickhouse"]["environment"]
    assert users["default"].get("remove") == "remove"           # the image's passwordless default user is gone
    assert str(env["CLICKHOUSE_SKIP_USER_SETUP"]) == "1" and "CLICKHOUSE_USER" not in env
    for name, variable in (("eventide", "CLICKHOUSE_WRITER_PASSWORD"),
                           ("eventide_reader", "CLICKHOUSE_READER_PASSWORD")):
        user = users[name]
        password = user.find("password")
        assert password is not None and password.get("from_env") == variable and not (password.text or "").strip()
        assert env[variable].startswith("${") and ":?" in env[variable]          # required, no default
        assert not any("password" in child.tag and child is not password for child in user), name
        grants = [q.text for q in user.find("grants")]
        assert all(re.fullmatch(r"GRANT [A-Z ,]+ ON (eventide\.\*|system\.[a-z*]+)", g) for g in grants), grants
    reader_profile = root.find(f"profiles/{users['eventide_reader'].findtext('profile')}")
    assert reader_profile.findtext("readonly") == "2"
    assert reader_profile.find("constraints/readonly/const") is not None   # a client cannot lift readonly
    reader_grants = [q.text for q in users["eventide_reader"].find("grants")]
    assert reader_grants[0] == "GRANT SELECT ON eventide.*"
    # the reader reads the system tables the embedded store's guard lets its reader read, no other
    assert {g.removeprefix("GRANT SELECT ON system.") for g in reader_grants[1:]} <= READER_SYSTEM_TABLES
    assert set(users) == {"default", "eventide", "eventide_reader"}


def test_each_service_holds_only_the_store_credentials_it_uses():
    clickhouse = SERVICES["clickhouse"]["environment"]
    for name in EVENTIDE:
        env = SERVICES[name].get("environment", {})
        config = config_of(name)
        url = urlparse(config.store.url)
        if name in STORE_WRITERS:
            assert url.username == "eventide" and url.password is None                # no password in the URL
            assert env["EVENTIDE_STORE__PASSWORD"] == clickhouse["CLICKHOUSE_WRITER_PASSWORD"], name
        elif name in STORE_READERS:      # the reader only, also as its "writer": it cannot write
            assert url.username == "eventide_reader" and url.password is None
            assert env["EVENTIDE_STORE__PASSWORD"] == clickhouse["CLICKHOUSE_READER_PASSWORD"], name
        else:
            assert not any(key.startswith("EVENTIDE_STORE__") for key in env), name
        if name in STORE_READERS:
            assert config.store.reader_user == "eventide_reader"
            assert env["EVENTIDE_STORE__READER_PASSWORD"] == clickhouse["CLICKHOUSE_READER_PASSWORD"], name
        if name in STORE_WRITERS | STORE_READERS:
            assert url.hostname == "clickhouse" and url.port == 8123
        assert clickhouse["CLICKHOUSE_WRITER_PASSWORD"] not in env.values() or name in STORE_WRITERS, name
    assert SERVICES["gateway"]["environment"]["EVENTIDE_GATEWAY__TOKENS"].startswith("${EVENTIDE_GATEWAY_TOKENS:?")


def test_the_default_gateway_token_or_a_passwordless_store_is_refused_in_the_compose_environment():
    from eventide.config import ConfigError

    gateway = environment("gateway")
    with pytest.raises(ConfigError, match=r"gateway\.tokens\.0"):
        load_config(environ={**gateway, "EVENTIDE_GATEWAY__TOKENS": '["dev-token-change-me"]'}, root=str(REPO))
    job = environment("stream-job")
    with pytest.raises(ConfigError, match=r"store\.password"):
        load_config(environ={**job, "EVENTIDE_STORE__PASSWORD": ""}, root=str(REPO))


def test_the_dashboard_needs_a_sign_in_in_the_compose_environment():
    """Published on every interface, the dashboard must be given a sign-in: none is refused at start, and each
    sign-in's settings come from the environment."""
    from eventide.config import ConfigError

    dashboard = environment("dashboard")
    assert SERVICES["dashboard"]["environment"]["EVENTIDE_DASHBOARD__SIGN_IN"].startswith("${DASHBOARD_SIGN_IN:?")
    assert config_of("dashboard").dashboard.sign_in == "password"
    with pytest.raises(ConfigError, match=r"dashboard\.sign_in"):
        load_config(environ={**dashboard, "EVENTIDE_DASHBOARD__SIGN_IN": "none"}, root=str(REPO))
    with pytest.raises(ConfigError, match=r"dashboard\.password"):
        load_config(environ={**dashboard, "EVENTIDE_DASHBOARD__PASSWORD": ""}, root=str(REPO))
    oidc = {**dashboard, "EVENTIDE_DASHBOARD__SIGN_IN": "oidc",
            "EVENTIDE_DASHBOARD__OIDC_SERVER_METADATA_URL": "https://idp.example.com/.well-known/openid-configuration",
            "EVENTIDE_DASHBOARD__OIDC_CLIENT_ID": "eventide", "EVENTIDE_DASHBOARD__OIDC_CLIENT_SECRET": "s3cret",
            "EVENTIDE_DASHBOARD__ALLOWED_DOMAINS": '["example.com"]'}
    with pytest.raises(ConfigError, match=r"dashboard\.oidc_redirect_uri"):     # 0.0.0.0 is no public URL
        load_config(environ=oidc, root=str(REPO))
    public = load_config(environ={**oidc, "EVENTIDE_DASHBOARD__OIDC_REDIRECT_URI":
                                  "https://dashboard.example.com/oauth2callback"}, root=str(REPO)).dashboard
    assert public.sign_in == "oidc" and public.allowed_domains == ["example.com"]


def test_spark_master_workers_and_job_agree():
    config = config_of("stream-job")
    master = SERVICES["spark-master"]["command"]
    assert config.stream.master == f"spark://{option(master, '--host')}:{option(master, '--port')}"
    assert SERVICES["stream-job"]["command"] == ["eventide", "job", "--submit"]
    assert config.stream.driver_host == SERVICES["stream-job"]["hostname"]   # executors connect back to the driver
    for worker in SPARK_WORKERS:
        command = SERVICES[worker]["command"]
        assert command[2] == config.stream.master
        assert option(command, "--host") == SERVICES[worker]["hostname"]
        assert int(option(command, "--cores")) >= config.cluster.executor_cores
        assert _bytes(option(command, "--memory")) >= _bytes(config.cluster.executor_memory)


def test_checkpoints_are_one_volume_shared_by_the_driver_and_every_worker():
    config = config_of("stream-job")
    for service in ("stream-job", *SPARK_WORKERS):
        mounts = dict(v.split(":", 1)[::-1] for v in SERVICES[service]["volumes"])
        assert mounts.get(str(config.checkpoint_dir)) == "checkpoints", service


def test_every_long_running_service_has_a_healthcheck_restart_policy_and_declared_volumes():
    declared = set(COMPOSE["volumes"])
    for name, service in SERVICES.items():
        one_shot = service.get("restart") == "no"
        assert one_shot or ("healthcheck" in service and service.get("restart") == "unless-stopped"), name
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):          # a file or folder of this repository, mounted
                assert (REPO / source).exists(), f"{name}: {source} missing"
                continue
            assert source in declared, f"{name}: volume {source} not declared"
        for dependency in service.get("depends_on", {}):
            assert dependency in SERVICES, f"{name} depends on unknown {dependency}"


def _bytes(size: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    return int(size[:-1]) * units[size[-1].lower()] if size[-1].isalpha() else int(size)


def test_grafana_reads_the_store_as_the_reader_through_the_provisioned_data_source_and_dashboard():
    grafana = REPO / "deploy" / "grafana"
    source_text = (grafana / "provisioning" / "datasources" / "eventide.yaml").read_text()
    [source] = yaml.safe_load(source_text)["datasources"]
    env = environment("grafana")
    # every variable the data source names is set, to the reader's credentials on the compose network
    assert set(re.findall(r"\$\{(\w+)\}", source_text)) <= set(env)
    assert (env["EVENTIDE_READER_USER"], env["EVENTIDE_STORE_HOST"], env["EVENTIDE_STORE_PORT"]) == (
        "eventide_reader", "clickhouse", "8123")
    assert env["EVENTIDE_READER_PASSWORD"] == SECRETS["CLICKHOUSE_READER_PASSWORD"]
    assert source["type"] == "grafana-clickhouse-datasource" and source["jsonData"]["protocol"] == "http"
    # the dashboard's panels use that data source, and the provider loads the folder the service mounts
    [provider] = yaml.safe_load((grafana / "provisioning" / "dashboards" / "eventide.yaml").read_text())["providers"]
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in SERVICES["grafana"]["volumes"] if v.startswith("./"))
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    panels = json.loads((grafana / "dashboards" / "eventide.json").read_text())["panels"]
    assert panels and all(t["datasource"]["uid"] == source["uid"] for p in panels for t in p["targets"])
