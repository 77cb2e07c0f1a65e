# SPDX-License-Identifier: Apache-2.0
"""One OTLP metrics export's encoding (issue 32): the registry's snapshot of ~40 series (20
histograms, 15 counters, 7 gauges, as a running sidecar holds them) made into the request's bytes,
by the SDK's encoder over the bridge's `MetricsData` (what the gRPC exporter and the twins use) and
by the compiled encoder over the bridge's shapes (what the OTLP/HTTP exporter sends), side by side.
The export thread shares the interpreter with the serving loop, so its CPU is the sidecar's."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
from opentelemetry.sdk.resources import Resource
from pytest_benchmark.fixture import BenchmarkFixture

from sie_sidecar import wire
from sie_sidecar.otel.metrics import MetricsBridge
from sie_sidecar.telemetry import Point, Registry
from sie_sidecar.telemetry.registry import DURATION_BOUNDS_S


def _snapshot() -> list[Point]:
    r = Registry()
    for i in range(20):
        attrs = (("operation", "encode"), ("model", f"org/model-{i % 3}"), ("profile", "default"))
        h = r.histogram(f"sie.worker.h{i}", attrs, DURATION_BOUNDS_S)
        for v in range(100):
            h.record(v * 0.001)
    for i in range(15):
        r.counter(f"sie.worker.c{i}", (("outcome", "success"), ("reason", "none"))).add(5)
    for i in range(7):
        r.gauge(f"sie.worker.g{i}", ()).set(3)
    return r.snapshot()


@pytest.mark.parametrize("encoder", ["sdk", "compiled"])
def test_one_metrics_export_encoded(benchmark: BenchmarkFixture, encoder: str) -> None:
    if encoder == "compiled" and not wire.USING_NATIVE:
        pytest.skip("the compiled encoder")
    benchmark.group = "OTLP metrics: one export of 42 series, snapshot to request bytes"
    bridge = MetricsBridge(Resource({"service.name": "sie-sidecar"}), lane="l4", version="0.1.0", start_ns=1)
    points = _snapshot()

    def sdk() -> bytes:
        return bytes(encode_metrics(bridge.data(points, 2)).SerializeToString())

    def compiled() -> bytes:
        body = bridge.request_of(bridge.shapes(points, 2))
        assert body is not None
        return body

    body = benchmark(sdk if encoder == "sdk" else compiled)
    assert body == sdk()
