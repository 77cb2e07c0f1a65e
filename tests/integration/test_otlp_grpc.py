# SPDX-License-Identifier: Apache-2.0
"""OTLP/gRPC metrics (sidecar-behaviour §1.2: gRPC is the default OTLP protocol) proven with a real
receiver: a `grpc.aio` server on loopback serving opentelemetry-proto's collector services
(`otlp_receiver.otlp_grpc_receiver`). The real sidecar over a real nats-server and backend pushes
its registry there through the OpenTelemetry SDK's gRPC exporter; what arrives carries the §13
names, units and `lane`, the resource, and counts equal to the work done, as over HTTP
(test_otlp_metrics.py). Batch spans go the same way to the trace service
(`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc`): one per batch the backend ran; refused calls are
retried by the SDK, and what the span processor holds goes out at shutdown."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sie_sidecar.otel.export import OtlpThread, TracePush
from sie_sidecar.otel.target import Target
from sie_sidecar.otel.tracer import Tracer
from sie_sidecar.otel.tracing import Sampler, SpanBuffer

from .conftest import NatsServer
from .otlp_receiver import otlp_grpc_receiver
from .stack import MODEL, running_stack, work_item

pytestmark = pytest.mark.timeout(60)
USER_AGENT = "OTel-OTLP-Exporter-Python/"  # the SDK's exporter, over grpc-python


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
        assert all(h["user-agent"].startswith(USER_AGENT) for h in receiver.headers)
        assert receiver.sidecar_resource() | {"service.version": ""} == {
            "service.name": "sidecar-under-test",
            "service.version": "",
            "service.instance.id": stack.settings.worker_id,
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


async def test_a_refused_push_is_retried_and_serving_goes_on(nats_server: NatsServer, tmp_path: Path) -> None:
    """gRPC is the default protocol: only the endpoint is set. The receiver refuses the first two
    calls (UNAVAILABLE, which the SDK's exporter retries with back-off); replies are unaffected and
    the pushes that arrive carry the cumulative counts."""
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
        assert receiver.headers and all(h["user-agent"].startswith(USER_AGENT) for h in receiver.headers)
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


def _end_spans(tracer: Tracer, n: int) -> None:
    for _ in range(n):
        span = tracer.start_batch("m", "encode", 1, 1)
        assert span is not None
        span.end()


async def test_spans_go_out_over_grpc_from_the_run_loop_at_shutdown() -> None:
    """Spans ended before the SDK is loaded wait in the buffer, then go to the processor; with a
    60 s schedule delay and a refused first call (retried by the SDK), the stop sends them all."""
    buffer = SpanBuffer(16)
    tracer = Tracer(Sampler("always_on"), buffer)
    async with otlp_grpc_receiver(refuse=1) as receiver:
        thread = OtlpThread()
        push = TracePush(
            buffer, thread, Target(receiver.url, "grpc"), resource={"service.name": "s"}, schedule_delay_s=60
        )
        _end_spans(tracer, 2)  # before the processor exists: kept
        assert len(buffer) == 2
        stop = asyncio.Event()
        task = asyncio.create_task(push.run(stop))
        try:
            for _ in range(200):
                if not len(buffer):
                    break
                await asyncio.sleep(0.05)
            assert len(buffer) == 0  # handed to the processor
            _end_spans(tracer, 1)  # straight to the processor
            assert len(buffer) == 0 and receiver.trace_requests == []  # 60 s delay, no full batch
            stop.set()
            await asyncio.wait_for(task, 30)
        finally:
            thread.close()
        assert receiver.refused == 1 and len(receiver.spans()) == 3
