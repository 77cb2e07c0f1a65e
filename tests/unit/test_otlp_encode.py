# SPDX-License-Identifier: Apache-2.0
"""The registry snapshot as an OTLP request (sidecar-behaviour §13), decoded back with
opentelemetry-proto, and the §1.2 endpoint/protocol resolution."""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from sie_sidecar.config import Settings
from sie_sidecar.otel.metrics import UNITS, encode_metrics
from sie_sidecar.telemetry import Registry

BASE = {"SIE_NATS_URL": "nats://127.0.0.1:4222", "SIE_POOL": "p", "SIE_BUNDLE": "b", "SIE_MACHINE_PROFILE": "m"}


def test_counters_gauges_and_histograms_round_trip() -> None:
    reg = Registry()
    reg.add("sie.worker.config.applies", 2, (("source", "export"),))
    reg.set("sie.worker.pending.items", 7)
    hist = reg.histogram("sie.worker.batch.size", (("operation", "encode"),), bounds=(1, 2, 4))
    for v in (1, 2, 3, 9):
        hist.record(v)
    raw = encode_metrics(reg.snapshot(), resource={"service.name": "s"}, lane="L", start_ns=1, now_ns=2)
    req = ExportMetricsServiceRequest()
    req.ParseFromString(raw)
    metrics = {m.name: m for m in req.resource_metrics[0].scope_metrics[0].metrics}
    applies = metrics["sie.worker.config.applies"]
    assert applies.sum.is_monotonic and applies.sum.data_points[0].as_double == 2 and applies.unit == "{apply}"
    assert [(kv.key, kv.value.string_value) for kv in applies.sum.data_points[0].attributes] == [
        ("lane", "L"),
        ("source", "export"),
    ]
    assert metrics["sie.worker.pending.items"].gauge.data_points[0].as_double == 7
    point = metrics["sie.worker.batch.size"].histogram.data_points[0]
    assert (point.count, point.sum, list(point.explicit_bounds)) == (4, 15, [1, 2, 4])
    assert list(point.bucket_counts) == [1, 1, 1, 1]  # (-inf,1], (1,2], (2,4], (4,inf): OTLP's convention


def test_every_unit_is_one_of_the_13_table() -> None:
    assert UNITS["sie.worker.ipc.request.duration"] == "s" and UNITS["sie.worker.payload.size"] == "By"
    assert all(name.startswith("sie.worker.") for name in UNITS)


@pytest.mark.parametrize(
    ("env", "endpoint", "protocol", "enabled"),
    [
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            "http://c:4318/v1/metrics",
            "http/protobuf",
            True,
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:1/x",
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            },
            "http://m:1/x",
            "http/protobuf",
            True,
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, "http://c:4317", "grpc", False),  # gRPC: not yet
        ({}, None, "grpc", False),
    ],
)
def test_endpoint_and_protocol_resolution(
    env: dict[str, str], endpoint: str | None, protocol: str, enabled: bool
) -> None:
    settings = Settings.from_env({**BASE, "SIE_METRICS_ENABLED": "true", **env})
    assert (settings.otel.metrics_endpoint, settings.otel.metrics_protocol) == (endpoint, protocol)
    assert settings.metrics_enabled is enabled
    if not enabled:
        assert len([w for w in settings.warnings if "metrics are off" in w]) == 1


def test_resource_defaults() -> None:
    otel = Settings.from_env(BASE).otel
    assert (otel.service_name, otel.lane, otel.deployment_environment, otel.cloud_region) == (
        "sie-worker-sidecar",
        "other",
        "unknown",
        "unknown",
    )
    assert otel.export_interval_s == 5.0
    assert Settings.from_env({**BASE, "SIE_CLOUD_REGION": "eu-1"}).otel.cloud_region == "eu-1"
