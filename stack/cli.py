"""``eventide``: the project's one command.

    eventide stack up        fetch jars, start the local Kafka broker and the embedded store, create topics, migrate
    eventide stack down      stop everything this checkout started (load, dashboard, job, store, broker)
    eventide stack status    what runs where
    eventide demo            stack up + stream job + demo load + gateway (OTLP on 4318) + dashboard, in the background
    eventide migrate         apply sql/ migrations to the configured store
    eventide store serve     serve the embedded chDB store over ClickHouse's HTTP interface (foreground)
    eventide job             run the stream job in the foreground (--until-idle: drain Kafka and exit;
                             --submit: spark-submit it to the cluster at stream.master instead)
    eventide load            run the demo load generator in the foreground
    eventide dashboard       run the Streamlit dashboard in the foreground
    eventide gateway         run the HTTP gateway (POST /v1/events) in the foreground
    eventide alerts          run the alert evaluator in the foreground (--once: one pass)
    eventide alerts check [FILE]   validate alert rules; eventide alerts test FILE: run rule tests
    eventide alerts silence add MATCHER... --comment WHY [--duration 2h] | expire ID... | list [--all]
    eventide cluster up      a Spark standalone master + workers and a 3-broker KRaft Kafka cluster on loopback
    eventide cluster submit  spark-submit the stream job to that cluster (foreground; --until-idle: drain, exit)
    eventide cluster env     the EVENTIDE_* settings that point other components at the cluster's brokers
    eventide cluster status | down
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
import urllib.request
from pathlib import Path

from eventide import jars
from eventide.config import Config, ConfigError, load_config
from stack import broker, cluster, services

JOB, LOAD, DASHBOARD, ALERTS, STORE, GATEWAY = "stream-job", "demo-load", "dashboard", "alerting", "store", "gateway"
# stopped in this order (writers before the store), then the broker
_BACKGROUND = (GATEWAY, LOAD, ALERTS, DASHBOARD, JOB, STORE)


def _python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


# Streamlit options of every dashboard server (the CLI's and the browser tests'): no browser, no usage stats,
# and the "viewer" toolbar, which has no "Deploy" button (this dashboard is not deployed to Streamlit's cloud).
# A served dashboard does not reload its own source, so nothing watches its files (a watcher re-checks every module
# of the app several times a second, and a change would offer a rerun). Nor does it run a full collection after
# every script run, each chart refresh included: that walks every object the server holds (Streamlit, Plotly,
# pandas: over 100,000), a fifth of the server's CPU with a page open; Python's own collector still runs.
STREAMLIT_OPTIONS = ("--server.headless", "true", "--browser.gatherUsageStats", "false",
                     "--client.toolbarMode", "viewer", "--server.fileWatcherType", "none",
                     "--runner.postScriptGC", "false")


def dashboard_argv(config: Config) -> list[str]:
    """``streamlit run`` of the dashboard as ``config`` says; writes the sign-in's secrets file first
    (``dashboard.auth_secrets``). ``config`` has passed the sign-in checks: off loopback it has a sign-in."""
    from dashboard.auth_secrets import streamlit_options

    app = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"
    return _python_module("streamlit", "run", str(app), *STREAMLIT_OPTIONS, *streamlit_options(config),
                          "--server.address", config.dashboard.host, "--server.port", str(config.dashboard.port))


def dashboard_url(config: Config) -> str:
    return f"http://{config.dashboard.host}:{config.dashboard.port}"


def gateway_url(config: Config) -> str:
    return f"http://{config.gateway.host}:{config.gateway.port}"


def otlp_url(config: Config) -> str:
    """Where OpenTelemetry SDKs send: the gateway on OTLP/HTTP's standard port (``otlp.port``), else its own."""
    return f"http://{config.gateway.host}:{config.otlp.port or config.gateway.port}"


def stack_up(config: Config) -> None:
    print("resolving jars (Maven Central, cached under", config.cache_dir, ")")
    jars.spark_kafka_connector_jars(config)
    if config.kafka.managed:
        jars.kafka_broker_jars(config)
        print(f"starting Kafka {config.kafka.version} (KRaft) on {config.kafka.bootstrap}")
        broker.start(config)
    created = broker.ensure_topics(config)
    print("topics:", ", ".join(created) if created else "already present")
    if config.store.embedded:
        start_store(config)
    from store.migrations import apply_migrations

    applied = apply_migrations(config)
    print(f"store {config.store_url}: {len(applied)} migration(s) applied")


def start_store(config: Config) -> None:
    """Start ``eventide store serve`` in the background (unless it runs) and wait until it answers."""
    from store.client import wait_until_up

    if services.state(config, STORE).running:
        print(f"store already running at {config.store_url}")
    else:
        services.start(config, STORE, _python_module("store.server"))
        print(f"starting the embedded store (chDB at {config.store_data_dir}) on {config.store_url}")
    if not wait_until_up(config, config.store.start_timeout_s):
        raise SystemExit(f"the store did not answer at {config.store_url} within {config.store.start_timeout_s:.0f} s;"
                         f" see {services.log_file(config, STORE)}")


def stack_down(config: Config) -> None:
    for name in _BACKGROUND:
        if services.stop(config, name):
            print(f"stopped {name}")
    if config.kafka.managed and broker.stop(config):
        print("stopped kafka")


def stack_status(config: Config) -> int:
    print(f"data dir:  {config.data_dir}")
    from store.client import redact, wait_until_up

    kind = f"embedded, chDB at {config.store_data_dir}" if config.store.embedded else "server"
    up = "reachable" if wait_until_up(config, timeout_s=0) else "NOT reachable"
    print(f"store:     {redact(config.store_url)} ({kind}) {up}")
    print(f"kafka:     {config.kafka.bootstrap} ({'managed here' if config.kafka.managed else 'external'}) "
          f"{'reachable' if broker.is_reachable(config) else 'NOT reachable'}")
    for name in (broker.SERVICE, STORE, JOB, LOAD, ALERTS, GATEWAY, DASHBOARD):
        st = services.state(config, name)
        urls = {DASHBOARD: dashboard_url(config), STORE: config.store_url,
                GATEWAY: f"{gateway_url(config)} (OTLP {otlp_url(config)})"}
        where = f" {urls[name]}" if name in urls and st.running else ""
        print(f"  {name:<12} {'running' if st.running else 'stopped':<8} pid={st.pid or '-':<8} log={st.log}{where}")
    return 0


def _wait_http(url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            time.sleep(0.5)
    return False


def demo(config: Config) -> None:
    stack_up(config)
    from alerting.rules import rules_for

    rules_for(config)   # invalid rules stop the demo here, naming the rule and field
    silences_api = demo_silences_api(config)
    for name, argv in ((JOB, _python_module("analytics.job")),
                       (LOAD, _python_module("stack.demo_load")),
                       (ALERTS, _python_module("alerting.service")),
                       (GATEWAY, _python_module("ingest.gateway")),
                       (DASHBOARD, dashboard_argv(config))):
        if services.state(config, name).running:
            print(f"{name} already running")
            continue
        services.start(config, name, argv, env=silences_api if name in (ALERTS, DASHBOARD) else None)
        print(f"started {name} (log: {services.log_file(config, name)})")
    url = dashboard_url(config)
    if not _wait_http(f"{url}/_stcore/health", 60):
        raise SystemExit(f"dashboard did not come up; see {services.log_file(config, DASHBOARD)}")
    if not _wait_http(f"{gateway_url(config)}/health", 30):
        raise SystemExit(f"gateway did not come up; see {services.log_file(config, GATEWAY)}")
    print(f"\ndashboard: {url}\n(first windows appear within a minute; stop everything with: ./run down)")
    print(f"OpenTelemetry apps: OTEL_EXPORTER_OTLP_ENDPOINT={otlp_url(config)} with the header "
          "Authorization: Bearer <a gateway.tokens token>")


DEMO_SILENCES_PORT = 9095


def demo_silences_api(config: Config) -> dict[str, str]:
    """The settings that turn the silences API on for the demo's alerting service and dashboard (so the Alerts page
    can create and expire silences): the configured port and tokens, or port 9095 and a random token made once
    and kept in the data directory (owner-only), never a published one."""
    a = config.alerting
    if a.api_port and a.api_tokens:
        return {}
    tokens = a.api_tokens
    if not tokens:
        token_file = config.data_dir / "alerting-api-token"
        if not token_file.exists():
            token_file.parent.mkdir(parents=True, exist_ok=True)
            token_file.touch(mode=0o600)
            token_file.write_text(secrets.token_hex(24))
        tokens = [token_file.read_text().strip()]
    return {"EVENTIDE_ALERTING__API_PORT": str(a.api_port or DEMO_SILENCES_PORT),
            "EVENTIDE_ALERTING__API_TOKENS": json.dumps(tokens)}


def cluster_command(config: Config, action: str, until_idle: bool = False) -> int:
    """``eventide cluster up|down|status|submit|env``."""
    if action == "up":
        print(f"starting {len(config.cluster.kafka_ports)} Kafka brokers and a Spark master with "
              f"{len(config.cluster.spark_worker_webui_ports)} workers (logs: {config.data_dir / 'logs'})")
        cluster.up(config)
    elif action == "down":
        for name in cluster.down(config):
            print(f"stopped {name}")
        return 0
    elif action == "submit":
        return cluster.submit(cluster.job_config(config), until_idle)
    elif action == "env":
        job = cluster.job_config(config)
        for key, value in (("KAFKA__BOOTSTRAP_SERVERS", job.kafka.bootstrap_servers),
                           ("KAFKA__REPLICATION_FACTOR", job.kafka.replication_factor),
                           ("KAFKA__MIN_INSYNC_REPLICAS", job.kafka.min_insync_replicas),
                           ("STREAM__MASTER", job.stream.master),
                           ("STREAM__CHECKPOINT_DIR", job.checkpoint_dir)):
            print(f"export EVENTIDE_{key}='{value}'")
        return 0
    print("\n".join(cluster.status(config)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``eventide`` (also how docker-compose.yml's commands are checked)."""
    parser = argparse.ArgumentParser(prog="eventide", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="config file (default: $EVENTIDE_CONFIG or ./eventide.toml)")
    sub = parser.add_subparsers(dest="command", required=True)
    stack = sub.add_parser("stack", help="local stack lifecycle")
    stack.add_argument("action", choices=("up", "down", "status"))
    sub.add_parser("demo", help="stack up + job + demo load + dashboard")
    sub.add_parser("migrate", help="apply sql/ migrations")
    store = sub.add_parser("store", help="the embedded store")
    store.add_argument("action", choices=("serve",))
    job = sub.add_parser("job", help="run the stream job (foreground)")
    job.add_argument("--until-idle", action="store_true")
    job.add_argument("--submit", action="store_true", help="spark-submit the job to stream.master (a cluster)")
    load = sub.add_parser("load", help="run the demo load (foreground)")
    load.add_argument("--rate", type=float)
    load.add_argument("--duration", type=float)
    sub.add_parser("dashboard", help="run the dashboard (foreground)")
    sub.add_parser("gateway", help="run the HTTP gateway (foreground)")
    alerts = sub.add_parser("alerts", help="run the alert evaluator (foreground); `alerts check [FILE]` checks rules, "
                                           "`alerts test FILE` runs rule tests, `alerts silence ...` mutes alerts")
    alerts.add_argument("--once", action="store_true")
    alert_actions = alerts.add_subparsers(dest="action")
    check = alert_actions.add_parser("check", help="validate FILE's rules and routes against this configuration, one "
                                                   "line per problem (exit 1 if any), like `promtool check rules`")
    check.add_argument("file", nargs="?", type=Path, help="the rules file (default: alerting.rules_file)")
    rule_test = alert_actions.add_parser("test", help="run the rule tests of FILE (alerting/rule_tests.py), like "
                                                      "`promtool test rules`")
    rule_test.add_argument("file", nargs="?", type=Path, help="the tests file")
    silence = alert_actions.add_parser("silence", help="silences: add, expire, list (like amtool silence)")
    silence_actions = silence.add_subparsers(dest="silence_action", required=True)
    add = silence_actions.add_parser("add", help="mute the alerts that MATCHERS match, from now")
    add.add_argument("matchers", nargs="+", help="Alertmanager matchers, e.g. 'app=\"checkout\"' 'severity=~warn.*'")
    add.add_argument("--duration", default="2h", help="how long, e.g. 30m, 2h, 1d (default 2h)")
    add.add_argument("--comment", required=True, help="why (shown with the silence)")
    add.add_argument("--author", default=os.environ.get("USER", ""), help="who (default: $USER)")
    expire = silence_actions.add_parser("expire", help="end silences now")
    expire.add_argument("ids", nargs="+")
    listing = silence_actions.add_parser("list", help="active and pending silences (--all: ended ones too)")
    listing.add_argument("--all", action="store_true")
    on_cluster = sub.add_parser("cluster", help="Spark standalone + Kafka cluster on this machine, and the job on it")
    on_cluster.add_argument("action", choices=("up", "down", "status", "submit", "env"))
    on_cluster.add_argument("--until-idle", action="store_true", help="submit: drain Kafka, then exit")
    return parser


def check_alert_rules(config: Config, path: Path | None = None) -> int:
    """``eventide alerts check [FILE]``: print every problem of the rules, one per line, and return 1; or say how many
    rules are valid and return 0."""
    from alerting.rules import rules_for

    path = config.alert_rules_file if path is None else path
    try:
        rules = rules_for(config, path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    routed = (f", {len(rules.route)} routes below the root, {len(rules.receiver)} receivers"
              if rules.routing is not None else "")
    print(f"{path}: {len(rules.rule)} rules{routed}, no problems")
    return 0


def test_alert_rules(config: Config, path: Path | None) -> int:
    """``eventide alerts test FILE``: run the rule tests of FILE; print every failure, one per line, and return 1; or
    say how many tests passed and return 0."""
    from alerting.rule_tests import run_tests

    if path is None:
        print("alerts test: name the tests file, e.g. alerts.test.toml", file=sys.stderr)
        return 2
    try:
        count, failed = run_tests(config, path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    for line in failed:
        print(f"{path}: {line}", file=sys.stderr)
    if failed:
        return 1
    print(f"{path}: {count} tests, all pass")
    return 0


def silence_command(config: Config, args: argparse.Namespace) -> int:
    """``eventide alerts silence add|expire|list``: print the silence's id, or one line per silence."""
    from alerting import silences
    from alerting.routes import seconds_of
    from eventide.envelope import now_ms
    from store.migrations import apply_migrations

    apply_migrations(config)             # idempotent: the silences table exists before the first one
    now = now_ms()
    if args.silence_action == "add":
        try:
            seconds = float(seconds_of(args.duration))   # type: ignore[arg-type]
        except ValueError as exc:
            raise ConfigError(f"silence --duration: {exc}") from None
        silence = silences.new_silence(args.matchers, now, now + round(seconds * 1000), args.author, args.comment)
        silences.save(config, silence)
        print(silence.id)
        return 0
    if args.silence_action == "expire":
        for silence_id in args.ids:
            silences.expire(config, silence_id, now)
        return 0
    for s in silences.listed(config, now, ended=args.all):
        ends = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(s.ends_at_ms / 1000))
        print(f"{s.id}  {s.state(now):8} {' '.join(map(str, s.matchers))}  until {ends} UTC  "
              f"by {s.created_by!r}: {s.comment!r}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.config:  # background services and child processes load the same file
        os.environ["EVENTIDE_CONFIG"] = str(Path(args.config).resolve())
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        if args.command == "stack":
            if args.action == "up":
                stack_up(config)
                return stack_status(config)
            if args.action == "down":
                stack_down(config)
                return 0
            return stack_status(config)
        if args.command == "cluster":
            return cluster_command(config, args.action, args.until_idle)
        if args.command == "demo":
            demo(config)
        elif args.command == "store":
            from store import server

            return server.run(config)
        elif args.command == "migrate":
            from store.migrations import apply_migrations

            print("applied:", apply_migrations(config) or "nothing (up to date)")
        elif args.command == "job" and args.submit:
            return cluster.submit(config, args.until_idle)
        elif args.command == "job":
            from analytics import job as stream_job

            stream_job.main(["--until-idle"] if args.until_idle else [])
        elif args.command == "load":
            from stack import demo_load

            demo_load.run(config, args.rate, args.duration)
        elif args.command == "dashboard":
            os.execv(sys.executable, dashboard_argv(config))
        elif args.command == "gateway":
            from ingest.gateway import app as gateway

            return gateway.serve(config)
        elif args.command == "alerts" and args.action == "check":
            return check_alert_rules(config, args.file)
        elif args.command == "alerts" and args.action == "test":
            return test_alert_rules(config, args.file)
        elif args.command == "alerts" and args.action == "silence":
            return silence_command(config, args)
        elif args.command == "alerts":
            from alerting import service

            return service.run(config, once=args.once)
    except ConfigError as exc:  # e.g. invalid alert rules: name the rule and field, exit 2
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
