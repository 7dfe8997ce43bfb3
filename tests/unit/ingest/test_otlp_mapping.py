"""OTLP -> v1 envelopes as pure functions (ingest/gateway/otlp/: wire, mapping, logs, metrics, state): given these
OTLP records, received at this time, these envelopes."""

from __future__ import annotations

import bisect
import gzip
import json
import math
import random
import zlib

import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from eventide.config import OtlpConfig
from ingest.gateway.otlp.logs import level_of, map_logs
from ingest.gateway.otlp.mapping import Timing
from ingest.gateway.otlp.metrics import (
    CUMULATIVE,
    DELTA,
    Histogram,
    MetricState,
    bucket_ranges,
    count_points,
    exponential_histogram,
    map_metrics,
    metrics_cost_bound,
    point_envelopes_bound,
    sample_values,
)
from ingest.gateway.otlp.state import ClockOffsets, CumulativeSeries, SeriesGuard
from ingest.gateway.otlp.wire import OtlpRefused, decompress, parse_request

SETTINGS = OtlpConfig()
T0 = 1_764_000_000_000          # ms, device clock
NS = 1_000_000
DAY_MS = 86_400_000


def timing(received: int = T0 + 1_000, correction: int = 0) -> Timing:
    return Timing(received, correction, 300_000, 7 * DAY_MS)


def kv(key: str, value: object) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def resource(**attributes: object) -> Resource:
    return Resource(attributes=[kv(k.replace("_", "."), v) for k, v in attributes.items()])


def log_request(*records: logs_pb2.LogRecord, scope: str = "checkout.payments", **attributes: object) \
        -> ExportLogsServiceRequest:
    attributes = attributes or {"service_name": "checkout", "host_name": "web-1"}
    return ExportLogsServiceRequest(resource_logs=[logs_pb2.ResourceLogs(
        resource=resource(**attributes),
        scope_logs=[logs_pb2.ScopeLogs(scope={"name": scope}, log_records=list(records))])])


# ----------------------------------------------------------------------------------------------------------
# Logs


@pytest.mark.parametrize(("number", "text", "level"), [
    (1, "", "debug"), (5, "DEBUG", "debug"), (9, "INFO", "info"), (12, "", "info"), (13, "WARN", "warning"),
    (17, "ERROR", "error"), (20, "", "error"), (21, "FATAL", "critical"), (24, "", "critical"),
    (0, "Warning", "warning"), (0, "err", "error"), (0, "panic", "critical"), (0, "", "info"), (0, "chatty", "info"),
])
def test_severity_becomes_a_level(number: int, text: str, level: str) -> None:
    assert level_of(number, text) == level


def test_a_log_record_becomes_a_log_envelope() -> None:
    record = logs_pb2.LogRecord(
        time_unix_nano=(T0 - 250) * NS, observed_time_unix_nano=(T0 - 200) * NS, severity_number=17,
        severity_text="ERROR", body=AnyValue(string_value="card declined"),
        attributes=[kv("order", 42), kv("enduser.id", "u-7"), kv("retry", True)],
        trace_id=bytes.fromhex("5b8efff798038103d269b633813fc60c"), span_id=bytes.fromhex("eee19b7ec3c1b174"),
        event_name="payment.declined")
    mapped = map_logs(log_request(record), {}, timing(), SETTINGS)
    [event] = mapped.events
    assert mapped.records == 1 and not mapped.refused
    assert {k: v for k, v in event.items() if k != "id"} == {
        "v": 1, "kind": "log", "app": "checkout", "device": "web-1", "name": "checkout.payments",
        "level": "error", "message": "card declined", "event_time": T0 - 250, "sent_time": T0 + 1_000,
        "user": "u-7", "tags": {"order": "42", "retry": "true", "trace_id": "5b8efff798038103d269b633813fc60c",
                                "span_id": "eee19b7ec3c1b174", "event.name": "payment.declined"}}


def test_non_string_bodies_are_json_and_missing_names_have_defaults() -> None:
    body = AnyValue(kvlist_value=KeyValueList(values=[
        kv("event", "login"), KeyValue(key="ids", value=AnyValue(array_value=ArrayValue(values=[
            AnyValue(int_value=1), AnyValue(double_value=2.5)])))]))
    request = log_request(logs_pb2.LogRecord(observed_time_unix_nano=T0 * NS, body=body), scope="",
                          service_instance_id="pod-3")
    [event] = map_logs(request, {}, timing(), SETTINGS).events
    assert (event["app"], event["device"], event["name"]) == ("unknown_service", "pod-3", "otlp")
    assert json.loads(event["message"]) == {"event": "login", "ids": [1, 2.5]}
    assert event["event_time"] == T0                      # no time: the observed time
    assert event["level"] == "info" and "tags" not in event


def test_ids_are_the_same_for_the_same_request_and_differ_between_records() -> None:
    same = logs_pb2.LogRecord(time_unix_nano=T0 * NS, body=AnyValue(string_value="tick"))
    request = log_request(same, same)
    first = [e["id"] for e in map_logs(request, {}, timing(), SETTINGS).events]
    again = [e["id"] for e in map_logs(ExportLogsServiceRequest.FromString(request.SerializeToString()), {},
                                       timing(received=T0 + 9_000), SETTINGS).events]
    assert first == again                      # re-sent later: the same ids, so the pipeline counts it once
    assert len(set(first)) == 2                # two identical lines of one request are two events


def test_records_outside_the_time_bounds_are_refused_one_by_one() -> None:
    records = [logs_pb2.LogRecord(time_unix_nano=t * NS, body=AnyValue(string_value=str(i)))
               for i, t in enumerate([T0, T0 + 301_000 + 1_000, T0 - 8 * DAY_MS])]
    mapped = map_logs(log_request(*records), {}, timing(), SETTINGS)
    assert [e["message"] for e in mapped.events] == ["0"]
    assert sorted(mapped.refused) == [1, 2]
    assert "otlp.max_future_s" in mapped.refused[1] and "otlp.max_age_s" in mapped.refused[2]


def test_json_and_protobuf_requests_decode_to_the_same_records() -> None:
    document = {"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "search"}}]},
        "scopeLogs": [{"scope": {"name": "api"}, "someFutureField": 1, "logRecords": [{
            "timeUnixNano": str(T0 * NS), "observedTimeUnixNano": T0 * NS, "severityNumber": 13,
            "body": {"stringValue": "slow"}, "traceId": "5b8efff798038103d269b633813fc60c",
            "spanId": "eee19b7ec3c1b174", "attributes": [{"key": "n", "value": {"intValue": "7"}}]}]}]}]}
    parsed = parse_request(json.dumps(document).encode(), "json", "logs")
    record = parsed.resource_logs[0].scope_logs[0].log_records[0]   # type: ignore[attr-defined]
    assert record.trace_id.hex() == "5b8efff798038103d269b633813fc60c"
    assert record.span_id.hex() == "eee19b7ec3c1b174"
    assert (record.severity_number, record.attributes[0].value.int_value) == (13, 7)
    binary = parse_request(parsed.SerializeToString(), "protobuf", "logs")
    assert binary == parsed
    ids = [map_logs(r, {}, timing(), SETTINGS).events[0]["id"] for r in (parsed, binary)]  # type: ignore[arg-type]
    assert ids[0] == ids[1]


@pytest.mark.parametrize(("body", "media", "status"), [
    (b"\x0a\x05garbage-not-protobuf", "protobuf", 400), (b"{not json", "json", 400),
    (b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"traceId": "zz"}]}]}]}', "json", 400),
    (b'{"resourceLogs": 5}', "json", 400),
])
def test_bodies_that_are_not_otlp_are_refused(body: bytes, media: str, status: int) -> None:
    with pytest.raises(OtlpRefused) as refused:
        parse_request(body, media, "logs")  # type: ignore[arg-type]
    assert refused.value.status == status


def test_gzip_is_decompressed_up_to_the_limit() -> None:
    data = b"x" * 10_000
    assert decompress(gzip.compress(data), "gzip", 10_000) == data
    assert decompress(gzip.compress(data[:5]) + gzip.compress(data[5:]), "gzip", 10_000) == data  # two members
    assert decompress(zlib.compress(data), "deflate", 10_000) == data
    for body, encoding, status in [(gzip.compress(data), "gzip", 413), (b"not gzip", "gzip", 400),
                                   (gzip.compress(data)[:-20], "gzip", 400), (data, "br", 415),
                                   (zlib.compress(data), "deflate", 413), (data, "deflate", 400)]:
        with pytest.raises(OtlpRefused) as refused:
            decompress(body, encoding, 9_999)
        assert refused.value.status == status


# ----------------------------------------------------------------------------------------------------------
# Clock offsets and timestamps


def test_a_device_clock_an_hour_ahead_gets_a_correction_and_batching_delay_does_not() -> None:
    clocks = ClockOffsets(window_ms=600_000, threshold_ms=2_000, max_devices=10)
    hour = 3_600_000
    # Server time S; the device's clock reads S + 1 h. Requests arrive 300-1500 ms after their newest record.
    corrections = [clocks.observe("skewed", s, s + hour - delay) for s, delay in
                   [(T0, 1_500), (T0 + 10_000, 300), (T0 + 20_000, 900)]]
    assert corrections == [-hour + 1_500, -hour + 300, -hour + 300]   # the smallest delay seen so far
    t = Timing(T0 + 20_000, corrections[-1], 300_000, DAY_MS)
    # A record that happened 1 s before it was received keeps its device time; the request's sent_time is the
    # receive time on the device's clock less the 300 ms delay estimate, so the stream job's corrected time
    # (event_time + received - sent) is T0 + 19_300: server time, 300 ms late.
    assert t.stamp(T0 + hour + 19_000) == (T0 + hour + 19_000, T0 + hour + 19_700)
    # An exporter batching for up to a second on a correct clock: below the threshold, no correction.
    assert clocks.observe("fine", T0, T0 - 1_000) == 0
    # The minimum is over the recent window only: after the clock is fixed, the old offset ages out.
    assert clocks.observe("skewed", T0 + 700_000, T0 + 699_900) == 0


def test_a_record_just_ahead_of_the_estimated_send_time_is_corrected_to_the_receive_time() -> None:
    t = timing(received=T0, correction=0)
    assert t.stamp(T0 + 1_500) == (T0 + 1_500, T0 + 1_500)       # event_time <= sent_time holds
    assert t.stamp(0) == (T0, T0)                                # no time at all: sent now


def test_the_tracked_devices_are_bounded() -> None:
    clocks = ClockOffsets(window_ms=600_000, threshold_ms=0, max_devices=2)
    for device in ("a", "b", "c"):
        clocks.observe(device, T0, T0 - 5_000)
    assert list(clocks._devices) == ["b", "c"]


# ----------------------------------------------------------------------------------------------------------
# Sums: cumulative to delta


def counter_series(horizon: int = T0 - 60_000) -> CumulativeSeries[float, float]:
    return CumulativeSeries(100, horizon, lambda c, p: None if c < p else c - p, lambda v: v)


def test_cumulative_sums_become_deltas_with_resets() -> None:
    series = counter_series()
    start, restart = T0 * NS, (T0 + 25_000) * NS
    steps = [(start, 10, 5.0), (start, 20, 8.0), (start, 20, 8.0), (start, 15, 6.0), (start, 30, 8.0),
             (start, 40, 3.0), (restart, 50, 4.0), (restart, 60, 10.0)]
    deltas = [series.delta("k", s, t * NS, v, s // NS, T0) for s, t, v in steps]
    assert deltas == [5.0,     # a series that started after the gateway did: its whole value
                      3.0,     # the increase
                      3.0,     # the same point again (a re-sent request): the same delta, so the same event
                      None,    # an older point: its increase is in the newer one's
                      0.0,     # no change
                      3.0,     # went down with the same start time: a reset, the whole value
                      4.0,     # a new start time: a reset
                      6.0]


def test_a_series_older_than_the_gateway_starts_with_a_baseline() -> None:
    series = counter_series(horizon=T0)
    assert series.delta("k", (T0 - 3_600_000) * NS, T0 * NS, 500.0, T0 - 3_600_000, T0) is None
    assert series.delta("k", (T0 - 3_600_000) * NS, (T0 + 60_000) * NS, 520.0, T0 - 3_600_000, T0) == 20.0


def test_forgetting_a_series_moves_the_horizon() -> None:
    series = CumulativeSeries(1, T0 - 60_000, lambda c, p: c - p, lambda v: v)
    series.delta("a", T0 * NS, (T0 + 1) * NS, 1.0, T0, T0 + 10)
    series.delta("b", T0 * NS, (T0 + 1) * NS, 1.0, T0, T0 + 10)   # evicts "a"
    assert (series.evicted, series.horizon_ms) == (1, T0 + 10)
    # "a" comes back: it may have been counted before it was forgotten, so it is a baseline.
    assert series.delta("a", T0 * NS, (T0 + 2) * NS, 3.0, T0, T0 + 20) is None


def metric_request(*metrics: metrics_pb2.Metric, **attributes: object) -> ExportMetricsServiceRequest:
    attributes = attributes or {"service_name": "checkout", "host_name": "web-1"}
    return ExportMetricsServiceRequest(resource_metrics=[metrics_pb2.ResourceMetrics(
        resource=resource(**attributes), scope_metrics=[metrics_pb2.ScopeMetrics(
            scope={"name": "meter"}, metrics=list(metrics))])])


def counter(value: float, at: int, start: int = T0, **attributes: object) -> metrics_pb2.Metric:
    return metrics_pb2.Metric(name="orders", sum=metrics_pb2.Sum(
        aggregation_temporality=CUMULATIVE, is_monotonic=True, data_points=[metrics_pb2.NumberDataPoint(
            start_time_unix_nano=start * NS, time_unix_nano=at * NS, as_int=int(value),
            attributes=[kv(k, v) for k, v in attributes.items()])]))


def test_metric_points_become_metric_envelopes() -> None:
    state = MetricState(SETTINGS, T0 - 60_000)
    gauge = metrics_pb2.Metric(name="queue_depth", gauge=metrics_pb2.Gauge(data_points=[
        metrics_pb2.NumberDataPoint(time_unix_nano=T0 * NS, as_double=7.5, attributes=[kv("queue", "q1")])]))
    updown = metrics_pb2.Metric(name="in_flight", sum=metrics_pb2.Sum(
        aggregation_temporality=CUMULATIVE, is_monotonic=False, data_points=[metrics_pb2.NumberDataPoint(
            start_time_unix_nano=T0 * NS, time_unix_nano=T0 * NS, as_int=-3)]))
    first = map_metrics(metric_request(gauge, updown, counter(4, T0, region="eu", **{"enduser.id": "u1"})),
                        {}, timing(), SETTINGS, state)
    assert [(e["name"], e["value"], e.get("tags"), e.get("user")) for e in first.events] == [
        ("queue_depth", 7.5, {"queue": "q1"}, None), ("in_flight", -3, None, None),
        ("orders", 4.0, {"region": "eu"}, "u1")]
    second = map_metrics(metric_request(counter(9, T0 + 10_000, region="eu", **{"enduser.id": "u1"})), {},
                         timing(T0 + 11_000), SETTINGS, state)
    assert [(e["name"], e["value"], e["event_time"]) for e in second.events] == [("orders", 5.0, T0 + 10_000)]


def test_too_many_series_per_app_are_refused_and_counted() -> None:
    settings = OtlpConfig(max_series_per_app=2)
    state = MetricState(settings, T0 - 60_000)
    request = metric_request(*(counter(1, T0, route=f"/r{i}") for i in range(3)))
    mapped = map_metrics(request, {}, timing(), settings, state)
    assert [e["tags"]["route"] for e in mapped.events] == ["/r0", "/r1"]
    assert list(mapped.refused) == [2] and "otlp.max_series_per_app (2)" in mapped.refused[2]
    assert state.stats()["series_refused"] == {"checkout": 1}


def test_series_stop_counting_after_their_ttl() -> None:
    guard = SeriesGuard(max_series=1, ttl_ms=1_000)
    assert guard.admit("a", "s1", T0) and not guard.admit("a", "s2", T0 + 500)
    assert guard.admit("a", "s2", T0 + 1_500)              # s1 expired
    assert guard.admit("b", "s1", T0)                      # per app
    guard.admit("c", "s1", T0 + 5_000)                     # a sweep: apps whose series all expired are forgotten
    assert (guard.live("a"), guard.live("b"), guard.live("c")) == (0, 0, 1) and set(guard._apps) == {"c"}


# ----------------------------------------------------------------------------------------------------------
# Histograms


BOUNDS = (0.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0)


def explicit(observations: list[float], bounds: tuple[float, ...] = BOUNDS) -> Histogram:
    counts: dict[int, int] = {}
    for x in observations:
        i = bisect.bisect_left(bounds, x)          # bucket i holds (bounds[i-1], bounds[i]]
        counts[i] = counts.get(i, 0) + 1
    return Histogram(("explicit", bounds), len(observations), sum(observations), counts, min(observations),
                     max(observations))


def bucket_of(x: float, bounds: tuple[float, ...]) -> int:
    return bisect.bisect_left(bounds, x)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@pytest.mark.parametrize("seed", range(5))
def test_histogram_samples_keep_counts_min_max_and_every_quantile_in_its_bucket(seed: int) -> None:
    rng = random.Random(seed)
    observations = [rng.lognormvariate(3, 1.2) for _ in range(rng.randint(1, 128))]
    h = explicit(observations)
    samples = sample_values(h, cap=128)
    assert len(samples) == len(observations)
    assert (samples[0], samples[-1]) == (min(observations), max(observations))
    per_bucket = {}
    for x in samples:
        per_bucket[bucket_of(x, BOUNDS)] = per_bucket.get(bucket_of(x, BOUNDS), 0) + 1
    assert per_bucket == h.buckets
    for q in (0.5, 0.9, 0.95, 0.99, 0.999):
        # The stated error: the sampled quantile is in the bucket of the true one (at most that bucket's width).
        assert bucket_of(quantile(samples, q), BOUNDS) == bucket_of(quantile(observations, q), BOUNDS)


@pytest.mark.parametrize("seed", range(3))
def test_large_histograms_are_scaled_with_a_rank_error_of_half_a_sample(seed: int) -> None:
    rng = random.Random(seed)
    observations = [rng.expovariate(1 / 40) for _ in range(20_000)]
    cap = 100
    samples = sample_values(explicit(observations), cap)
    assert len(samples) == cap
    for q in (0.5, 0.9, 0.95, 0.99):
        # The sampled q-quantile lies in a bucket holding the true quantile of some rank within q ± 1/cap.
        low, high = (bucket_of(quantile(observations, r), BOUNDS) for r in (q - 1 / cap, q + 1 / cap))
        assert low <= bucket_of(quantile(samples, q), BOUNDS) <= high


def test_open_ended_buckets_without_min_or_max_sit_on_their_finite_edge() -> None:
    h = Histogram(("explicit", (10.0, 20.0)), 3, 75.0, {0: 1, 2: 2})
    assert bucket_ranges(h) == [(10.0, 10.0, 1), (20.0, 20.0, 2)]
    only = Histogram(("explicit", ()), 4, 10.0, {0: 4})
    assert sample_values(only, 10) == [2.5] * 4             # no bounds, no min/max: the mean


def test_exponential_buckets_cover_their_values() -> None:
    scale = 2
    base = 2 ** (2 ** -scale)
    observations = [0.0, 0.0, 1.3, 1.7, 2.9, 40.0, -3.0]
    point = metrics_pb2.ExponentialHistogramDataPoint(count=len(observations), sum=sum(observations), scale=scale,
                                                      zero_count=2, min=-3.0, max=40.0)
    positive: dict[int, int] = {}
    negative: dict[int, int] = {}
    for x in observations:
        if x:
            index = math.ceil(math.log(abs(x), base)) - 1          # (base^i, base^(i+1)]
            side = positive if x > 0 else negative
            side[index] = side.get(index, 0) + 1
    for side, buckets in ((point.positive, positive), (point.negative, negative)):
        side.offset = min(buckets)
        side.bucket_counts.extend(buckets.get(i, 0) for i in range(min(buckets), max(buckets) + 1))
    samples = sample_values(exponential_histogram(point), 128)
    assert len(samples) == len(observations) and (samples[0], samples[-1]) == (-3.0, 40.0)
    for got, want in zip(samples, sorted(observations), strict=True):
        if want == 0:
            assert got == 0
        else:   # the same bucket: within a factor of base
            assert math.copysign(1, got) == math.copysign(1, want) and 1 / base <= got / want <= base


def test_cumulative_histograms_become_delta_samples_and_exact_count_and_sum() -> None:
    state = MetricState(SETTINGS, T0 - 60_000)

    def histogram(at: int, observations: list[float]) -> metrics_pb2.Metric:
        h = explicit(observations)
        counts = [h.buckets.get(i, 0) for i in range(len(BOUNDS) + 1)]
        return metrics_pb2.Metric(name="latency", histogram=metrics_pb2.Histogram(
            aggregation_temporality=CUMULATIVE, data_points=[metrics_pb2.HistogramDataPoint(
                start_time_unix_nano=T0 * NS, time_unix_nano=at * NS, count=h.count, sum=h.sum,
                bucket_counts=counts, explicit_bounds=BOUNDS, min=h.min, max=h.max)]))

    first_obs, more = [3.0, 7.0, 70.0], [12.0, 600.0]
    first = map_metrics(metric_request(histogram(T0, first_obs)), {}, timing(), SETTINGS, state)
    second = map_metrics(metric_request(histogram(T0 + 10_000, first_obs + more)), {}, timing(T0 + 11_000),
                         SETTINGS, state)
    for mapped, obs in ((first, first_obs), (second, more)):
        samples = [e["value"] for e in mapped.events if e["name"] == "latency"]
        assert sorted(bucket_of(x, BOUNDS) for x in samples) == sorted(bucket_of(x, BOUNDS) for x in obs)
        assert {e["name"]: e["value"] for e in mapped.events if e["name"] != "latency"} == \
            {"latency.count": len(obs), "latency.sum": sum(obs)}
    assert len({e["id"] for e in first.events + second.events}) == len(first.events) + len(second.events)


def test_a_cumulative_point_resent_is_the_same_events_but_another_value_at_its_time_is_none() -> None:
    # Given a cumulative histogram series whose first point (3 observations) was mapped,
    state = MetricState(SETTINGS, T0 - 60_000)

    def histogram(observations: list[float]) -> metrics_pb2.Metric:
        h = explicit(observations)
        return metrics_pb2.Metric(name="latency", histogram=metrics_pb2.Histogram(
            aggregation_temporality=CUMULATIVE, data_points=[metrics_pb2.HistogramDataPoint(
                start_time_unix_nano=T0 * NS, time_unix_nano=(T0 + 5_000) * NS, count=h.count, sum=h.sum,
                bucket_counts=[h.buckets.get(i, 0) for i in range(len(BOUNDS) + 1)], explicit_bounds=BOUNDS)]))

    first = map_metrics(metric_request(histogram([3.0, 7.0, 70.0])), {}, timing(), SETTINGS, state)
    # when the same point comes again (a client re-sending a request), it is the same events, ids included;
    again = map_metrics(metric_request(histogram([3.0, 7.0, 70.0])), {}, timing(), SETTINGS, state)
    assert again.events == first.events and len(first.events) == 3 + 2
    # and a point at the same time with other counts (no buckets, one observation) is no re-send: it maps to
    # nothing, rather than to the first point's samples, which its own cost bound does not cover.
    other = metric_request(metrics_pb2.Metric(name="latency", histogram=metrics_pb2.Histogram(
        aggregation_temporality=CUMULATIVE, data_points=[metrics_pb2.HistogramDataPoint(
            start_time_unix_nano=T0 * NS, time_unix_nano=(T0 + 5_000) * NS, count=1, sum=4.0)])))
    mapped = map_metrics(other, {}, timing(), SETTINGS, state)
    assert mapped.events == [] and mapped.cost() <= metrics_cost_bound(other, SETTINGS)


def test_delta_histograms_with_too_many_observations_keep_exact_count_and_sum() -> None:
    state = MetricState(OtlpConfig(histogram_max_events=10), T0 - 60_000)
    point = metrics_pb2.HistogramDataPoint(time_unix_nano=T0 * NS, count=1_000, sum=12_345.0,
                                           bucket_counts=[0, 500, 500], explicit_bounds=[1.0, 10.0], min=2.0,
                                           max=30.0)
    metric = metrics_pb2.Metric(name="size", histogram=metrics_pb2.Histogram(aggregation_temporality=DELTA,
                                                                             data_points=[point]))
    mapped = map_metrics(metric_request(metric), {}, timing(), OtlpConfig(histogram_max_events=10), state)
    samples = [e["value"] for e in mapped.events if e["name"] == "size"]
    assert len(samples) == 10 and samples[0] == 2.0 and samples[-1] == 30.0
    assert sum(1 for x in samples if x <= 10.0) == 5
    assert {e["name"]: e["value"] for e in mapped.events if e["name"] != "size"} == \
        {"size.count": 1_000, "size.sum": 12_345.0}


def test_summaries_are_stored_as_given_and_marked_not_mergeable() -> None:
    state = MetricState(SETTINGS, T0 - 60_000)
    point = metrics_pb2.SummaryDataPoint(
        start_time_unix_nano=T0 * NS, time_unix_nano=(T0 + 500) * NS, count=10, sum=120.0,
        quantile_values=[metrics_pb2.SummaryDataPoint.ValueAtQuantile(quantile=q, value=v)
                         for q, v in ((0.5, 11.0), (0.99, 40.0))])
    metric = metrics_pb2.Metric(name="rpc", summary=metrics_pb2.Summary(data_points=[point]))
    mapped = map_metrics(metric_request(metric), {}, timing(), SETTINGS, state)
    assert [(e["name"], e["value"], e.get("tags")) for e in mapped.events] == [
        ("rpc.count", 10.0, None), ("rpc.sum", 120.0, None),
        ("rpc.p50", 11.0, {"otel.summary": "quantile, not mergeable"}),
        ("rpc.p99", 40.0, {"otel.summary": "quantile, not mergeable"})]


def test_points_without_a_value_or_temporality_are_refused_and_staleness_markers_skipped() -> None:
    state = MetricState(SETTINGS, T0 - 60_000)
    empty = metrics_pb2.Metric(name="g", gauge=metrics_pb2.Gauge(data_points=[
        metrics_pb2.NumberDataPoint(time_unix_nano=T0 * NS),
        metrics_pb2.NumberDataPoint(time_unix_nano=T0 * NS, flags=1),
        metrics_pb2.NumberDataPoint(time_unix_nano=T0 * NS, as_double=1.0)]))
    unspecified = metrics_pb2.Metric(name="s", sum=metrics_pb2.Sum(data_points=[
        metrics_pb2.NumberDataPoint(time_unix_nano=T0 * NS, as_int=1)]))
    mapped = map_metrics(metric_request(empty, unspecified), {}, timing(), SETTINGS, state)
    assert mapped.records == 4 and [e["value"] for e in mapped.events] == [1.0]
    assert mapped.refused == {0: "data point has no value", 3: "sum has no aggregation temporality"}


def test_json_metrics_with_exemplar_ids_in_hex() -> None:
    document = {"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": "g", "gauge": {"dataPoints": [{
        "timeUnixNano": str(T0 * NS), "asInt": "9007199254740993", "exemplars": [{
            "timeUnixNano": str(T0 * NS), "asDouble": 1.0, "traceId": "5b8efff798038103d269b633813fc60c",
            "spanId": "eee19b7ec3c1b174"}]}]}}]}]}]}
    request = parse_request(json.dumps(document).encode(), "json", "metrics")
    point = request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0]  # type: ignore[attr-defined]
    assert point.as_int == 9007199254740993 and point.exemplars[0].span_id.hex() == "eee19b7ec3c1b174"
    assert json_format.MessageToDict(request)  # round-trips


def test_the_clock_estimate_uses_observed_times_when_records_have_them() -> None:
    from ingest.gateway.otlp.logs import latest_log_times

    own_time = logs_pb2.LogRecord(time_unix_nano=(T0 + 3_600_000) * NS, observed_time_unix_nano=T0 * NS)
    assert list(latest_log_times(log_request(own_time), SETTINGS).values()) == [T0]
    assert list(latest_log_times(log_request(logs_pb2.LogRecord(time_unix_nano=T0 * NS)), SETTINGS).values()) == [T0]


def test_resources_sharing_the_default_device_have_their_own_clock_estimates() -> None:
    """Two processes without host.name (device "unknown"): one clock an hour ahead does not move the other's."""
    from eventide.config import load_config
    from ingest.gateway.otlp.routes import OtlpIngest

    ingest = OtlpIngest(load_config(environ={}), T0)
    hour = 3_600_000
    for instance, clock in (("skewed", T0 + hour), ("correct", T0)):
        record = logs_pb2.LogRecord(time_unix_nano=(clock - 100) * NS, observed_time_unix_nano=clock * NS,
                                    body=AnyValue(string_value=instance))
        request = log_request(record, service_name="svc", process_pid=instance)
        outcome = ingest.handle("logs", request.SerializeToString(), "", "protobuf", T0 + 50, None)
        [event] = [json.loads(value) for _, value in outcome.records]
        assert event["device"] == "unknown"
        corrected = event["event_time"] + event["received_time"] - event["sent_time"]
        # Each corrected to server time by its own estimate (the skewed one too large by the 50 ms delay seen).
        assert T0 - 100 <= corrected <= T0 - 50


@pytest.mark.parametrize("signal", ["logs", "metrics"])
def test_corrupted_bodies_are_refused_or_mapped_never_an_error(signal: str) -> None:
    """A few hundred truncated, bit-flipped and spliced bodies, protobuf and JSON: each is a 400 or an outcome."""
    from eventide.config import load_config
    from ingest.gateway.otlp.routes import OtlpIngest

    config = load_config(environ={})
    ingest = OtlpIngest(config, T0)
    rng = random.Random(signal)
    if signal == "logs":
        valid = log_request(logs_pb2.LogRecord(time_unix_nano=T0 * NS, body=AnyValue(string_value="x"),
                                               attributes=[kv("a", 1)]))
    else:
        valid = metric_request(counter(4, T0, region="eu"))
    bodies = [valid.SerializeToString(), json_format.MessageToJson(valid).encode()]
    for _ in range(300):
        body = bytearray(rng.choice(bodies))
        for _ in range(rng.randint(1, 4)):
            if not body:
                break
            choice, at = rng.random(), rng.randrange(len(body))
            if choice < 0.4:
                body[at] = rng.randrange(256)
            elif choice < 0.7:
                del body[at:]
            else:
                body[at:at] = body[rng.randrange(len(body)):][:rng.randint(1, 40)]
        for media in ("protobuf", "json"):
            try:
                outcome = ingest.handle(signal, bytes(body), "", media, T0 + 1_000, None)  # type: ignore[arg-type]
            except OtlpRefused as refused:
                assert refused.status == 400
            else:
                assert 0 <= outcome.rejected <= outcome.total


# ----------------------------------------------------------------------------------------------------------
# What a request may cost, bounded before mapping; hostile numbers (issue 49)

_COUNTS = st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 300), max_size=6)
_DOUBLES = st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def hostile_metric(draw: st.DrawFn) -> metrics_pb2.Metric:
    """A metric of one point of any kind with numbers an attacker picks: scales, offsets, counts, bounds, sums."""
    kind = draw(st.sampled_from(["histogram", "exponential_histogram", "summary", "gauge", "sum"]))
    temporality = draw(st.sampled_from([DELTA, CUMULATIVE, 0]))
    times = {"time_unix_nano": T0 * NS + draw(st.integers(0, 10)),
             "start_time_unix_nano": draw(st.sampled_from([0, (T0 - 1) * NS, T0 * NS]))}
    optional = {k: v for k in ("sum", "min", "max") if (v := draw(st.none() | _DOUBLES)) is not None}
    metric = metrics_pb2.Metric(name="m")
    if kind == "histogram":
        counts = draw(_COUNTS)
        bounds = draw(st.lists(_DOUBLES, min_size=max(0, len(counts) - 1), max_size=max(0, len(counts) - 1))
                      if draw(st.booleans()) else st.lists(_DOUBLES, max_size=4))
        metric.histogram.aggregation_temporality = temporality
        metric.histogram.data_points.add(count=draw(st.integers(0, 2**64 - 1)), bucket_counts=counts,
                                         explicit_bounds=bounds, **times, **optional)
    elif kind == "exponential_histogram":
        metric.exponential_histogram.aggregation_temporality = temporality
        metric.exponential_histogram.data_points.add(
            scale=draw(st.integers(-2**31, 2**31 - 1) | st.integers(-12, 22)),
            zero_count=draw(st.integers(0, 2**64 - 1) | st.integers(0, 5)), count=draw(st.integers(0, 2**64 - 1)),
            positive={"offset": draw(st.integers(-2**31, 2**31 - 1) | st.integers(-3, 3)),
                      "bucket_counts": draw(_COUNTS)},
            negative={"offset": draw(st.integers(-2**31, 2**31 - 1)), "bucket_counts": draw(_COUNTS)},
            **times, **optional)
    elif kind == "summary":
        metric.summary.data_points.add(count=draw(st.integers(0, 2**64 - 1)), sum=draw(_DOUBLES), **times,
                                       quantile_values=[{"quantile": q, "value": v} for q, v in draw(
                                           st.lists(st.tuples(_DOUBLES, _DOUBLES), max_size=4))])
    else:
        body = getattr(metric, kind)
        if kind == "sum":
            body.aggregation_temporality, body.is_monotonic = temporality, draw(st.booleans())
        body.data_points.add(as_double=draw(_DOUBLES), **times)
    return metric


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hostile_metric(), min_size=1, max_size=4), st.lists(hostile_metric(), max_size=4))
def test_hostile_points_are_mapped_or_refused_within_the_cost_bound_never_an_error(
        first: list[metrics_pb2.Metric], second: list[metrics_pb2.Metric]) -> None:
    """Any point (any scale, offset, count, bound, NaN or infinity) is mapped or refused one by one, never raising;
    and what a request costs (each point the envelopes it became, at least one) is never above the bound the
    gateway charges before mapping it. Two requests, so cumulative points also meet a previous one."""
    state = MetricState(SETTINGS, T0 - 60_000)
    for metrics in (first, first + second):
        request = metric_request(*metrics)
        mapped = map_metrics(request, {}, timing(), SETTINGS, state)
        assert mapped.records == count_points(request) == len(metrics)
        assert mapped.cost() <= metrics_cost_bound(request, SETTINGS)
        for m, metric in enumerate(metrics):
            which = metric.WhichOneof("data")
            [point] = getattr(metric, which).data_points
            made = sum(1 for owner in mapped.owners if owner == m)
            assert made <= point_envelopes_bound(which, point, SETTINGS), (metric, made)


@pytest.mark.parametrize("scale", [-1024, -11, 21, 2**31 - 1, -2**31])
def test_an_exponential_histogram_scale_outside_minus_10_to_20_is_refused_by_name(scale: int) -> None:
    point = metrics_pb2.ExponentialHistogramDataPoint(time_unix_nano=T0 * NS, count=2, sum=3.0, scale=scale,
                                                      positive={"offset": 0, "bucket_counts": [2]})
    metric = metrics_pb2.Metric(name="e", exponential_histogram=metrics_pb2.ExponentialHistogram(
        aggregation_temporality=DELTA, data_points=[point]))
    mapped = map_metrics(metric_request(metric), {}, timing(), SETTINGS, MetricState(SETTINGS, T0 - 60_000))
    assert mapped.events == [] and mapped.refused == {0: f"exponential histogram scale {scale} is outside [-10, 20]"}


def test_a_request_is_measured_before_mapping_and_refused_over_the_caps() -> None:
    """Records are counted without reading them; the event bound of a histogram point is its samples (at most
    otlp.histogram_max_events, at most its observations) plus count and sum; a summary's, its quantiles + 2."""
    from eventide.config import load_config
    from ingest.gateway.otlp.routes import OtlpIngest

    caps = OtlpConfig(max_records_per_request=3, max_envelopes_per_request=300)
    config = load_config(environ={}).model_copy(update={"otlp": caps})
    ingest = OtlpIngest(config, T0)

    def point_metric(observations: int) -> metrics_pb2.Metric:
        return metrics_pb2.Metric(name="h", histogram=metrics_pb2.Histogram(
            aggregation_temporality=DELTA, data_points=[metrics_pb2.HistogramDataPoint(
                time_unix_nano=T0 * NS, count=observations, sum=1.0, bucket_counts=[observations])]))

    small, large = metric_request(point_metric(3)), metric_request(point_metric(10**6), point_metric(10**6))
    assert metrics_cost_bound(small, caps) == 5 and metrics_cost_bound(large, caps) == 2 * 130
    parsed = ingest.parse("metrics", large.SerializeToString(), "", "protobuf")
    assert (parsed.records, parsed.cost_bound) == (2, 260)
    outcome = ingest.map(parsed, T0 + 1_000, None)
    assert outcome.cost == 260 and len(outcome.records) == 260
    with pytest.raises(OtlpRefused, match=r"up to 390 events > otlp.max_envelopes_per_request \(300\)") as over:
        ingest.parse("metrics", metric_request(*[point_metric(10**6)] * 3).SerializeToString(), "", "protobuf")
    assert over.value.status == 413
    with pytest.raises(OtlpRefused, match=r"4 log records > otlp.max_records_per_request \(3\)"):
        ingest.parse("logs", log_request(*[logs_pb2.LogRecord()] * 4).SerializeToString(), "", "protobuf")
    empty = ingest.parse("logs", b"", "", "protobuf")
    assert (empty.records, empty.cost_bound, ingest.map(empty, T0, None).cost) == (0, 1, 1)


def test_a_latest_time_beyond_the_clock_offset_bound_is_no_estimate() -> None:
    """One request dated 10 days ahead leaves the device's estimate as it was (0 here); an hour ahead is one."""
    from eventide.config import load_config
    from ingest.gateway.otlp.routes import OtlpIngest

    ingest = OtlpIngest(load_config(environ={}), T0)
    key = b"device"
    timings, _ = ingest._timings({key: T0 + 10 * DAY_MS}, T0)
    assert timings[key].correction_ms == 0 and ingest.clocks.estimate(key, T0) == 0
    timings, _ = ingest._timings({key: T0 + 3_600_000}, T0 + 10)
    assert timings[key].correction_ms == -3_600_000 + 10
    timings, _ = ingest._timings({key: T0 - 10 * DAY_MS}, T0 + 20)
    assert timings[key].correction_ms == -3_600_000 + 10      # the far-off request changed nothing
