"""The HTTP gateway against hostile and broken input (issue 36): never a 5xx, a stall or a lost record.

Bad input is a per-record rejection with a reason, or a 4xx for a body that cannot be split into records; slow
clients are answered 408 and closed; a token over its rate gets 429 + Retry-After with nothing written; a token
scoped to apps cannot write another app's events; duplicates are recognised per app. Real broker, real FastAPI app
(starlette's TestClient), and a real uvicorn server for the timeouts.
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from google.protobuf import json_format
from google.rpc import status_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from analytics.accept.dedup import first_copies
from eventide.config import Config, ConfigError, GatewayToken, load_config
from eventide.envelope import now_ms
from ingest.gateway.app import create_app, server_config
from ingest.gateway.batches import parse_batch
from ingest.gateway.rate_limits import TokenBucket
from ingest.gateway.validation import Refused
from stack.services import free_port
from tests.integration.test_gateway import AUTH, NDJSON, TOKEN, committed, gateway_config, metric
from tests.support.pipeline import assert_connection_over_the_cap_is_closed
from tests.support.servers import answer_and_close, uvicorn_in_thread

# Deadlines, timeouts and time budgets measured on the wall clock: run alone (./run test), not beside other tests.
pytestmark = pytest.mark.serial

LIMIT = 32   # gateway.max_depth's default


def ids(config: Config) -> list[str]:
    return sorted(json.loads(r.value())["id"] for r in committed(config))


def post(client: TestClient, body: str | bytes, headers: dict[str, str] = AUTH) -> Any:
    return client.post("/v1/events", content=body if isinstance(body, bytes) else body.encode(), headers=headers)


@contextmanager
def gateway(config: Config) -> Iterator[TestClient]:
    """The gateway app, once its transactional producers are initialised (a fresh broker's transaction
    coordinator takes seconds to load; until then the gateway rightly answers 503)."""
    with TestClient(create_app(config)) as client:
        until_ready(client.app)
        yield client


def until_ready(app: Any) -> None:
    producers = app.state.gateway.producers
    deadline = time.monotonic() + 60
    while producers.ready < producers.size:
        assert time.monotonic() < deadline, "the gateway's producers did not become ready"
        producers.warm_up()
        time.sleep(0.2)


@pytest.fixture(scope="module")
def hostile(kafka: Config) -> Config:
    return gateway_config(kafka, "security_hostile")


@pytest.fixture(scope="module")
def client(hostile: Config) -> Iterator[TestClient]:
    with gateway(hostile) as test_client:
        yield test_client


# ------------------------------------------------------------------------------------------------------------
# Broken text: lone surrogates, duplicate keys, huge numbers


def test_a_lone_surrogate_in_any_string_rejects_that_event_only_naming_the_field(kafka: Config) -> None:
    """Given a batch whose events hold a lone surrogate (JSON "\\ud800") in a field, a tag, a tag name, an
    unknown field: then each of those is rejected naming the field, the good events are written, no 500."""
    config = gateway_config(kafka, "security_surrogates")
    good = [metric("dev-1"), metric("dev-2")]
    bad = [metric("\ud800"), metric(tags={"k": "x\udfff"}), metric(tags={"\ud83d": "v"}),
           {**metric(), "extra": ["\udc00"]}, metric(id="id-\ud800")]
    body = json.dumps([good[0], *bad, good[1]])   # ensure_ascii: the surrogates go as \\uXXXX escapes
    assert "\\ud800" in body
    with gateway(config) as client:
        response = post(client, body)
    assert response.status_code == 207, response.text
    assert [(r["index"], r["reason"]) for r in response.json()["rejected"]] == [
        (1, "invalid field: device is not valid Unicode (a lone surrogate)"),
        (2, "invalid field: tags is not valid Unicode (a lone surrogate)"),
        (3, "invalid field: tags is not valid Unicode (a lone surrogate)"),
        (4, "invalid field: extra is not valid Unicode (a lone surrogate)"),
        (5, "invalid field: id is not valid Unicode (a lone surrogate)"),
    ]
    assert response.json()["rejected"][4]["id"] == "id-\\ud800"   # quoted escaped, so the answer is UTF-8
    assert response.json()["accepted"] == 2
    assert ids(config) == sorted(e["id"] for e in good)


def test_a_surrogate_pair_is_a_character_not_an_error(client: TestClient) -> None:
    response = post(client, json.dumps([metric("dev-\U0001f600")]))
    assert (response.status_code, response.json()) == (200, {"accepted": 1, "rejected": []})


def test_an_event_with_a_duplicate_key_is_rejected_naming_the_key(client: TestClient) -> None:
    event = metric()
    text = json.dumps(event)
    twice_id = text[:-1] + ', "id": "other"}'
    twice_tag = text[:-1] + ', "tags": {"a": "1", "a": "2"}}'
    for body in ("[" + ",".join([twice_id, twice_tag, json.dumps(metric())]) + "]",
                 "\n".join([twice_id, twice_tag, json.dumps(metric())])):
        response = post(client, body, NDJSON if body[0] != "[" else AUTH)
        assert response.status_code == 207, response.text
        assert [(r["index"], r["reason"]) for r in response.json()["rejected"]] == [
            (0, "invalid JSON: duplicate key: id"), (1, "invalid JSON: duplicate key: tags.a")]


def test_huge_numbers_are_rejected_per_event(client: TestClient) -> None:
    digits = "9" * 5000   # more digits than Python converts to an int

    def with_number(field: str, number: str) -> str:
        return json.dumps({k: v for k, v in metric().items() if k != field})[:-1] + f', "{field}": {number}}}'

    body = "[" + ",".join([with_number("value", digits), with_number("event_time", digits),
                           with_number("value", "1e999"), json.dumps(metric())]) + "]"
    response = post(client, body)
    assert response.status_code == 207, response.text
    assert [r["reason"] for r in response.json()["rejected"]] == [
        "invalid field: value must be finite",
        "mistyped field: event_time (expected integer ms, got DOUBLE)",
        "invalid field: value must be finite"]


def test_nan_literals_and_invalid_utf8_are_a_400_not_a_500(client: TestClient) -> None:
    for body, headers in ((b'[{"value": NaN}]', AUTH), (b'{"value": -Infinity}', NDJSON),
                          (b'[{"device": "\xed\xa0\x80"}]', AUTH), (b"[\xff]", AUTH)):
        response = post(client, body, headers)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"] == "malformed_json"


# ------------------------------------------------------------------------------------------------------------
# Nesting


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_an_event_nested_deeper_than_the_limit_is_rejected_and_one_at_the_limit_accepted(client: TestClient
                                                                                          ) -> None:
    # The event object is level 1: an extra field holding LIMIT - 1 arrays reaches the limit exactly.
    at_limit = json.dumps(metric())[:-1] + f', "deep": {nested(LIMIT - 1)}}}'
    over = json.dumps(metric())[:-1] + f', "deep": {nested(LIMIT)}}}'
    for body, headers in (f"[{at_limit},{over}]", AUTH), (f"{at_limit}\n{over}", NDJSON):
        response = post(client, body, headers)
        assert response.status_code == 207, response.text
        assert response.json() == {"accepted": 1, "rejected": [
            {"index": 1, "id": None, "reason": f"invalid JSON: nested deeper than {LIMIT} levels (gateway.max_depth)"}]}


def test_nesting_bombs_of_4_mb_are_answered_quickly_without_a_500(kafka: Config) -> None:
    """Given 4 MB bodies of brackets (closed, unclosed, braces, beside good events, as NDJSON): each answer is a
    rejection of the bomb or a 400, in well under a second of the gateway's time, and the good events written."""
    config = gateway_config(kafka, "security_bombs", max_body_bytes=4 * 1024 * 1024 + 4096)
    good = metric("dev-good")
    half = 2 * 1024 * 1024 - 8
    cases: list[tuple[str, bytes, dict[str, str], int]] = [
        ("closed array bomb beside a good event", b"[" + json.dumps(good).encode() + b"," + b"[" * half
         + b"]" * half + b"]", AUTH, 207),
        ("unclosed", b"[" * (4 * 1024 * 1024), AUTH, 400),
        ("objects", b"[" + b'{"a":' * (half // 5) + b"1" + b"}" * (half // 5) + b"]", AUTH, 422),
        ("NDJSON line", b"{" + b'"a":[' * (half // 5) + b"]" * (half // 5) + b"}\n" + json.dumps(metric()).encode(),
         NDJSON, 207),
        ("NDJSON unclosed", b"[" * (4 * 1024 * 1024), NDJSON, 422),
    ]
    with gateway(config) as client:
        for name, body, headers, status in cases:
            started = time.monotonic()
            response = post(client, body, headers)
            elapsed = time.monotonic() - started
            assert response.status_code == status, (name, response.text[:300])
            assert elapsed < 3, (name, elapsed)   # a 4 MB upload through TestClient included
            if status in (207, 422):
                assert any("nested deeper than" in r["reason"] for r in response.json()["rejected"]), name
            else:
                assert response.json()["error"] == "malformed_json", name
    assert good["id"] in ids(config)


def test_the_depth_scan_is_linear_and_ignores_brackets_inside_strings() -> None:
    brackets_in_strings = json.dumps([{**metric(), "message": "[" * 10_000, "name": "]]]\\\"[[["}] * 50)
    assert not any(isinstance(e, Refused) for e in parse_batch(brackets_in_strings.encode(), "", 5000))
    started = time.monotonic()
    [refused] = parse_batch(b"[" + nested(2 * 1024 * 1024 - 1).encode() + b"]", "", 5000)
    assert time.monotonic() - started < 1.0
    assert "nested deeper than 32" in refused.reason


# ------------------------------------------------------------------------------------------------------------
# Fuzzing: whatever the body, never a 5xx (503 is only Kafka's)

_text = st.text(st.characters(codec=None, categories=None, exclude_categories=()), max_size=12) | st.sampled_from(
    ["\ud800", "\udfff", "a\ud83d", "\x00", "\u2028", "é"])
_json = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False) | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4), max_leaves=20)
_FIELDS = ("v", "id", "kind", "app", "device", "name", "value", "level", "message", "tags", "event_time",
           "sent_time", "user")


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, str]:
    events: list[Any] = []
    for _ in range(draw(st.integers(0, 5))):
        event = metric() if draw(st.booleans()) else {}
        for field in draw(st.lists(st.sampled_from(_FIELDS), max_size=3)):
            event[field] = draw(_json)
        events.append(event if draw(st.integers(0, 9)) else draw(_json))
    as_lines = draw(st.booleans())
    text = "\n".join(json.dumps(e) for e in events) if as_lines else json.dumps(events)
    body = text.encode()
    cut = draw(st.sampled_from(["whole", "truncate", "flip", "junk"]))
    if cut == "truncate" and body:
        body = body[: draw(st.integers(0, len(body) - 1))]
    elif cut == "flip" and body:
        at = draw(st.integers(0, len(body) - 1))
        body = body[:at] + bytes([draw(st.integers(0, 255))]) + body[at + 1:]
    elif cut == "junk":
        body = draw(st.binary(max_size=64)) + body
    return body, "application/x-ndjson" if as_lines else "application/json"


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(case=bodies())
def test_fuzzed_bodies_never_get_a_5xx(client: TestClient, case: tuple[bytes, str]) -> None:
    body, content_type = case
    response = post(client, body, {**AUTH, "Content-Type": content_type})
    assert response.status_code in (200, 207, 400, 413, 422), (body[:200], response.status_code, response.text)
    if response.status_code in (207, 422):
        for rejection in response.json()["rejected"]:
            assert rejection["reason"]


# ------------------------------------------------------------------------------------------------------------
# Slow clients: a real uvicorn server set up as `eventide gateway` sets it up


@contextmanager
def served_gateway(config: Config) -> Iterator[int]:
    """The gateway served by uvicorn as ``eventide gateway`` serves it, on a free port (yielded), until the block
    ends."""
    port = free_port()
    app = create_app(config)
    with uvicorn_in_thread(server_config(app, config, port=port, log_level="warning")):
        until_ready(app)
        yield port


@pytest.fixture(scope="module")
def slow_server(kafka: Config) -> Iterator[tuple[Config, int]]:
    config = gateway_config(kafka, "security_slow", header_timeout_s=1.0, receive_timeout_s=1.5)
    with served_gateway(config) as port:
        yield config, port


def trickle(sock: socket.socket, data: bytes, every_s: float, stop: threading.Event) -> None:
    for byte in data:
        if stop.is_set():
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return
        time.sleep(every_s)


def normal_request(port: int) -> tuple[int, float]:
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("POST", "/v1/events", body=json.dumps([metric("dev-normal")]),
                       headers={**AUTH, "Content-Type": "application/json"})
    status = connection.getresponse().status
    connection.close()
    return status, time.monotonic() - started


def test_slow_clients_get_a_408_and_are_closed_while_normal_requests_are_served(slow_server: tuple[Config, int]
                                                                                ) -> None:
    """Given a client that connects and sends nothing, one that trickles its headers a byte at a time, and one
    that sends its headers and then trickles (never finishing) its body: each gets a 408 and its connection is
    closed within the configured time (headers 1 s, body 1.5 s), while a normal request is answered at once."""
    _, port = slow_server
    head = f"POST /v1/events HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {TOKEN}\r\n".encode()
    stop = threading.Event()
    silent = socket.create_connection(("127.0.0.1", port))
    headers_slowly = socket.create_connection(("127.0.0.1", port))
    body_slowly = socket.create_connection(("127.0.0.1", port))
    body_slowly.sendall(head + b"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n[")
    connected = time.monotonic()
    trickling = [threading.Thread(target=trickle, args=(headers_slowly, head * 10, 0.05, stop), daemon=True),
                 threading.Thread(target=trickle, args=(body_slowly, b" " * 4000, 0.05, stop), daemon=True)]
    for thread in trickling:
        thread.start()
    try:
        time.sleep(0.3)
        status, took = normal_request(port)   # while three slow clients hold connections
        assert status == 200 and took < 1.0, (status, took)
        results = {}
        for name, sock, deadline in (("silent", silent, 1.0), ("headers", headers_slowly, 1.0),
                                     ("body", body_slowly, 1.5)):
            data, _ = answer_and_close(sock, timeout_s=5)
            results[name] = data
            assert time.monotonic() - connected < deadline + 1.0, name   # answered and closed in time
            assert data.startswith(b"HTTP/1.1 408"), (name, data[:200])
            assert b"request_timeout" in data, name
        assert b"gateway.header_timeout_s" in results["silent"] and b"gateway.header_timeout_s" in results["headers"]
        assert b"gateway.receive_timeout_s" in results["body"]
    finally:
        stop.set()
        for sock in (silent, headers_slowly, body_slowly):
            sock.close()


def test_the_timeouts_fire_on_time(slow_server: tuple[Config, int]) -> None:
    _, port = slow_server
    with socket.create_connection(("127.0.0.1", port)) as silent:
        data, closed_after = answer_and_close(silent, timeout_s=5)
    assert data.startswith(b"HTTP/1.1 408") and 0.8 < closed_after < 2.0, closed_after
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"POST /v1/events HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {TOKEN}\r\n"
                     "Content-Length: 100\r\n\r\n[".encode())
        data, closed_after = answer_and_close(sock, timeout_s=5)
    assert data.startswith(b"HTTP/1.1 408") and 1.3 < closed_after < 2.5, closed_after
    # A keep-alive connection idle after a request is closed too (uvicorn's timeout_keep_alive).
    with socket.create_connection(("127.0.0.1", port)) as sock:
        body = json.dumps([metric("dev-keep")]).encode()
        sock.sendall(f"POST /v1/events HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {TOKEN}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        data, closed_after = answer_and_close(sock, timeout_s=10)
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    assert closed_after < 7


# ------------------------------------------------------------------------------------------------------------
# Rate limits and app scopes


def test_a_token_over_its_rate_gets_429_with_retry_after_and_nothing_of_the_request_is_written(kafka: Config
                                                                                               ) -> None:
    """Given a token limited to 10 events/s with a burst of 20: 15 events pass; 10 more at once exceed what is
    left (429, Retry-After a whole number of seconds >= 1, none of the 10 written); a batch larger than the burst
    can never pass (413); after Retry-After seconds the 10 pass."""
    limited = GatewayToken(token=TOKEN, rate=10, burst=20)
    config = gateway_config(kafka, "security_rate", tokens=[limited])
    first = [metric(f"dev-{i}") for i in range(15)]
    refused = [metric(f"dev-r{i}") for i in range(10)]
    with gateway(config) as client:
        assert client.post("/v1/events", json=first, headers=AUTH).status_code == 200
        over = client.post("/v1/events", json=refused, headers=AUTH)
        assert over.status_code == 429, over.text
        assert over.json()["error"] == "rate_limited"
        retry_after = over.headers["Retry-After"]
        assert retry_after.isdigit() and int(retry_after) >= 1
        assert ids(config) == sorted(e["id"] for e in first)
        too_big = client.post("/v1/events", json=[metric() for _ in range(21)], headers=AUTH)
        assert too_big.status_code == 413 and "burst" in too_big.json()["detail"]
        time.sleep(int(retry_after))
        later = client.post("/v1/events", json=refused, headers=AUTH)
        assert later.status_code == 200, later.text
    assert ids(config) == sorted(e["id"] for e in first + refused)


def test_a_token_with_an_empty_bucket_is_refused_before_its_body_is_read(kafka: Config) -> None:
    config = gateway_config(kafka, "security_rate_empty", tokens=[GatewayToken(token=TOKEN, rate=0.1, burst=2)])
    with gateway(config) as client:
        assert client.post("/v1/events", json=[metric(), metric()], headers=AUTH).status_code == 200
        refused = client.post("/v1/events", json=[metric()], headers=AUTH)
    assert refused.status_code == 429, refused.text
    assert refused.headers["Connection"] == "close"       # the body was not read
    assert 5 <= int(refused.headers["Retry-After"]) <= 10   # one event at 0.1/s
    assert "the next request needs" in refused.json()["detail"]
    assert len(committed(config)) == 2


def test_a_token_bucket_refills_at_its_rate_up_to_its_size() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=100, size=50, clock=lambda: now[0])
    assert bucket.take(50) == 0
    assert bucket.take(1) == pytest.approx(0.01)
    now[0] = 0.2   # 20 back
    assert bucket.take(30) == pytest.approx(0.1)   # all or nothing: none taken
    assert bucket.take(20) == 0
    now[0] = 100.0
    assert bucket.wait_s(50) == 0 and bucket.wait_s(51) > 0   # never more than its size


def test_a_token_scoped_to_an_app_cannot_write_another_apps_events(kafka: Config) -> None:
    """Given token A scoped to "checkout" and token B to any app: A's "search" event is rejected with the reason
    and A's "checkout" events are written; B writes "search"."""
    config = gateway_config(kafka, "security_scope", tokens=[GatewayToken(token=TOKEN, apps=["checkout"]),
                                                              GatewayToken(token="other-token")])
    mine = [metric("dev-1", app="checkout"), metric("dev-2", app="checkout")]
    theirs = metric("dev-3", app="search", id=mine[0]["id"])   # the same id in another app: no suppression
    with gateway(config) as client:
        scoped = client.post("/v1/events", json=[mine[0], theirs, mine[1]], headers=AUTH)
        other = client.post("/v1/events", json=[theirs], headers={"Authorization": "Bearer other-token"})
    assert scoped.status_code == 207, scoped.text
    assert scoped.json() == {"accepted": 2, "rejected": [
        {"index": 1, "id": theirs["id"], "reason": "token not allowed to write app search"}]}
    assert other.status_code == 200, other.text
    written = [json.loads(r.value()) for r in committed(config)]
    assert sorted((e["app"], e["device"]) for e in written) == [("checkout", "dev-1"), ("checkout", "dev-2"),
                                                               ("search", "dev-3")]


def test_token_tables_load_from_toml_and_env_and_bad_ones_name_the_field(tmp_path: Any) -> None:
    file = tmp_path / "eventide.toml"
    file.write_text('[gateway]\ntokens = ["dev-plain", { token = "t-checkout", apps = ["checkout", "search"], '
                    'rate = 5000, burst = 10000 }]\n')
    tokens = load_config(file, environ={}).gateway.tokens
    assert [(t.token, t.apps, t.rate, t.bucket_size) for t in tokens] == [
        ("dev-plain", None, None, None), ("t-checkout", ["checkout", "search"], 5000, 10000)]
    env = {"EVENTIDE_GATEWAY__TOKENS": '[{"token": "t", "apps": ["a"], "rate": 2.5}]'}
    [token] = load_config(file, environ=env).gateway.tokens
    assert (token.apps, token.bucket_size) == (["a"], 3)
    for bad, field in (('[{"token": "t", "rate": -1}]', "gateway.tokens.0.rate"),
                       ('[{"token": "t", "apps": []}]', "gateway.tokens.0.apps"),
                       ('[{"token": "t", "scope": ["a"]}]', "gateway.tokens.0.scope"),
                       ('["t", "t"]', "gateway.tokens")):
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            load_config(file, environ={"EVENTIDE_GATEWAY__TOKENS": bad})


def test_two_apps_with_the_same_id_are_both_counted_by_the_dedup() -> None:
    """The stream job's duplicate key is (app, id): an id reused by another app is a new event."""
    batch = pa.table({"app": ["checkout", "search", "checkout"], "id": ["same", "same", "same"],
                      "kafka_timestamp": pa.array([1, 2, 3], pa.timestamp("ms", "UTC")),
                      "partition": pa.array([0, 0, 0], pa.int32()), "offset": pa.array([1, 2, 3], pa.int64())})
    assert first_copies(batch, pa.chunked_array([], pa.string())).to_pylist() == [True, True, False]


def test_connections_over_the_cap_are_closed_at_once_and_requests_are_served_after(kafka: Config) -> None:
    """Given a gateway capped at 4 connections and 4 idle clients holding them, a fifth connection is closed at once
    without an answer; once the idle ones leave, a normal request is served."""
    config = gateway_config(kafka, "security_capped", max_connections=4)
    with served_gateway(config) as port:
        assert_connection_over_the_cap_is_closed(port, cap=4)
        assert normal_request(port)[0] == 200


# ------------------------------------------------------------------------------------------------------------
# OTLP: what a request may cost, and what one app's token may touch (issue 49)

OTLP_PROTOBUF = {**AUTH, "Content-Type": "application/x-protobuf"}
OTHER = "other-token"


def otlp_config(kafka: Config, name: str, tokens: list[GatewayToken] | None = None, **otlp: Any) -> Config:
    config = gateway_config(kafka, name, tokens=tokens or [TOKEN])
    return config.model_copy(update={"otlp": config.otlp.model_copy(update=otlp)})


def metrics_request(app: str, *points: tuple[str, dict[str, Any]], host: str = "h1") -> bytes:
    """A metrics request of one resource (``service.name`` = ``app``): each point (kind, fields) its own metric."""
    request = ExportMetricsServiceRequest()
    resource = request.resource_metrics.add(resource={"attributes": [
        KeyValue(key="service.name", value=AnyValue(string_value=app)),
        KeyValue(key="host.name", value=AnyValue(string_value=host))]})
    scope = resource.scope_metrics.add()
    for m, (kind, fields) in enumerate(points):
        metric = scope.metrics.add(name=f"m{m}")
        body = getattr(metric, kind)
        if kind in ("histogram", "exponential_histogram"):
            body.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
        body.data_points.add(time_unix_nano=now_ms() * 1_000_000, **fields)
    return request.SerializeToString()


def histogram(observations: int = 1000) -> tuple[str, dict[str, Any]]:
    """A delta histogram point of ``observations`` in one bucket: otlp.histogram_max_events + 2 events at most."""
    return "histogram", {"count": observations, "sum": 5.0, "bucket_counts": [observations]}


def gauge(route: str = "/") -> tuple[str, dict[str, Any]]:
    return "gauge", {"as_int": 1, "attributes": [KeyValue(key="route", value=AnyValue(string_value=route))]}


def log_records(app: str, *times_ms: int, host: str = "h1") -> bytes:
    request = ExportLogsServiceRequest()
    scope = request.resource_logs.add(resource={"attributes": [
        KeyValue(key="service.name", value=AnyValue(string_value=app)),
        KeyValue(key="host.name", value=AnyValue(string_value=host))]}).scope_logs.add(scope={"name": "api"})
    for i, at in enumerate(times_ms):
        scope.log_records.add(time_unix_nano=at * 1_000_000, observed_time_unix_nano=at * 1_000_000,
                              severity_number=9, body=AnyValue(string_value=f"line {i}"))
    return request.SerializeToString()


def otlp_events(config: Config) -> list[dict[str, Any]]:
    return [json.loads(r.value()) for r in committed(config, timeout_s=5)]


def test_otlp_requests_over_the_record_or_event_caps_are_a_413_status_and_nothing_is_mapped(kafka: Config) -> None:
    """Given caps of 20 records and 1,000 events per request: a gzipped request of 10 histogram points (each up to
    130 events) and one of 21 gauge points are refused whole with a 413 google.rpc.Status naming the cap, before
    any mapping (nothing written, no series counted); 7 histogram points (910 events) pass."""
    config = otlp_config(kafka, "security_otlp_caps", max_records_per_request=20, max_envelopes_per_request=1_000)
    with gateway(config) as client:
        histograms = client.post("/v1/metrics", content=gzip.compress(metrics_request("web", *[histogram()] * 10)),
                                 headers={**OTLP_PROTOBUF, "Content-Encoding": "gzip"})
        gauges = client.post("/v1/metrics", content=metrics_request("web", *[gauge(str(i)) for i in range(21)]),
                             headers=OTLP_PROTOBUF)
        stats = client.get("/v1/otlp/stats", headers=AUTH).json()
        fits = client.post("/v1/metrics", content=metrics_request("web", *[histogram()] * 7), headers=OTLP_PROTOBUF)
    for answer, cap in ((histograms, "otlp.max_envelopes_per_request (1000)"),
                        (gauges, "otlp.max_records_per_request (20)")):
        assert answer.status_code == 413, answer.content
        status = status_pb2.Status.FromString(answer.content)
        assert status.code == 3 and cap in status.message, status.message
    assert stats["series_refused"] == {} and stats.get("live_series", {}).get("web", 0) == 0
    assert fits.status_code == 200 and fits.content == b""
    assert len(otlp_events(config)) == 7 * 130


def test_otlp_a_token_is_charged_the_events_a_request_becomes_and_an_empty_request_costs_too(kafka: Config) -> None:
    """Given a token of burst 300 refilling at 0.01/s: a histogram point of 1,000 observations costs its 130
    events (two pass, a third is 429 with nothing written); a request that could become more than the burst is
    413 before mapping; requests without records cost one each, so they too run out."""
    config = otlp_config(kafka, "security_otlp_charge", [GatewayToken(token=TOKEN, rate=0.01, burst=300),
                                                         GatewayToken(token=OTHER, rate=0.01, burst=3)])
    empty = ExportMetricsServiceRequest().SerializeToString()
    with gateway(config) as client:
        answers = [client.post("/v1/metrics", content=metrics_request("web", histogram()), headers=OTLP_PROTOBUF)
                   for _ in range(3)]
        too_big = client.post("/v1/metrics", content=metrics_request("web", histogram(), histogram(), histogram()),
                              headers=OTLP_PROTOBUF)
        empties = [client.post("/v1/metrics", content=empty,
                               headers={**OTLP_PROTOBUF, "Authorization": f"Bearer {OTHER}"}).status_code
                   for _ in range(5)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert status_pb2.Status.FromString(answers[2].content).code == 8 and int(answers[2].headers["retry-after"]) >= 1
    assert too_big.status_code == 413
    assert "390 events > this token's burst (300" in status_pb2.Status.FromString(too_big.content).message
    assert empties == [200, 200, 200, 429, 429]
    assert len(otlp_events(config)) == 2 * 130


def test_otlp_a_token_for_one_app_changes_no_state_of_another_app(kafka: Config) -> None:
    """Given token A scoped to app "a" and token B to app "b", and a budget of 2 live series per app: A's points
    for app "b" (three new series) and A's record for "b" dated 10 days ahead are refused as out of scope, and
    afterwards B's two series and B's record of now are accepted, corrected to now. A's stats show only "a"."""
    config = otlp_config(kafka, "security_otlp_tenants", [GatewayToken(token=TOKEN, apps=["a"]),
                                                          GatewayToken(token=OTHER, apps=["b"])],
                         max_series_per_app=2)
    b_auth = {**OTLP_PROTOBUF, "Authorization": f"Bearer {OTHER}"}
    ten_days = 10 * 86_400_000
    with gateway(config) as client:
        hostile_points = client.post("/v1/metrics", headers=OTLP_PROTOBUF,
                                     content=metrics_request("b", gauge("/x"), gauge("/y"), gauge("/z")))
        hostile_clock = client.post("/v1/logs", headers=OTLP_PROTOBUF, content=log_records("b", now_ms() + ten_days))
        own = client.post("/v1/metrics", headers=OTLP_PROTOBUF, content=metrics_request("a", gauge("/a")))
        genuine_points = client.post("/v1/metrics", headers=b_auth,
                                     content=metrics_request("b", gauge("/1"), gauge("/2")))
        sent_at = now_ms()
        genuine_log = client.post("/v1/logs", headers=b_auth, content=log_records("b", sent_at - 100))
        a_stats = client.get("/v1/otlp/stats", headers=AUTH).json()
        b_stats = client.get("/v1/otlp/stats", headers={"Authorization": f"Bearer {OTHER}"}).json()
    points = ExportMetricsServiceResponse.FromString(hostile_points.content).partial_success
    assert (points.rejected_data_points, points.error_message) == (
        3, "3 of 3 data points rejected: 3 × token not allowed to write app b")
    logs = ExportLogsServiceResponse.FromString(hostile_clock.content).partial_success
    assert logs.rejected_log_records == 1 and "token not allowed to write app b" in logs.error_message
    for answer in (own, genuine_points, genuine_log):
        assert answer.status_code == 200 and answer.content == b"", answer.content
    written = otlp_events(config)
    assert sorted(e["tags"]["route"] for e in written if e["kind"] == "metric") == ["/1", "/2", "/a"]
    [line] = [e for e in written if e["kind"] == "log"]
    assert line["app"] == "b" and sent_at - 100 <= line["event_time"] + line["received_time"] - line["sent_time"] \
        <= sent_at + 5_000
    assert a_stats == {"series_refused": {}, "live_series": {"a": 1}}
    assert b_stats == {"series_refused": {}, "live_series": {"b": 2}}


def test_otlp_a_record_dated_far_off_by_an_apps_own_token_never_enters_its_clock_estimate(kafka: Config) -> None:
    """Given app "b"'s own token: a record dated 10 days ahead is refused (otlp.max_future_s) and gives no clock
    estimate (beyond otlp.max_clock_offset_s), so the next genuine record of the same device is accepted as it is;
    a device clock an hour ahead is still corrected."""
    config = otlp_config(kafka, "security_otlp_clock")
    ten_days, hour = 10 * 86_400_000, 3_600_000
    with gateway(config) as client:
        far = client.post("/v1/logs", headers=OTLP_PROTOBUF, content=log_records("b", now_ms() + ten_days))
        sent_at = now_ms()
        genuine = client.post("/v1/logs", headers=OTLP_PROTOBUF, content=log_records("b", sent_at - 100))
        skewed = client.post("/v1/logs", headers=OTLP_PROTOBUF,
                             content=log_records("b", sent_at + hour, host="skewed-box"))
    far_partial = ExportLogsServiceResponse.FromString(far.content).partial_success
    assert far_partial.rejected_log_records == 1 and "otlp.max_future_s" in far_partial.error_message
    assert genuine.content == b"" and skewed.content == b""
    corrected = {e["device"]: e["event_time"] + e["received_time"] - e["sent_time"] for e in otlp_events(config)}
    assert sent_at - 100 <= corrected["h1"] <= sent_at + 5_000
    assert sent_at - 5_000 <= corrected["skewed-box"] <= sent_at + 5_000


@pytest.mark.parametrize("scale", [-1024, -2_000_000_000, -11, 21, 2_000_000_000])
def test_otlp_an_exponential_histogram_outside_the_defined_scales_is_a_rejected_point_not_a_500(
        client: TestClient, scale: int) -> None:
    """Given an exponential histogram point of scale outside OpenTelemetry's -10..20 beside a good gauge: the
    point is rejected in partial_success naming its scale, the gauge is written; no 5xx."""
    point = ("exponential_histogram", {"scale": scale, "count": 3, "sum": 6.0, "zero_count": 0,
                                       "positive": {"offset": 1, "bucket_counts": [1, 2]}})
    body = metrics_request("web", point, gauge())
    for content, headers in ((body, OTLP_PROTOBUF),
                             (json_format.MessageToJson(ExportMetricsServiceRequest.FromString(body)).encode(),
                              {**AUTH, "Content-Type": "application/json"})):
        answer = client.post("/v1/metrics", content=content, headers=headers)
        assert answer.status_code == 200, answer.content
        if headers is OTLP_PROTOBUF:
            partial = ExportMetricsServiceResponse.FromString(answer.content).partial_success
            assert partial.rejected_data_points == 1
            assert f"exponential histogram scale {scale} is outside [-10, 20]" in partial.error_message
        else:
            assert answer.json()["partialSuccess"]["rejectedDataPoints"] in (1, "1")
