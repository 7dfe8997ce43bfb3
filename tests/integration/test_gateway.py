"""The HTTP gateway against a real broker: auth, limits, validation, transactions read back with read_committed."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from confluent_kafka import Message
from fastapi.testclient import TestClient

from eventide.config import Config, ConfigError
from eventide.envelope import log_event, metric_event, now_ms
from ingest.gateway.app import create_app
from stack import broker, cli
from stack.services import free_port
from tests.support.servers import uvicorn_in_thread

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NDJSON = {**AUTH, "Content-Type": "application/x-ndjson"}


def gateway_config(kafka: Config, name: str, *, kafka_settings: dict[str, Any] | None = None,
                   create_topics: bool = True, **gateway: Any) -> Config:
    """``kafka`` with its own events topic and gateway settings (cheaper than a full ``fresh_stack``)."""
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")[:40]
    config = kafka.model_copy(update={
        "kafka": kafka.kafka.model_copy(update={"events_topic": f"gw.{slug}", "dead_letter_topic": f"gw-dl.{slug}",
                                                **(kafka_settings or {})}),
        "gateway": kafka.gateway.model_copy(update={"tokens": [TOKEN], "producers": 2, "ack_timeout_s": 5.0,
                                                    **gateway}),
    })
    if create_topics:
        broker.ensure_topics(config)
        _wait_for_topic(config)
    return config


def _wait_for_topic(config: Config, timeout_s: float = 15.0) -> None:
    """CreateTopics returns once the controller has the topic; the broker's metadata follows a little later
    (seconds, while it is busy loading the transaction coordinator), and the gateway checks that metadata."""
    client = broker.admin(config)
    deadline = time.monotonic() + timeout_s
    while True:
        topic = client.list_topics(config.kafka.events_topic, timeout=5).topics.get(config.kafka.events_topic)
        if topic is not None and topic.error is None:
            return
        assert time.monotonic() < deadline, f"topic {config.kafka.events_topic} not visible: {topic and topic.error}"
        time.sleep(0.05)


def committed(config: Config, timeout_s: float = 20.0) -> list[Message]:
    """Every record of the events topic a ``read_committed`` reader sees (up to the last stable offset)."""
    return broker.read_committed(config, timeout_s=timeout_s)


def metric(device: str = "dev-1", **changes: Any) -> dict[str, Any]:
    t = now_ms()
    event = metric_event(app="web", device=device, name="latency_ms", value=12.5, event_time=t - 500, sent_time=t)
    event.update(changes)
    return event


@pytest.fixture(scope="module")
def shared(kafka: Config) -> Config:
    return gateway_config(kafka, "gateway_shared", max_body_bytes=4096, max_batch_events=5)


@pytest.fixture(scope="module")
def client(shared: Config) -> Iterator[TestClient]:
    """One gateway app for the tests that refuse requests before Kafka (auth, limits, parse errors)."""
    with TestClient(create_app(shared)) as test_client:
        yield test_client


def test_refuses_to_start_without_a_token(kafka: Config) -> None:
    for tokens in ([], [""]):
        config = kafka.model_copy(update={"gateway": kafka.gateway.model_copy(update={"tokens": tokens})})
        with pytest.raises(ConfigError, match=r"gateway\.tokens"):
            create_app(config)


def test_cli_gateway_command_reports_a_missing_token(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EVENTIDE_GATEWAY__TOKENS", "[]")
    assert cli.main(["gateway"]) == 2
    assert "gateway.tokens" in capsys.readouterr().err


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-token"},
                                     {"Authorization": f"Basic {TOKEN}"}, {"Authorization": "Bearer"}],
                         ids=["missing", "wrong", "not-bearer", "empty"])
def test_requests_without_a_valid_bearer_token_are_refused(client: TestClient, headers: dict[str, str]) -> None:
    response = client.post("/v1/events", json=[metric()], headers=headers)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert response.json()["error"] == "unauthorized"


def test_limits(client: TestClient) -> None:
    too_big = client.post("/v1/events", content=b"[" + b" " * 5000 + b"]", headers=AUTH)
    assert too_big.status_code == 413
    assert too_big.json()["error"] == "body_too_large"
    assert "gateway.max_body_bytes" in too_big.json()["detail"]

    six = [{"v": 1}] * 6
    as_array = client.post("/v1/events", json=six, headers=AUTH)
    as_lines = client.post("/v1/events", content="\n".join(json.dumps(e) for e in six), headers=NDJSON)
    for response in (as_array, as_lines):
        assert response.status_code == 413
        assert response.json() == {"error": "too_many_events",
                                   "detail": "6 events > gateway.max_batch_events (5)"}


def test_malformed_json_is_refused_with_its_position(client: TestClient) -> None:
    array = client.post("/v1/events", content=b'[{"v": 1},\n {"v": 1,, }]', headers=AUTH)
    assert array.status_code == 400
    assert array.json()["error"] == "malformed_json"
    assert (array.json()["line"], array.json()["column"]) == (2, 10)
    assert "line 2, column 10" in array.json()["detail"]

    lines = client.post("/v1/events", content=b'{"v": 1}\n{"v": 1\n', headers=NDJSON)
    assert lines.status_code == 400
    assert lines.json()["line"] == 2

    for bad in (b'[{"value": NaN}]', b"\xff\xfe[]"):
        assert client.post("/v1/events", content=bad, headers=AUTH).status_code == 400


def test_body_limit_cuts_off_a_chunked_or_lying_client(shared: Config) -> None:
    """A real server: the 413 comes after max_body_bytes were received, not after the whole body."""
    port = free_port()
    with uvicorn_in_thread(uvicorn.Config(create_app(shared), host="127.0.0.1", port=port, log_level="warning",
                                          lifespan="off"), start_timeout_s=10):
        head = f"POST /v1/events HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {TOKEN}\r\n"
        chunk = b"x" * 5000
        # Chunked, and the final chunk never comes.
        chunked = (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + f"{len(chunk):x}\r\n".encode() + chunk
        # Declares 10 MB and sends nothing.
        lying = (head + "Content-Length: 10000000\r\n\r\n").encode()
        for request in (chunked, lying):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(request)
                assert sock.recv(4096).startswith(b"HTTP/1.1 413")


def test_mixed_batch_writes_the_valid_events_once_and_lists_the_others(kafka: Config) -> None:
    config = gateway_config(kafka, "gateway_mixed")
    good = [metric("dev-a", received_time=1), metric("dev-b"), metric("dev-a", value=3),
            log_event(app="web", device="dev-c", name="auth", level="warning", message="slow login",
                      event_time=now_ms() - 10, sent_time=now_ms())]
    batch: list[Any] = [good[0], metric(value="12"), good[1], "not an object",
                        metric(event_time=now_ms() + 60_000), good[2], good[3], {**metric(), "id": 5}]
    before = now_ms()
    with TestClient(create_app(config)) as client:
        response = client.post("/v1/events", json=batch, headers=AUTH)
    after = now_ms()
    assert response.status_code == 207, response.text
    assert response.json() == {"accepted": 4, "rejected": [
        {"index": 1, "id": batch[1]["id"], "reason": "mistyped field: value (expected number, got STRING)"},
        {"index": 3, "id": None, "reason": "not a JSON object"},
        {"index": 4, "id": batch[4]["id"], "reason": "event_time is after sent_time"},
        {"index": 7, "id": None, "reason": "mistyped field: id (expected string, got BIGINT)"},
    ]}

    records = committed(config)
    assert sorted(json.loads(r.value())["id"] for r in records) == sorted(e["id"] for e in good)  # exactly once
    for record in records:
        event = json.loads(record.value())
        assert record.key() == event["device"].encode()
        assert before <= event["received_time"] <= after  # stamped by the gateway, the client's 1 replaced
        assert {k: v for k, v in event.items() if k != "received_time"} == \
            {k: v for k, v in next(e for e in good if e["id"] == event["id"]).items() if k != "received_time"}
    # Per-device order is kept (key = device, one partition per device).
    assert [json.loads(r.value())["id"] for r in records if r.key() == b"dev-a"] == [good[0]["id"], good[2]["id"]]


def test_ndjson_batches_with_and_without_content_type(kafka: Config) -> None:
    config = gateway_config(kafka, "gateway_ndjson")
    first, second = [metric(f"dev-{i}") for i in range(3)], [metric("dev-9")]
    with TestClient(create_app(config)) as client:
        typed = client.post("/v1/events", content="\n".join(json.dumps(e) for e in first) + "\n\n",
                            headers=NDJSON)
        detected = client.post("/v1/events", content=json.dumps(second[0]),
                               headers={**AUTH, "Content-Type": "application/x-www-form-urlencoded"})
        all_invalid = client.post("/v1/events", content='{"v": 2}\n{"v": 1}', headers=NDJSON)
        empty = client.post("/v1/events", content=b"", headers=NDJSON)
    assert (typed.status_code, typed.json()) == (200, {"accepted": 3, "rejected": []})
    assert (detected.status_code, detected.json()) == (200, {"accepted": 1, "rejected": []})
    assert all_invalid.status_code == 422
    assert [r["reason"] for r in all_invalid.json()["rejected"]] == ["unsupported envelope version: 2",
                                                                     "missing field: id"]
    assert (empty.status_code, empty.json()) == (200, {"accepted": 0, "rejected": []})
    assert sorted(json.loads(r.value())["id"] for r in committed(config)) == sorted(e["id"] for e in first + second)


def test_a_failed_transaction_is_aborted_and_nothing_is_visible(kafka: Config) -> None:
    """The broker refuses one record of the batch (larger than the topic allows): the whole batch is aborted,
    a read_committed reader sees none of it, and the gateway keeps working."""
    config = gateway_config(kafka, "gateway_abort", kafka_settings={"max_message_bytes": 1024})
    huge = metric("dev-big", tags={"blob": os.urandom(8000).hex()})  # 16 KB, still > 1 KB compressed
    small = [metric("dev-1"), metric("dev-2"), metric("dev-3")]
    with TestClient(create_app(config)) as client:
        refused = client.post("/v1/events", json=[*small, huge], headers=AUTH)
        assert refused.status_code == 503, refused.text
        assert refused.json()["written"] == "nothing"
        assert int(refused.headers["Retry-After"]) > 0
        assert committed(config) == []
        retry = client.post("/v1/events", json=small, headers=AUTH)
        assert retry.status_code == 200, retry.text
    assert sorted(json.loads(r.value())["id"] for r in committed(config)) == sorted(e["id"] for e in small)


@pytest.mark.serial   # a wall-clock bound (answers within 10 s): run alone (./run test)
def test_broker_down_gateway_starts_health_and_requests_say_503(kafka: Config) -> None:
    config = gateway_config(kafka, "gateway_down", create_topics=False,
                            kafka_settings={"bootstrap_servers": f"127.0.0.1:{free_port()}"})
    started = time.monotonic()
    with TestClient(create_app(config)) as client:
        health = client.get("/health")
        response = client.post("/v1/events", json=[metric()], headers=AUTH)
    assert time.monotonic() - started < 10
    assert health.status_code == 503
    assert health.json()["status"] == "unavailable"
    assert health.json()["broker"]["reachable"] is False
    assert response.status_code == 503
    assert int(response.headers["Retry-After"]) > 0
    assert response.json()["written"] == "nothing"
    assert "nothing" in response.json()["written"]


def test_health_reports_a_reachable_broker(client: TestClient, shared: Config) -> None:
    for path in ("/health", "/v1/health"):
        response = client.get(path)
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "ok"
        assert response.json()["broker"] == {"bootstrap": shared.kafka.bootstrap, "reachable": True,
                                             "events_topic": shared.kafka.events_topic,
                                             "events_topic_exists": True, "detail": None}


def test_openapi_documents_the_events_endpoint(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    post = doc["paths"]["/v1/events"]["post"]
    content = post["requestBody"]["content"]
    assert set(content) == {"application/json", "application/x-ndjson"}
    envelope = content["application/json"]["schema"]["items"]
    assert {"v", "id", "kind", "app", "device", "name", "event_time", "sent_time"} <= set(envelope["required"])
    assert {"200", "207", "400", "401", "413", "422", "503"} <= set(post["responses"])
    assert post["responses"]["503"]["content"]["application/json"]["schema"]["$ref"].endswith("/Unavailable")
    assert "/health" in doc["paths"]
    assert any("HTTPBearer" in scheme for scheme in doc["components"]["securitySchemes"])


def test_the_stream_job_counts_committed_batches_only(kafka: Config, spark: Any) -> None:
    """End to end: an aborted gateway batch stays invisible to the job (read_committed), a committed one counts."""
    from tests.support.pipeline import minute_in_past, run_job, window_rows
    from tests.support.stack import fresh_stack

    limited = kafka.model_copy(update={"kafka": kafka.kafka.model_copy(update={"max_message_bytes": 4096})})
    stack = fresh_stack(limited, "gateway_job")
    config = stack.model_copy(update={"gateway": stack.gateway.model_copy(update={"tokens": [TOKEN]})})
    _wait_for_topic(config)
    t0 = minute_in_past()

    def happened(offset_ms: int, value: float, device: str, **changes: Any) -> dict[str, Any]:
        # Sent now, happened in the past (an offline device): corrected_event_time = event_time + network delay.
        return metric(device, value=value, event_time=t0 + offset_ms, sent_time=now_ms(), **changes)

    with TestClient(create_app(config)) as client:
        aborted = client.post("/v1/events", headers=AUTH, json=[
            happened(1000, 100.0, "d1"), happened(2000, 100.0, "d2"),
            happened(3000, 100.0, "d3", tags={"blob": os.urandom(8000).hex()})])  # refused by the broker
        committed_batch = client.post("/v1/events", headers=AUTH,
                                      json=[happened(1000, 1.0, "d1"), happened(2000, 2.0, "d2")])
    assert aborted.status_code == 503
    assert committed_batch.status_code == 200
    run_job(spark, config)
    [window] = window_rows(config, 10)
    assert (window["window_start"].timestamp() * 1000, window["event_count"], window["sum"]) == (t0, 2, 3.0)
