"""The one configuration model: file + env overrides, and errors that name the field."""

from __future__ import annotations

import re

import pytest

from eventide.config import ConfigError, load_config, to_environ


def test_defaults_put_everything_under_the_checkout(tmp_path):
    config = load_config(environ={}, root=str(tmp_path))
    assert config.data_dir == tmp_path / "var"
    assert config.store_url == "http://127.0.0.1:18123" and config.store.embedded   # served by `store serve`
    assert config.store_data_dir == tmp_path / "var" / "clickhouse"
    assert config.checkpoint_dir == tmp_path / "var" / "checkpoints"
    assert config.kafka.bootstrap == "127.0.0.1:19092" and config.kafka.managed


@pytest.mark.parametrize(("master", "shuffle_partitions", "partitions"), [
    ("local[2]", None, 2),                   # one state store per core of a local master
    ("local[3,2]", None, 3),
    ("local", None, 1),
    ("spark://host:7077", None, 4),          # a cluster: 4 unless set
    ("local[2]", 8, 8),                      # set: as set
])
def test_state_partitions_follow_the_local_cores_unless_set(tmp_path, master, shuffle_partitions, partitions):
    stream = {"master": master} if shuffle_partitions is None else {"master": master,
                                                                    "shuffle_partitions": shuffle_partitions}
    assert load_config(environ={}, root=str(tmp_path), stream=stream).stream.partitions == partitions


def test_local_star_takes_every_core_of_the_machine(tmp_path, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert load_config(environ={}, root=str(tmp_path), stream={"master": "local[*]"}).stream.partitions == 6


def test_file_then_environment_overrides(tmp_path):
    file = tmp_path / "eventide.toml"
    file.write_text('[kafka]\nport = 29092\n[stream]\ntumbling_windows_s = [5, 30]\n')
    config = load_config(file, environ={"EVENTIDE_KAFKA__PORT": "39092",
                                        "EVENTIDE_STORE__URL": "http://clickhouse:8123",
                                        "EVENTIDE_STORE__PASSWORD": "p"})   # a server off loopback needs one
    assert config.kafka.port == 39092
    assert config.stream.tumbling_windows_s == [5, 30]
    assert config.store_url == "http://clickhouse:8123"
    assert config.root == tmp_path  # relative paths resolve against the file's directory


@pytest.mark.parametrize(("env", "field"), [
    ({"EVENTIDE_KAFKA__PORT": "not-a-port"}, "kafka.port"),
    ({"EVENTIDE_STREAM__TUMBLING_WINDOWS_S": "[10, 10]"}, "stream.tumbling_windows_s"),
    ({"EVENTIDE_STORE__URL": "mysql://x"}, "store.url"),
    ({"EVENTIDE_STORE__URL": "chdb:///var/clickhouse"}, "store.url"),
    ({"EVENTIDE_STORE__PORT": "19092"}, "store.port"),          # the broker's port
    ({"EVENTIDE_STORE__PORT": "0"}, "store.port"),
    ({"EVENTIDE_KAFKA__NO_SUCH_FIELD": "1"}, "kafka.no_such_field"),
    ({"EVENTIDE_STREAM__ALLOWED_LATENESS_S": "-1"}, "stream.allowed_lateness_s"),
    ({"EVENTIDE_STREAM__HOPPING_WINDOWS": '[{"length_s": 300, "hop_s": 70}]'}, "stream.hopping_windows.0"),
    ({"EVENTIDE_STREAM__SLIDING_LOG_LEVELS": '["loud"]'}, "stream.sliding_log_levels.0"),
    ({"EVENTIDE_STREAM__SLIDING_SERIES": '[{"kind": "metric"}]'}, "stream.sliding_series.0.name"),
    ({"EVENTIDE_STREAM__SESSION_GAP_S": "0"}, "stream.session_gap_s"),
    ({"EVENTIDE_KAFKA__MIN_INSYNC_REPLICAS": "2"}, "kafka"),                 # more than the 1 replica
    ({"EVENTIDE_CLUSTER__KAFKA_PORTS": "[29192, 29193]"}, "cluster"),        # 2 brokers, 3 controller ports
    ({"EVENTIDE_CLUSTER__REPLICATION_FACTOR": "4"}, "cluster"),             # more replicas than brokers
    ({"EVENTIDE_CLUSTER__SPARK_MASTER_PORT": "19092"}, "cluster.spark_master_port"),   # the local broker's port
])
def test_bad_config_names_the_field(tmp_path, env, field):
    with pytest.raises(ConfigError) as info:
        load_config(environ=env, root=str(tmp_path))
    assert field in str(info.value)


def test_invalid_toml_and_missing_file_are_reported(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[kafka\nport = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, environ={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", environ={})


def test_child_processes_rebuild_the_same_config(tmp_path):
    config = load_config(environ={}, root=str(tmp_path), kafka={"events_topic": "t1"}, store={"database": "d1"})
    child = load_config(environ=to_environ(config))
    assert (child.kafka, child.store, child.envelope, child.dashboard) == (
        config.kafka, config.store, config.envelope, config.dashboard)
    assert (child.data_dir, child.cache_dir, child.checkpoint_dir, child.store_url) == (
        config.data_dir, config.cache_dir, config.checkpoint_dir, config.store_url)


def test_the_cluster_defaults_are_three_replicated_brokers_and_two_workers(tmp_path):
    from stack import cluster

    config = load_config(environ={}, root=str(tmp_path))
    assert len(config.cluster.kafka_ports) == 3 and len(config.cluster.spark_worker_webui_ports) == 2
    assert (config.cluster.replication_factor, config.cluster.min_insync_replicas) == (3, 2)
    on_cluster = cluster.job_config(config)
    assert on_cluster.kafka.bootstrap == "127.0.0.1:19192,127.0.0.1:19193,127.0.0.1:19194"
    assert on_cluster.stream.master == "spark://127.0.0.1:17077"
    assert on_cluster.checkpoint_dir == tmp_path / "var" / "cluster" / "checkpoints"
    assert (on_cluster.kafka.replication_factor, on_cluster.kafka.min_insync_replicas) == (3, 2)


# Unsafe settings: fine on loopback, refused where others can connect, naming the field --------------------------
SECRET = "x" * 16 + "-secret-token"


@pytest.mark.parametrize(("settings", "field"), [
    ({"gateway": {"host": "0.0.0.0", "tokens": ["dev-token-change-me"]}}, "gateway.tokens.0"),      # the known token
    ({"gateway": {"host": "0.0.0.0", "tokens": [SECRET, "short-token"]}}, "gateway.tokens.1"),     # < 16 chars
    ({"gateway": {"host": "10.1.2.3", "tokens": [{"token": "dev-token-change-me", "apps": ["a"]}]}},
     "gateway.tokens.0"),                                                                          # table form
    ({"gateway": {"host": "gateway.example", "tokens": ["0123456789abcde"]}}, "gateway.tokens.0"),
    ({"store": {"url": "http://clickhouse:8123"}}, "store.password"),             # a server without a password
    ({"store": {"url": "https://eventide@10.0.0.5:8443"}}, "store.password"),
    ({"store": {"host": "0.0.0.0"}}, "store.host"),                               # the embedded store off loopback
    ({"store": {"host": "192.168.1.10"}}, "store.host"),
    ({"stream": {"dedup_horizon_s": 7200, "accepted_retention_s": 3600}}, "stream.dedup_horizon_s"),
    ({"stream": {"accepted_retention_s": 300}}, "stream.dedup_horizon_s"),      # the default horizon (330 s)
])
def test_given_an_unsafe_setting_then_startup_is_refused_naming_the_field(tmp_path, settings, field):
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, root=str(tmp_path), **settings)
    assert field in str(info.value)


def test_given_unsafe_settings_from_the_environment_then_the_message_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"gateway\.tokens\.0.*not a known default and at least 16 characters"):
        load_config(environ={"EVENTIDE_GATEWAY__HOST": "0.0.0.0",
                             "EVENTIDE_GATEWAY__TOKENS": '["dev-token-change-me"]'}, root=str(tmp_path))
    with pytest.raises(ConfigError, match=r"stream\.dedup_horizon_s: 330 s \(its default.*accepted_retention_s \(60"):
        load_config(environ={"EVENTIDE_STREAM__ACCEPTED_RETENTION_S": "60"}, root=str(tmp_path))


@pytest.mark.parametrize("settings", [
    {"gateway": {"host": "127.0.0.1", "tokens": ["dev-token-change-me"]}},        # the dev token, on loopback
    {"gateway": {"host": "localhost", "tokens": ["t"]}},
    {"gateway": {"host": "::1", "tokens": ["t"]}},
    {"gateway": {"host": "0.0.0.0", "tokens": [SECRET, {"token": SECRET + "2", "apps": ["a"]}]}},   # secret tokens
    {"store": {"url": "http://127.0.0.1:8123"}},                                  # a local server, no password
    {"store": {"url": "http://clickhouse:8123", "password": "p"}},
    {"store": {"url": "http://eventide:p@clickhouse:8123"}},                      # the password in the URL
    {"store": {"host": "127.0.0.2"}},
    {"stream": {"dedup_horizon_s": 3600, "accepted_retention_s": 3600}},          # equal: the horizon is held
    {"stream": {"deduplicate": False, "accepted_retention_s": 60}},                # no dedup: no horizon to hold
])
def test_given_safe_settings_then_they_load(tmp_path, settings):
    load_config(environ={}, root=str(tmp_path), **settings)


def test_the_checked_in_eventide_toml_loads_and_documents_every_retention(tmp_path):
    from tests.support.stack import REPO

    config = load_config(REPO / "eventide.toml", environ={})
    text = (REPO / "eventide.toml").read_text()
    for field in config.retention.model_fields:
        assert f"{field} = " in text, field            # each default written in the file
    assert config.retention.shortest_days == min(config.retention.model_dump().values())


def test_a_retention_whose_ttl_would_overflow_datetime_is_refused_naming_the_field() -> None:
    # Ten years from a 2026 event stay within DateTime; a century would wrap into the past and delete every row.
    assert load_config(environ={}, retention={"window_results_days": 3650}).retention.window_results_days == 3650
    with pytest.raises(ConfigError, match=r"retention\.window_results_days"):
        load_config(environ={}, retention={"window_results_days": 36_500})


OIDC = {"sign_in": "oidc", "oidc_server_metadata_url": "https://idp.example.com/.well-known/openid-configuration",
        "oidc_client_id": "eventide", "oidc_client_secret": "s3cret"}


@pytest.mark.parametrize(("dashboard", "field"), [
    ({"host": "0.0.0.0"}, "dashboard.sign_in"),                          # no sign-in, every interface
    ({"host": "10.1.2.3", "sign_in": "none"}, "dashboard.sign_in"),
    ({"host": "dashboard.example"}, "dashboard.sign_in"),               # a name is not loopback
    ({"sign_in": "password"}, "dashboard.password"),                     # no password
    ({"sign_in": "password", "password": "elevenchars"}, "dashboard.password"),
    ({**OIDC, "oidc_client_id": ""}, "dashboard.oidc_client_id"),
    ({**OIDC, "oidc_client_secret": ""}, "dashboard.oidc_client_secret"),
    ({**OIDC, "oidc_server_metadata_url": ""}, "dashboard.oidc_server_metadata_url"),
    ({**OIDC, "oidc_server_metadata_url": "http://idp.example.com/.well-known/openid-configuration"},
     "dashboard.oidc_server_metadata_url"),                               # the signing keys over plain http
    ({**OIDC, "host": "0.0.0.0"}, "dashboard.oidc_redirect_uri"),        # 0.0.0.0 is no URL to come back to
    ({**OIDC, "oidc_redirect_uri": "https://dash.example.com/callback"}, "dashboard.oidc_redirect_uri"),
    ({"allowed_domains": ["example.com"]}, "dashboard.allowed_domains"),  # a list no sign-in applies
    ({"sign_in": "password", "password": "a long shared secret", "allowed_emails": ["a@example.com"]},
     "dashboard.allowed_emails"),
])
def test_a_dashboard_without_a_working_sign_in_off_loopback_is_refused_naming_the_field(tmp_path, dashboard, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        load_config(environ={}, root=str(tmp_path), dashboard=dashboard)


def test_the_dashboard_off_loopback_is_refused_from_the_environment_too(tmp_path):
    with pytest.raises(ConfigError, match=r"dashboard\.sign_in.*0\.0\.0\.0"):
        load_config(environ={"EVENTIDE_DASHBOARD__HOST": "0.0.0.0"}, root=str(tmp_path))


@pytest.mark.parametrize("dashboard", [
    {},                                                                   # loopback, no sign-in: a laptop
    {"host": "::1"},
    {"host": "0.0.0.0", "sign_in": "password", "password": "twelve chars"},
    {**OIDC, "host": "0.0.0.0", "oidc_redirect_uri": "https://dash.example.com/oauth2callback",
     "allowed_domains": ["example.com"]},
    {**OIDC, "oidc_server_metadata_url": "http://127.0.0.1:9000/.well-known/openid-configuration"},  # a local IdP
])
def test_a_dashboard_with_a_sign_in_or_on_loopback_loads(tmp_path, dashboard):
    load_config(environ={}, root=str(tmp_path), dashboard=dashboard)


def test_oidc_defaults_come_back_to_the_dashboard_itself_and_lists_ignore_case(tmp_path):
    d = load_config(environ={}, root=str(tmp_path), dashboard={
        **OIDC, "port": 8600, "allowed_domains": ["@Example.COM"], "allowed_emails": [" Bob@Example.com "]}).dashboard
    assert d.oidc_callback_url == "http://127.0.0.1:8600/oauth2callback"
    assert (d.allowed_domains, d.allowed_emails) == (["example.com"], ["bob@example.com"])
