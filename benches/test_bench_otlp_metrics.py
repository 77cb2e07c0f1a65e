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

from benches.otlp_metrics_export_cpu import registry
from sie_sidecar import wire
from sie_sidecar.otel.metrics import MetricsBridge


@pytest.mark.parametrize("encoder", ["sdk", "compiled"])
def test_one_metrics_export_encoded(benchmark: BenchmarkFixture, encoder: str) -> None:
    if encoder == "compiled" and not wire.USING_NATIVE:
        pytest.skip("the compiled encoder")
    benchmark.group = "OTLP metrics: one export of 42 series, snapshot to request bytes"
    bridge = MetricsBridge(Resource({"service.name": "sie-sidecar"}), lane="l4", version="0.1.0", start_ns=1)
    points = registry().snapshot()

    def sdk() -> bytes:
        return bytes(encode_metrics(bridge.data(points, 2)).SerializeToString())

    def compiled() -> bytes:
        body = bridge.request_of(bridge.shapes(points, 2))
        assert body is not None
        return body

    body = benchmark(sdk if encoder == "sdk" else compiled)
    assert body == sdk()
