# SPDX-License-Identifier: Apache-2.0
"""The registry snapshot as OTLP (sidecar-behaviour §13): converted to the OpenTelemetry SDK's
`MetricsData` by the bridge, encoded by the SDK's own OTLP encoder and decoded back with
opentelemetry-proto, in each temporality; the standard `OTEL_*` variables as the settings resolve
them; and the SDK kept off the event loop's thread."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from sie_sidecar.config import OtlpHeaders, Settings
from sie_sidecar.otel.metrics import UNITS, MetricsBridge
from sie_sidecar.otel.sdk import make_resource
from sie_sidecar.telemetry import Registry
from sie_sidecar.tools.localhost import free_port

BASE = {"SIE_NATS_URL": "nats://127.0.0.1:4222", "SIE_POOL": "p", "SIE_BUNDLE": "b", "SIE_MACHINE_PROFILE": "m"}
CUMULATIVE = pb.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = pb.AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA


def _metrics(bridge: MetricsBridge, registry: Registry, now_ns: int) -> dict[str, Any]:
    request = encode_metrics(bridge.data(registry.snapshot(), now_ns))
    (rm,) = request.resource_metrics
    (sm,) = rm.scope_metrics
    return {m.name: m for m in sm.metrics}


def test_counters_gauges_and_histograms_round_trip() -> None:
    reg = Registry()
    reg.add("sie.worker.config.applies", 2, (("source", "export"),))
    reg.set("sie.worker.pending.items", 7)
    hist = reg.histogram("sie.worker.batch.size", (("operation", "encode"),), bounds=(1, 2, 4))
    for v in (1, 2, 3, 9):
        hist.record(v)
    bridge = MetricsBridge(make_resource({"service.name": "s"}), lane="L", version="9.9", start_ns=1)
    request = encode_metrics(bridge.data(reg.snapshot(), 2))
    (rm,) = request.resource_metrics
    assert {kv.key: kv.value.string_value for kv in rm.resource.attributes} == {
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "opentelemetry",
        "telemetry.sdk.version": rm.resource.attributes[2].value.string_value,
        "service.name": "s",
    }
    (sm,) = rm.scope_metrics
    assert (sm.scope.name, sm.scope.version) == ("sie_sidecar", "9.9")
    metrics = {m.name: m for m in sm.metrics}
    applies = metrics["sie.worker.config.applies"]
    assert applies.sum.is_monotonic and applies.sum.aggregation_temporality == CUMULATIVE
    (point,) = applies.sum.data_points
    assert point.HasField("as_double") and point.as_double == 2 and applies.unit == "{apply}"
    assert (point.start_time_unix_nano, point.time_unix_nano) == (1, 2)
    assert [(kv.key, kv.value.string_value) for kv in point.attributes] == [("lane", "L"), ("source", "export")]
    assert metrics["sie.worker.pending.items"].gauge.data_points[0].as_double == 7
    size = metrics["sie.worker.batch.size"].histogram
    assert size.aggregation_temporality == CUMULATIVE
    (h,) = size.data_points
    assert (h.count, h.sum, list(h.explicit_bounds)) == (4, 15, [1, 2, 4])
    assert list(h.bucket_counts) == [1, 1, 1, 1]  # (-inf,1], (1,2], (2,4], (4,inf): OTLP's convention
    assert (h.min, h.max) == (1, 9)


def test_an_empty_histogram_has_no_min_or_max() -> None:
    reg = Registry()
    reg.histogram("sie.worker.batch.size")
    bridge = MetricsBridge(make_resource({}), lane="L")
    (h,) = _metrics(bridge, reg, 2)["sie.worker.batch.size"].histogram.data_points
    assert h.count == 0 and not h.HasField("min") and not h.HasField("max")


def test_delta_sends_what_changed_since_the_last_export() -> None:
    reg = Registry()
    requests = reg.counter("sie.worker.ipc.requests", (("method", "ping"),))
    hist = reg.histogram("sie.worker.batch.size", bounds=(1, 2, 4))
    requests.add(3)
    hist.record(1)
    reg.set("sie.worker.pending.items", 5)
    bridge = MetricsBridge(make_resource({}), lane="L", temporality="delta", start_ns=10)
    first = _metrics(bridge, reg, 100)
    requests.add(2)
    hist.record(3)
    hist.record(9)
    reg.set("sie.worker.pending.items", 4)
    second = _metrics(bridge, reg, 200)
    third = _metrics(bridge, reg, 300)
    for metrics, value, start in ((first, 3, 10), (second, 2, 100), (third, 0, 200)):
        total = metrics["sie.worker.ipc.requests"].sum
        assert total.aggregation_temporality == DELTA and total.is_monotonic
        assert (total.data_points[0].as_double, total.data_points[0].start_time_unix_nano) == (value, start)
    h1, h2 = first["sie.worker.batch.size"].histogram, second["sie.worker.batch.size"].histogram
    assert h2.aggregation_temporality == DELTA
    assert (h1.data_points[0].count, list(h1.data_points[0].bucket_counts)) == (1, [1, 0, 0, 0])
    assert (h2.data_points[0].count, h2.data_points[0].sum, list(h2.data_points[0].bucket_counts)) == (
        2,
        12,
        [0, 0, 1, 1],
    )
    assert not h2.data_points[0].HasField("min")  # the interval's extremes are not kept
    assert second["sie.worker.pending.items"].gauge.data_points[0].as_double == 4  # a gauge stays a gauge


def test_lowmemory_keeps_observed_counters_cumulative() -> None:
    """The specification's lowmemory: synchronous counters and histograms delta, asynchronous
    (observed: `Counter.catch_up`) counters cumulative."""
    reg = Registry()
    recorded = reg.counter("sie.worker.ipc.requests")
    observed = reg.counter("sie.worker.ipc.response.chunks", (("outcome", "completed"),))
    recorded.add(4)
    observed.catch_up(7)
    bridge = MetricsBridge(make_resource({}), lane="L", temporality="lowmemory", start_ns=1)
    _metrics(bridge, reg, 100)
    recorded.add(1)
    observed.catch_up(9)
    metrics = _metrics(bridge, reg, 200)
    assert metrics["sie.worker.ipc.requests"].sum.aggregation_temporality == DELTA
    assert metrics["sie.worker.ipc.requests"].sum.data_points[0].as_double == 1
    chunks = metrics["sie.worker.ipc.response.chunks"].sum
    assert chunks.aggregation_temporality == CUMULATIVE
    assert (chunks.data_points[0].as_double, chunks.data_points[0].start_time_unix_nano) == (9, 1)


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


def test_each_transport_variable_signal_specific_first(tmp_path: Path) -> None:
    """OTLP exporter spec: each `OTEL_EXPORTER_OTLP_METRICS_*` / `_TRACES_*` variable wins over its
    generic twin, one variable at a time; the timeout is milliseconds."""
    ca, key, cert, other = (tmp_path / n for n in ("ca.pem", "key.pem", "cert.pem", "other.pem"))
    for path in (ca, key, cert, other):
        path.write_text("pem")
    env = {
        **BASE,
        "SIE_METRICS_ENABLED": "true",
        "SIE_TRACING_ENABLED": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4317",
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=generic",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "api-key=metrics%20key,x-tenant=a",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "GZIP",
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "none",
        "OTEL_EXPORTER_OTLP_CERTIFICATE": str(ca),
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": str(other),
        "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(key),
        "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE": str(cert),
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "750",
        "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true",
    }
    s = Settings.from_env(env)
    assert (s.metrics_enabled, s.tracing_enabled, s.warnings) == (True, True, ())
    m, t = s.otel.metrics_transport, s.otel.traces_transport
    assert (m.headers.reveal(), t.headers.reveal()) == ("api-key=metrics%20key,x-tenant=a", "api-key=generic")
    assert (m.compression, t.compression) == ("gzip", "none")
    assert (m.certificate, t.certificate) == (str(ca), str(other))
    assert (m.client_key, t.client_key) == (str(key), str(key))
    assert (m.client_certificate, t.client_certificate) == (str(cert), None)
    assert (m.timeout_s, t.timeout_s) == (2.5, 0.75)
    assert (m.insecure, t.insecure) == (False, True)


@pytest.mark.parametrize(
    ("env", "warning"),
    [
        ({"OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"}, "OTEL_EXPORTER_OTLP_COMPRESSION='brotli' ignored"),
        ({"OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "soon"}, "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT='soon' ignored"),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "-5"}, "OTEL_EXPORTER_OTLP_TIMEOUT='-5' ignored"),
    ],
)
def test_unusable_transport_values_fall_back_with_a_warning(env: dict[str, str], warning: str) -> None:
    s = Settings.from_env({**BASE, **env})
    assert (s.otel.metrics_transport.compression, s.otel.metrics_transport.timeout_s) == ("none", 10.0)
    assert any(w.startswith(warning) for w in s.warnings), s.warnings


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"OTEL_SDK_DISABLED": "TRUE"}, "OTEL_SDK_DISABLED is true"),
        ({"OTEL_METRICS_EXPORTER": "none"}, "OTEL_METRICS_EXPORTER is none"),
        ({"OTEL_METRICS_EXPORTER": "console"}, "OTEL_METRICS_EXPORTER is none"),
        ({"OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE": "/nonexistent/ca.pem"}, "is not a file"),
    ],
)
def test_the_sdk_switches_and_a_missing_file_leave_metrics_off(env: dict[str, str], reason: str) -> None:
    s = Settings.from_env({**BASE, "SIE_METRICS_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", **env})
    assert s.metrics_enabled is False
    (off,) = [w for w in s.warnings if "metrics are off" in w]
    assert reason in off


def test_the_exporter_lists_and_the_sdk_switch() -> None:
    s = Settings.from_env(
        {
            **BASE,
            "SIE_METRICS_ENABLED": "true",
            "SIE_TRACING_ENABLED": "true",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c",
            "OTEL_METRICS_EXPORTER": "console, OTLP",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_SDK_DISABLED": "false",
        }
    )
    assert (s.otel.metrics_exporter, s.otel.traces_exporter) == ("otlp", "none")
    assert (s.metrics_enabled, s.tracing_enabled) == (True, False)
    assert any("console not available" in w for w in s.warnings)
    maybe = Settings.from_env({**BASE, "OTEL_SDK_DISABLED": "maybe"})
    assert maybe.otel.sdk_disabled is False and any("OTEL_SDK_DISABLED='maybe'" in w for w in maybe.warnings)


@pytest.mark.parametrize(
    ("value", "temporality", "warned"),
    [
        (None, "cumulative", False),
        ("Delta", "delta", False),
        ("lowmemory", "lowmemory", False),
        ("x", "cumulative", True),
    ],
)
def test_the_temporality_preference(value: str | None, temporality: str, warned: bool) -> None:
    env = BASE if value is None else {**BASE, "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": value}
    s = Settings.from_env(env)
    assert s.otel.metrics_temporality == temporality and bool(s.warnings) is warned


def test_resource_defaults() -> None:
    otel = Settings.from_env(BASE).otel
    assert (otel.service_name, otel.lane, otel.deployment_environment, otel.cloud_region) == (
        "sie-worker-sidecar",
        "other",
        "unknown",
        "unknown",
    )
    assert otel.export_interval_s == 5.0 and otel.resource_attributes == ()
    assert Settings.from_env({**BASE, "SIE_CLOUD_REGION": "eu-1"}).otel.cloud_region == "eu-1"


def test_resource_attributes_and_their_precedence() -> None:
    """OTEL_RESOURCE_ATTRIBUTES is read as the SDK reads it (values URL-decoded); OTEL_SERVICE_NAME
    and the SIE_OTEL_* variables win over it, it wins over the defaults."""
    attrs = "service.name=from-attrs, team=search%20ranking,deployment.environment=staging,broken,k8s.pod.name=p-1"
    s = Settings.from_env({**BASE, "OTEL_RESOURCE_ATTRIBUTES": attrs})
    assert s.otel.resource_attributes == (
        ("service.name", "from-attrs"),
        ("team", "search ranking"),
        ("deployment.environment", "staging"),
        ("k8s.pod.name", "p-1"),
    )
    assert (s.otel.service_name, s.otel.deployment_environment) == ("from-attrs", "staging")
    assert [w for w in s.warnings if "OTEL_RESOURCE_ATTRIBUTES" in w] == [
        "OTEL_RESOURCE_ATTRIBUTES entry 'broken' is not key=value; ignored"
    ]
    named = Settings.from_env(
        {**BASE, "OTEL_RESOURCE_ATTRIBUTES": attrs, "OTEL_SERVICE_NAME": "svc", "SIE_OTEL_DEPLOYMENT_ENVIRONMENT": "ci"}
    )
    assert (named.otel.service_name, named.otel.deployment_environment) == ("svc", "ci")


def test_otlp_headers_never_show() -> None:
    s = Settings.from_env({**BASE, "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20s3cr3t"})
    assert s.otel.metrics_transport.headers.reveal() == "authorization=Bearer%20s3cr3t"
    assert "s3cr3t" not in repr(s) and "s3cr3t" not in str(s.redacted())
    assert s.redacted()["otel"]["metrics_transport"]["headers"] == "<redacted>"  # type: ignore[index]
    assert str(OtlpHeaders("")) == "" and OtlpHeaders("a=b") == OtlpHeaders("a=b")


def test_the_event_loop_thread_imports_none_of_the_sdk() -> None:
    """The SDK, its exporters, protobuf and the HTTP client are imported by the OTLP thread, never by
    the serving event loop's (it cost ~0.1 s of CPU: docs/benchmarks.md); an export runs there too."""
    code = f"""
import asyncio, sys, threading
loaded = {{}}

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("opentelemetry", "google", "grpc", "requests", "urllib3"):
            loaded.setdefault(name, threading.current_thread().name)
        return None

sys.meta_path.insert(0, Watch())
from sie_sidecar.otel.export import MetricsPush, OtlpThread
from sie_sidecar.otel.target import Target
from sie_sidecar.telemetry import Registry

async def main():
    registry = Registry()
    registry.add("sie.worker.ipc.requests", 1)
    for protocol, path in (("http/protobuf", "/v1/metrics"), ("grpc", "")):
        push = MetricsPush(
            registry, OtlpThread(), Target("http://127.0.0.1:{free_port()}" + path, protocol, timeout_s=0.5),
            resource={{"service.name": "s"}}, lane="L",
        )
        assert await push.export() is False  # nobody listens: the export ran, in the thread, and failed
asyncio.run(main())
main_thread = sorted(name for name, thread in loaded.items() if thread == "MainThread")
assert "opentelemetry.sdk.metrics" in loaded and "grpc" in loaded, sorted(loaded)
print(main_thread)
"""
    run = subprocess.run([sys.executable, "-c", code], check=True, timeout=120, capture_output=True, text=True)
    assert run.stdout.strip() == "[]", run.stdout + run.stderr


def test_what_the_otlp_thread_imported_is_frozen_once_the_exporter_is_built() -> None:
    """Start-up freezes its heap before the OTLP thread has imported the SDK; once the exporter is
    built the heap is frozen again, so the collector does not keep walking the SDK's objects (4% of
    steady CPU with metrics on: docs/benchmarks.md). In a child process: freezing is process-wide."""
    code = f"""
import asyncio, gc
from sie_sidecar.otel.export import MetricsPush, OtlpThread
from sie_sidecar.otel.target import Target
from sie_sidecar.telemetry import Registry

async def main():
    gc.freeze()  # as start-up does
    before = gc.get_freeze_count()
    push = MetricsPush(
        Registry(), OtlpThread(), Target("http://127.0.0.1:{free_port()}/v1/metrics", "http/protobuf", timeout_s=0.5),
        resource={{"service.name": "s"}}, lane="L",
    )
    await push._sender
    await asyncio.sleep(0)  # the done-callback runs on the loop
    import opentelemetry.sdk.metrics.export as sdk
    print(gc.get_freeze_count() - before, gc.is_tracked(sdk.__dict__), sdk.__dict__ in gc.get_objects())

asyncio.run(main())
"""
    run = subprocess.run([sys.executable, "-c", code], check=True, timeout=120, capture_output=True, text=True)
    grown, tracked, collected = run.stdout.split()
    assert int(grown) > 5_000, run.stdout + run.stderr  # the SDK's objects went to the permanent generation
    assert tracked == "True" and collected == "False"  # still tracked, but no generation holds it
