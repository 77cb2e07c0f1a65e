# SPDX-License-Identifier: Apache-2.0
"""The OpenTelemetry exporter environment (issue 32) against real receivers: the real sidecar over a
real nats-server and backend exports metrics and spans through the SDK's OTLP exporters to an
OTLP/HTTP or OTLP/gRPC receiver on loopback that requires a header, a client certificate from its
CA over TLS, and reads gzip bodies itself. What arrives carries the resource attributes of
`OTEL_RESOURCE_ATTRIBUTES` and `service.instance.id`; the signal-specific variables win over the
generic ones; the SDK switches send nothing; delta temporality sends deltas; the timeout bounds an
export. Each check has the control that would make it fail (a wrong header is refused, no client
certificate gets no request through)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from aiohttp import web
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from sie_sidecar.otel.export import MetricsPush, OtlpThread
from sie_sidecar.otel.target import Target
from sie_sidecar.telemetry import Registry
from sie_sidecar.tools.localhost import free_port

from .conftest import NatsServer
from .otlp_receiver import CLIENT_CN, MtlsFiles, Receiver, make_mtls, otlp_grpc_receiver, otlp_receiver
from .stack import Stack, running_stack, work_item

pytestmark = pytest.mark.timeout(90)

RECEIVERS: dict[str, Callable[..., AbstractAsyncContextManager[Receiver]]] = {
    "http/protobuf": otlp_receiver,
    "grpc": otlp_grpc_receiver,
}
HEADERS = {"x-api-key": "s3cr3t value", "x-tenant": "acme"}
HEADERS_ENV = "x-api-key=s3cr3t%20value,x-tenant=acme"  # W3C baggage form: values URL-encoded


def _tls_env(tls: MtlsFiles, prefix: str = "OTEL_EXPORTER_OTLP_") -> dict[str, str]:
    return {
        f"{prefix}CERTIFICATE": str(tls.ca),
        f"{prefix}CLIENT_KEY": str(tls.client_key),
        f"{prefix}CLIENT_CERTIFICATE": str(tls.client_cert),
    }


def _signals(receiver: Receiver, protocol: str, **extra: str) -> dict[str, str]:
    """Both signals on, to `receiver` by the generic endpoint, exporting every 200 ms."""
    return {
        "SIE_METRICS_ENABLED": "true",
        "SIE_TRACING_ENABLED": "true",
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_METRIC_EXPORT_INTERVAL": "200",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2000",
        **extra,
    }


async def _serve(stack: Stack, n: int) -> None:
    ids = [await stack.publish(work_item(text=f"t{i}")) for i in range(n)]
    await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in ids))


@contextlib.asynccontextmanager
async def _sidecar(nats_server: NatsServer, tmp_path: Path, env: dict[str, str]) -> AsyncIterator[Stack]:
    async with running_stack(nats_server, tmp_path, env=env) as stack:
        assert stack.settings.warnings == ()
        yield stack


@pytest.mark.parametrize("protocol", list(RECEIVERS))
async def test_headers_gzip_and_a_client_certificate_reach_the_receiver(
    nats_server: NatsServer, tmp_path: Path, protocol: str
) -> None:
    tls = make_mtls(tmp_path)
    async with RECEIVERS[protocol](require=HEADERS, tls=tls) as receiver:
        env = _signals(
            receiver,
            protocol,
            OTEL_EXPORTER_OTLP_HEADERS=HEADERS_ENV,
            OTEL_EXPORTER_OTLP_COMPRESSION="gzip",
            OTEL_SERVICE_NAME="svc",
            OTEL_RESOURCE_ATTRIBUTES="k8s.pod.name=pod-a,team=search%20ranking",
            **_tls_env(tls),
        )
        async with _sidecar(nats_server, tmp_path, env) as stack:
            assert (stack.settings.metrics_enabled, stack.settings.tracing_enabled) == (True, True)
            await _serve(stack, 20)
            await stack.wait_for(lambda: len(receiver.requests) >= 1 and len(receiver.trace_requests) >= 1)
    assert receiver.rejected == 0
    assert all(h["x-api-key"] == "s3cr3t value" and h["x-tenant"] == "acme" for h in receiver.headers)
    calls = len(receiver.requests) + len(receiver.trace_requests)
    assert receiver.encodings == ["gzip"] * calls  # every body arrived gzipped, and inflated here
    assert receiver.peers == [CLIENT_CN] * calls  # over TLS, with the client certificate
    expected = {
        "service.name": "svc",
        "service.instance.id": stack.settings.worker_id,
        "k8s.pod.name": "pod-a",
        "team": "search ranking",
        "deployment.environment": "unknown",
        "cloud.region": "unknown",
    }
    for resource in (receiver.resource(), receiver.trace_resource()):
        assert {k: resource[k] for k in expected} == expected
        assert resource["telemetry.sdk.language"] == "python" and resource["service.version"]
    assert sum(p.sum for p in receiver.last_metrics()["sie.worker.batch.size"].histogram.data_points) == 20
    assert sum(s.attributes[4].value.int_value for s in receiver.spans()) == 20  # sie.batch.size


@pytest.mark.parametrize("protocol", list(RECEIVERS))
@pytest.mark.parametrize("missing", ["header", "client certificate"])
async def test_without_the_header_or_the_client_certificate_nothing_is_taken(
    nats_server: NatsServer, tmp_path: Path, protocol: str, missing: str
) -> None:
    """The control of the test above: the receiver really checks. Serving is unaffected."""
    tls = make_mtls(tmp_path)
    async with RECEIVERS[protocol](require=HEADERS, tls=tls) as receiver:
        env = _signals(receiver, protocol, OTEL_EXPORTER_OTLP_TIMEOUT="500", **_tls_env(tls))
        if missing == "header":
            env["OTEL_EXPORTER_OTLP_HEADERS"] = "x-api-key=wrong,x-tenant=acme"
        else:
            del env["OTEL_EXPORTER_OTLP_CLIENT_KEY"], env["OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"]
        async with _sidecar(nats_server, tmp_path, env) as stack:
            await _serve(stack, 5)
            if missing == "header":
                await stack.wait_for(lambda: receiver.rejected >= 2)  # both signals tried, and were refused
    assert receiver.requests == [] and receiver.trace_requests == []
    if missing == "client certificate":
        assert receiver.headers == []  # the TLS handshake failed: no request reached the receiver


async def test_the_signal_specific_variables_win(nats_server: NatsServer, tmp_path: Path) -> None:
    """Metrics take `_METRICS_HEADERS` (right) and `_METRICS_COMPRESSION` (none) over the generic
    ones; spans take the generic ones (a wrong header: refused; gzip)."""
    async with otlp_receiver(require=HEADERS) as receiver:
        env = _signals(
            receiver,
            "http/protobuf",
            OTEL_EXPORTER_OTLP_HEADERS="x-api-key=wrong",
            OTEL_EXPORTER_OTLP_METRICS_HEADERS=HEADERS_ENV,
            OTEL_EXPORTER_OTLP_COMPRESSION="gzip",
            OTEL_EXPORTER_OTLP_METRICS_COMPRESSION="none",
            OTEL_EXPORTER_OTLP_TIMEOUT="500",
        )
        async with _sidecar(nats_server, tmp_path, env) as stack:
            await _serve(stack, 5)
            await stack.wait_for(lambda: len(receiver.requests) >= 1 and receiver.rejected >= 1)
    assert receiver.requests and receiver.trace_requests == []
    assert set(receiver.encodings) == {"identity"}  # only metrics were taken: uncompressed
    refused = [h for h in receiver.headers if h.get("x-api-key") == "wrong"]
    assert len(refused) == receiver.rejected and all(h.get("content-encoding") == "gzip" for h in refused)


async def test_resource_attributes_override_the_instance_id(nats_server: NatsServer, tmp_path: Path) -> None:
    async with otlp_receiver() as receiver:
        env = {
            "SIE_METRICS_ENABLED": "true",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
            "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=pod-7,deployment.environment=staging",
        }
        async with _sidecar(nats_server, tmp_path, env) as stack:
            await _serve(stack, 2)
    resource = receiver.resource()
    assert (resource["service.instance.id"], resource["deployment.environment"]) == ("pod-7", "staging")
    assert stack.settings.worker_id != "pod-7"


async def test_delta_temporality_sends_what_changed(nats_server: NatsServer, tmp_path: Path) -> None:
    async with otlp_receiver() as receiver:
        env = {
            "SIE_METRICS_ENABLED": "true",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
            "OTEL_METRIC_EXPORT_INTERVAL": "100",
            "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta",
        }
        async with _sidecar(nats_server, tmp_path, env) as stack:
            await _serve(stack, 10)
            await stack.wait_for(lambda: len(receiver.requests) >= 1)
            await _serve(stack, 10)
    acks = 0.0
    for request in receiver.requests:
        for metric in request.resource_metrics[0].scope_metrics[0].metrics:
            if metric.name == "sie.worker.nats.operations":
                assert metric.sum.aggregation_temporality == pb.AGGREGATION_TEMPORALITY_DELTA
                acks += sum(
                    p.as_double
                    for p in metric.sum.data_points
                    if {kv.key: kv.value.string_value for kv in p.attributes}.get("operation") == "ack"
                )
    assert len(receiver.requests) >= 2 and acks == 20  # the deltas add up to the total, once


@pytest.mark.parametrize(
    "switch", [{"OTEL_SDK_DISABLED": "true"}, {"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"}]
)
async def test_the_sdk_switches_send_nothing(nats_server: NatsServer, tmp_path: Path, switch: dict[str, str]) -> None:
    async with otlp_receiver() as receiver:
        env = _signals(receiver, "http/protobuf", **switch)
        async with running_stack(nats_server, tmp_path, env=env) as stack:
            assert (stack.settings.metrics_enabled, stack.settings.tracing_enabled) == (False, False)
            assert len(stack.settings.warnings) == 2  # one line per signal: why it is off
            await _serve(stack, 5)
    assert receiver.headers == []


async def test_the_timeout_bounds_an_export() -> None:
    """`OTEL_EXPORTER_OTLP_TIMEOUT` (here 300 ms) is the SDK exporter's: an export to a receiver that
    never answers fails well before the SDK's own 10 s default, while the receiver still waits."""
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/v1/metrics", hang)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    thread = OtlpThread()
    try:
        registry = Registry()
        registry.add("sie.worker.ipc.requests", 1)
        target = Target(f"http://127.0.0.1:{port}/v1/metrics", "http/protobuf", timeout_s=0.3)
        push = MetricsPush(registry, thread, target, resource={"service.name": "s"}, lane="L")
        await asyncio.wait_for(push.export(), 30)  # the first also loads the SDK: not timed
        began = time.monotonic()
        sent = await asyncio.wait_for(push.export(), 30)
        took = time.monotonic() - began
    finally:
        release.set()
        thread.close()
        await runner.cleanup()
    assert sent is False and push.failures == 2
    assert took < 5.0, took  # the SDK's default would be 10 s
