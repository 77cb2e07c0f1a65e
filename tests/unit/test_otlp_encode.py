# SPDX-License-Identifier: Apache-2.0
"""The registry snapshot as an OTLP request (sidecar-behaviour §13), decoded back with
opentelemetry-proto, the §1.2 endpoint/protocol resolution and the exporter it selects."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from sie_sidecar.config import Settings
from sie_sidecar.otel.export import MetricsExporter, make_exporter
from sie_sidecar.otel.grpc_export import GrpcMetricsExporter, grpc_target
from sie_sidecar.otel.metrics import UNITS, encode_metrics
from sie_sidecar.telemetry import Registry
from sie_sidecar.tools.localhost import free_port

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
        # gRPC is the default: a generic endpoint is used as it is (no signal path)
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, "http://c:4317", "grpc", True),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "https://m:4317",
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "GRPC",
            },
            "https://m:4317",
            "grpc",
            True,
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317/", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "http://c:4317/",
            "grpc",
            True,
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "http://c:4318/v1/metrics",
            "http/json",
            False,
        ),
        ({}, None, "grpc", False),
    ],
)
def test_endpoint_and_protocol_resolution(
    env: dict[str, str], endpoint: str | None, protocol: str, enabled: bool
) -> None:
    settings = Settings.from_env({**BASE, "SIE_METRICS_ENABLED": "true", **env})
    assert (settings.otel.metrics_endpoint, settings.otel.metrics_protocol) == (endpoint, protocol)
    assert settings.metrics_enabled is enabled
    assert len([w for w in settings.warnings if "metrics are off" in w]) == (0 if enabled else 1)


@pytest.mark.parametrize(
    ("endpoint", "target", "secure"),
    [
        ("http://collector:4317", "collector:4317", False),
        ("https://collector.example.com:4317/ignored/path", "collector.example.com:4317", True),
        ("http://127.0.0.1", "127.0.0.1:4317", False),
        ("collector:4317", "collector:4317", True),  # no scheme: TLS, as OTEL_EXPORTER_OTLP_INSECURE's default
        ("http://[::1]:4317", "[::1]:4317", False),
    ],
)
def test_grpc_endpoint_to_channel_target(endpoint: str, target: str, secure: bool) -> None:
    assert grpc_target(endpoint) == (target, secure)


@pytest.mark.parametrize("endpoint", ["unix:///tmp/otlp.sock", "ftp://c:4317", "http://"])
def test_grpc_endpoint_that_is_not_one(endpoint: str) -> None:
    with pytest.raises(ValueError, match="not an OTLP gRPC endpoint"):
        grpc_target(endpoint)


@pytest.mark.parametrize(("protocol", "kind"), [("grpc", GrpcMetricsExporter), ("http/protobuf", MetricsExporter)])
def test_the_exporter_follows_the_protocol(protocol: str, kind: type[object]) -> None:
    exporter = make_exporter(Registry(), "http://c:1", protocol=protocol, resource={}, lane="L")
    assert type(exporter) is kind
    with pytest.raises(ValueError, match="http/json"):
        make_exporter(Registry(), "http://c:1", protocol="http/json", resource={}, lane="L")


#: Per signal: the imports, the exporter built from URL and PROTOCOL, and what gives it one thing to push.
SIGNALS = {
    "metrics": (
        "from sie_sidecar.otel.export import make_exporter\nfrom sie_sidecar.telemetry import Registry\n",
        "make_exporter(Registry(), URL, protocol=PROTOCOL, resource={}, lane='L')",
        "",
    ),
    "traces": (
        "from sie_sidecar.otel.trace_export import make_trace_exporter\n"
        "from sie_sidecar.otel.tracing import Sampler, SpanBuffer, Tracer\n",
        "make_trace_exporter(SpanBuffer(4), URL, protocol=PROTOCOL, resource={})",
        "Tracer(Sampler('always_on'), exporter._buffer).start_batch('m', 'encode', 1, 1).end()\n",
    ),
}


@pytest.mark.parametrize("signal", list(SIGNALS))
@pytest.mark.parametrize(
    ("protocol", "path", "library"), [("grpc", "", "grpc"), ("http/protobuf", "/v1/x", "sie_sidecar.otel.http_post")]
)
def test_the_first_push_imports_nothing(signal: str, protocol: str, path: str, library: str) -> None:
    """What a push needs is imported when the exporter is built, at start-up: a first push that
    imported aiohttp's client stalled the serving event loop ~130 ms (docs/benchmarks.md). Neither
    transport imports aiohttp or protobuf (the requests are written by `otel/protowire`)."""
    imports, build, fill = SIGNALS[signal]
    code = (
        f"import asyncio, sys\n{imports}"
        f"URL, PROTOCOL = 'http://127.0.0.1:{free_port()}{path}', {protocol!r}\n"
        f"exporter = {build}\n"
        f"assert {library!r} in sys.modules\n"
        f"{fill}"
        "before = set(sys.modules)\n"
        "async def push():\n"
        "    connection = await exporter._push(None)\n"
        "    if connection is not None:\n"
        "        await exporter._close(connection)\n"
        "asyncio.run(push())\n"
        "assert exporter.failures == 1, exporter.failures  # nobody listens: the push ran and failed\n"
        "assert 'aiohttp' not in sys.modules and 'google.protobuf' not in sys.modules\n"
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True)
    assert [m for m in run.stdout.split() if m.split(".")[0] in ("grpc", "google", "opentelemetry", "ssl")] == []


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
