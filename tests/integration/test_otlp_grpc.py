# SPDX-License-Identifier: Apache-2.0
"""OTLP/gRPC metrics (sidecar-behaviour §1.2: gRPC is the default OTLP protocol) proven with a real
receiver: a `grpc.aio` server on loopback implementing opentelemetry-proto's generated
`MetricsServiceServicer`. The real sidecar over a real nats-server and backend pushes its registry
there; what arrives carries the §13 names, units and `lane`, the resource, and counts equal to the
work done, as over HTTP (test_otlp_metrics.py). Batch spans go the same way to the generated
`TraceServiceServicer` (`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc`): one per batch the backend ran,
and a refused call keeps its spans for the next."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as service_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as trace_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from sie_sidecar.otel.grpc_export import GrpcTraceExporter
from sie_sidecar.otel.tracing import Sampler, SpanBuffer, Tracer
from sie_sidecar.tools.localhost import free_port

from .conftest import NatsServer
from .otlp_receiver import Receiver
from .stack import MODEL, running_stack, work_item

pytestmark = pytest.mark.timeout(60)


@dataclass
class GrpcReceiver(Receiver):
    """The HTTP receiver's record, filled by the gRPC service; `refuse` answers that many calls
    UNAVAILABLE first (a Collector that is not up yet)."""

    refuse: int = 0
    refused: int = 0
    user_agents: list[str] = field(default_factory=list)


class _MetricsService(service_grpc.MetricsServiceServicer):
    def __init__(self, receiver: GrpcReceiver) -> None:
        self._receiver = receiver

    async def Export(  # noqa: N802 (the generated service's method name)
        self, request: ExportMetricsServiceRequest, context: Any
    ) -> ExportMetricsServiceResponse:
        metadata = dict(context.invocation_metadata())
        self._receiver.user_agents.append(str(metadata.get("user-agent", "")))
        if self._receiver.refused < self._receiver.refuse:
            self._receiver.refused += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "not yet")
        self._receiver.requests.append(request)
        return ExportMetricsServiceResponse()


class _TraceService(trace_grpc.TraceServiceServicer):
    def __init__(self, receiver: GrpcReceiver) -> None:
        self._receiver = receiver

    async def Export(  # noqa: N802 (the generated service's method name)
        self, request: ExportTraceServiceRequest, context: Any
    ) -> ExportTraceServiceResponse:
        metadata = dict(context.invocation_metadata())
        self._receiver.user_agents.append(str(metadata.get("user-agent", "")))
        if self._receiver.refused < self._receiver.refuse:
            self._receiver.refused += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "not yet")
        self._receiver.trace_requests.append(request)
        return ExportTraceServiceResponse()


@contextlib.asynccontextmanager
async def otlp_grpc_receiver(*, refuse: int = 0) -> AsyncIterator[GrpcReceiver]:
    """Both collector services on one loopback port; `refuse` counts calls to either."""
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    receiver = GrpcReceiver(f"http://127.0.0.1:{port}", refuse=refuse)
    service_grpc.add_MetricsServiceServicer_to_server(_MetricsService(receiver), server)  # type: ignore[no-untyped-call]
    trace_grpc.add_TraceServiceServicer_to_server(_TraceService(receiver), server)  # type: ignore[no-untyped-call]
    await server.start()
    try:
        yield receiver
    finally:
        await server.stop(grace=None)


def _attrs(point: object) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}  # type: ignore[attr-defined]


async def test_the_batches_the_backend_saw_arrive_over_grpc(nats_server: NatsServer, tmp_path: Path) -> None:
    async with otlp_grpc_receiver() as receiver:
        env = {
            "SIE_METRICS_ENABLED": "true",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,  # generic: used as it is for gRPC
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
            "OTEL_SERVICE_NAME": "sidecar-under-test",
            "SIE_OTEL_LANE": "default|cpu|default",
            "SIE_OTEL_DEPLOYMENT_ENVIRONMENT": "ci",
        }
        async with running_stack(nats_server, tmp_path, env=env) as stack:
            assert (stack.settings.metrics_enabled, stack.settings.otel.metrics_protocol) == (True, "grpc")
            ids = [await stack.publish(work_item(text=f"t{i}")) for i in range(40)]
            await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in ids))
            await stack.wait_for(lambda: len(receiver.requests) >= 2)  # periodic pushes, not only the last
            backend_batches = stack.adapter.batches
            run_batch_calls = stack.backend.method_calls["RunBatch"] if stack.backend is not None else -1
        # The stack is closed: the last push (after the drain) carries the final counts.
        assert all(agent.startswith("grpc-python") for agent in receiver.user_agents)
        assert receiver.resource() | {"service.version": ""} == {
            "service.name": "sidecar-under-test",
            "service.version": "",
            "deployment.environment": "ci",
            "cloud.region": "unknown",
        }
        metrics = receiver.last_metrics()
        size = metrics["sie.worker.batch.size"]
        assert size.unit == "{item}"
        points = list(size.histogram.data_points)
        assert sum(p.count for p in points) == backend_batches  # one record per batch the backend ran
        assert sum(p.sum for p in points) == 40
        for p in points:
            attrs = _attrs(p)
            assert next(iter(attrs)) == "lane" and attrs["lane"] == "default|cpu|default"
            assert attrs["operation"] == "encode" and sum(p.bucket_counts) == p.count
        requests = {
            (_attrs(p)["method"], _attrs(p)["outcome"]): p.as_double
            for p in metrics["sie.worker.ipc.requests"].sum.data_points
        }
        assert metrics["sie.worker.ipc.requests"].sum.is_monotonic
        assert requests[("run_batch", "success")] == run_batch_calls
        assert metrics["sie.worker.ipc.request.duration"].unit == "s"
        durations = metrics["sie.worker.ipc.request.duration"].histogram.data_points
        assert sum(p.count for p in durations) == sum(requests.values())
        operations = {
            (_attrs(p)["operation"], _attrs(p)["reason"]): p.as_double
            for p in metrics["sie.worker.nats.operations"].sum.data_points
        }
        assert operations[("ack", "completed")] == 40
        assert metrics["sie.worker.pending.items"].gauge.data_points[0].as_double == 0  # all answered
        (drain,) = metrics["sie.worker.shutdown.drain.duration"].histogram.data_points
        assert _attrs(drain)["outcome"] == "success" and drain.count == 1


async def test_a_refused_push_is_carried_by_the_next_and_serving_goes_on(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """gRPC is the default protocol: only the endpoint is set. The receiver refuses the first two
    pushes (UNAVAILABLE); replies are unaffected and the later pushes carry the cumulative counts."""
    async with otlp_grpc_receiver(refuse=2) as receiver:
        env = {
            "SIE_METRICS_ENABLED": "true",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": receiver.url,
            "OTEL_METRIC_EXPORT_INTERVAL": "100",
        }
        async with running_stack(nats_server, tmp_path, env=env) as stack:
            assert stack.settings.otel.metrics_protocol == "grpc" and stack.settings.metrics_enabled
            ids = [await stack.publish(work_item(text=f"t{i}")) for i in range(5)]
            await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in ids))
            await stack.wait_for(lambda: receiver.refused == 2 and len(receiver.requests) >= 1)
        assert receiver.refused == 2
        size = receiver.last_metrics()["sie.worker.batch.size"]
        assert sum(p.sum for p in size.histogram.data_points) == 5


def _span_attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        out[kv.key] = kv.value.int_value if kv.value.HasField("int_value") else kv.value.string_value
    return out


async def test_one_span_per_batch_arrives_over_grpc(nats_server: NatsServer, tmp_path: Path) -> None:
    """The traces protocol is the signal-specific one (it wins over the generic `http/protobuf`),
    and the generic endpoint is used as it is for gRPC (no `/v1/traces`)."""
    async with otlp_grpc_receiver() as receiver:
        env = {
            "SIE_TRACING_ENABLED": "true",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
            "OTEL_TRACES_SAMPLER": "always_on",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_SERVICE_NAME": "sidecar-under-test",
            "SIE_OTEL_LANE": "default|cpu|default",
        }
        async with running_stack(nats_server, tmp_path, env=env) as stack:
            otel = stack.settings.otel
            assert stack.settings.tracing_enabled and stack.settings.warnings == ()
            assert (otel.traces_protocol, otel.traces_endpoint) == ("grpc", receiver.url)
            ids = [await stack.publish(work_item(text=f"t{i}")) for i in range(40)]
            await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in ids))
            await stack.wait_for(lambda: len(receiver.trace_requests) >= 1)  # periodic, not only the last
            backend_batches = stack.adapter.batches
        # The stack is closed: the last push (after the drain) carried every span.
        assert receiver.requests == []  # metrics are off: only the trace service was called
        assert receiver.user_agents and all(agent.startswith("grpc-python") for agent in receiver.user_agents)
        assert receiver.trace_resource()["service.name"] == "sidecar-under-test"
        spans = receiver.spans()
        assert len(spans) == backend_batches > 0  # one span per batch the backend ran
        assert len({(s.trace_id, s.span_id) for s in spans}) == len(spans)
        assert sum(_span_attrs(s)["sie.batch.size"] for s in spans) == 40
        for span in spans:
            attrs = _span_attrs(span)
            assert span.name == "sidecar.dispatch" and span.parent_span_id == b""
            assert attrs["model"] == MODEL and attrs["lane"] == "default|cpu|default"
            assert [e.name for e in span.events] == ["ipc.request", "ipc.response", "published"]


async def test_a_refused_span_export_keeps_its_spans_for_the_next() -> None:
    """The buffer's semantics over gRPC: a refused call (UNAVAILABLE) or no receiver at all puts the
    spans back in front of the bounded buffer; the next call sends them."""
    buffer = SpanBuffer(8, export_batch=4)
    tracer = Tracer(Sampler("always_on"), buffer)
    for _ in range(3):
        span = tracer.start_batch("m", "encode", 1, 1)
        assert span is not None
        span.end()
    dead = GrpcTraceExporter(buffer, f"http://127.0.0.1:{free_port()}", resource={"service.name": "s"})
    channel = dead._open()
    try:
        await dead.flush(channel)
    finally:
        await dead._close(channel)
    assert (dead.failures, len(buffer), buffer.dropped) == (1, 3, 0)
    async with otlp_grpc_receiver(refuse=1) as receiver:
        live = GrpcTraceExporter(buffer, receiver.url, resource={"service.name": "s"})
        channel = live._open()
        try:
            await live.flush(channel)
            assert (live.failures, live.exports, len(buffer)) == (1, 0, 3)  # refused: kept, in order
            await live.flush(channel)
        finally:
            await live._close(channel)
        assert (live.exports, len(buffer), buffer.dropped) == (1, 0, 0)
        assert len(receiver.spans()) == 3


async def test_spans_go_out_over_grpc_from_the_run_loop_at_shutdown() -> None:
    """The push loop opens its channel only with a span to send, and the last flush after `stop`
    sends what the schedule delay did not."""
    buffer = SpanBuffer(16, export_batch=8)
    tracer = Tracer(Sampler("always_on"), buffer)
    async with otlp_grpc_receiver() as receiver:
        exporter = GrpcTraceExporter(buffer, receiver.url, resource={"service.name": "s"}, interval_s=60)
        stop = asyncio.Event()
        task = asyncio.create_task(exporter.run(stop))
        for _ in range(2):
            span = tracer.start_batch("m", "encode", 1, 1)
            assert span is not None
            span.end()
        await asyncio.sleep(0.05)
        assert receiver.trace_requests == []  # 60 s schedule delay, no full batch
        stop.set()
        await asyncio.wait_for(task, 10)
        assert exporter.exports == 1 and len(receiver.spans()) == 2 and len(buffer) == 0
