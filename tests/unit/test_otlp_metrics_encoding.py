# SPDX-License-Identifier: Apache-2.0
"""The compiled metrics request (`MetricsBridge.request_of`) is the message the SDK's encoder makes
of the bridge's `MetricsData`, point for point, in every temporality; the twins fall back to it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.resources import Resource

from sie_sidecar.otel.metrics import MetricsBridge
from sie_sidecar.telemetry import Point
from sie_sidecar.wire._switch import USING_NATIVE

pytestmark = pytest.mark.skipif(not USING_NATIVE, reason="the compiled encoder is not loaded with the twins")

BOUNDS = (0.005, 0.01, 0.1, 1.0)
texts = st.text(alphabet="abz._/é ", max_size=6)
attrs = st.lists(st.tuples(st.sampled_from(["model", "operation", "outcome", "reason"]), texts), max_size=3).map(
    lambda pairs: tuple(dict(pairs).items())
)
counts = st.integers(0, 2**40)
values = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def points(draw: st.DrawFn) -> Point:
    kind = draw(st.sampled_from(["counter", "gauge", "histogram"]))
    name = f"sie.worker.{kind}.{draw(st.integers(0, 2))}"
    if kind != "histogram":
        value = draw(st.one_of(values, counts.map(float)))
        return Point(name, kind, draw(attrs), value, observed=draw(st.booleans()))  # type: ignore[arg-type]
    buckets = tuple(draw(st.lists(counts, min_size=len(BOUNDS) + 1, max_size=len(BOUNDS) + 1)))
    low = draw(st.one_of(st.none(), values))
    high = draw(st.one_of(st.none(), values))
    return Point(name, "histogram", draw(attrs), draw(values), sum(buckets), buckets, BOUNDS, min=low, max=high)


def _bridges(temporality: str) -> tuple[MetricsBridge, MetricsBridge]:
    resource = Resource({"service.name": "sie-sidecar", "service.instance.id": "pod-0", "empty": ""})
    return tuple(  # type: ignore[return-value]
        MetricsBridge(resource, lane="l4", version="0.1.0", temporality=temporality, start_ns=1_000) for _ in range(2)
    )


def _unique(snapshot: list[Point]) -> list[Point]:
    """One point per (name, attributes), each name of one kind: what a registry holds."""
    kinds: dict[str, str] = {}
    seen: dict[tuple[str, object], Point] = {}
    for p in snapshot:
        if kinds.setdefault(p.name, p.kind) == p.kind:
            seen.setdefault((p.name, p.attrs), p)
    return list(seen.values())


def _grown(p: Point, k: int) -> Point:
    """`p` after more recording: counts never go down (a registry's do not)."""
    buckets = tuple(b * k for b in p.buckets)
    return Point(p.name, p.kind, p.attrs, p.value * k, sum(buckets), buckets, p.bounds, p.observed, p.min, p.max)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["cumulative", "delta", "lowmemory"]),
    st.lists(points(), max_size=8),
    st.integers(1, 3),
)
def test_the_compiled_request_is_the_sdks_message(temporality: str, base: list[Point], exports: int) -> None:
    compiled, reference = _bridges(temporality)
    base = _unique(base)
    for n in range(exports):
        snapshot = [_grown(p, n + 1) for p in base]
        now = 2_000 + n
        body = compiled.request_of(compiled.shapes(snapshot, now))
        assert body is not None
        want = encode_metrics(reference.data(snapshot, now))
        assert ExportMetricsServiceRequest.FromString(body) == want
        assert body == want.SerializeToString(deterministic=True)


def test_a_histogram_without_extremes_leaves_them_unset() -> None:
    compiled, _ = _bridges("delta")
    point = Point("sie.worker.h", "histogram", (), 0.5, 1, (0, 1, 0, 0, 0), BOUNDS, min=0.5, max=0.5)
    compiled.shapes([point], 1_500)
    body = compiled.request_of(compiled.shapes([point], 2_000))  # a delta: no extremes
    assert body is not None
    request = ExportMetricsServiceRequest.FromString(body)
    (metric,) = request.resource_metrics[0].scope_metrics[0].metrics
    (dp,) = metric.histogram.data_points
    assert not dp.HasField("min") and not dp.HasField("max") and dp.HasField("sum") and dp.count == 0


def test_an_attribute_that_is_not_a_str_goes_to_the_sdks_encoder() -> None:
    compiled, _ = _bridges("cumulative")
    shapes = compiled.shapes([Point("sie.worker.c", "counter", (("n", 3),), 1.0)], 2_000)  # type: ignore[arg-type]
    assert compiled.request_of(shapes) is None
    assert encode_metrics(compiled.data_of(shapes)).resource_metrics


def test_the_http_exporter_sends_the_compiled_request_and_grpc_the_sdks() -> None:
    from sie_sidecar.otel.metrics import TakesRequests
    from sie_sidecar.otel.sdk import metric_exporter
    from sie_sidecar.otel.target import Target

    http = metric_exporter(Target("http://127.0.0.1:9/v1/metrics", "http/protobuf", timeout_s=0.1))
    grpc = metric_exporter(Target("http://127.0.0.1:9", "grpc", timeout_s=0.1))
    try:
        assert isinstance(http, TakesRequests) and not isinstance(grpc, TakesRequests)
    finally:
        http.shutdown()
        grpc.shutdown()
    assert http.export_request(b"") is None  # shut down: the SDK's own path says so and logs


def test_a_resource_attribute_that_is_not_a_str_goes_to_the_sdks_encoder() -> None:
    bridge = MetricsBridge(Resource({"service.name": "s", "pid": 7}), lane="l4", start_ns=1)
    shapes = bridge.shapes([Point("sie.worker.c", "counter", (), 1.0)], 2_000)
    assert bridge.request_of(shapes) is None
    assert encode_metrics(bridge.data_of(shapes)).resource_metrics


def test_a_delta_that_goes_negative_goes_to_the_sdks_encoder_unsent() -> None:
    """A histogram whose counts went down (a registry's never do) makes a negative delta count:
    the compiled encoder refuses it instead of writing a wrapped-around fixed64."""
    bridge, _ = _bridges("delta")
    before = Point("sie.worker.h", "histogram", (), 3.0, 3, (1, 1, 1, 0, 0), BOUNDS)
    after = Point("sie.worker.h", "histogram", (), 1.0, 1, (1, 0, 0, 0, 0), BOUNDS)
    bridge.shapes([before], 1_500)
    assert bridge.request_of(bridge.shapes([after], 2_000)) is None
