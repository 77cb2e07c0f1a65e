# SPDX-License-Identifier: Apache-2.0
"""OTLP/gRPC metrics (sidecar-behaviour §1.2: gRPC is the default OTLP protocol) proven with a real
receiver: a `grpc.aio` server on loopback implementing opentelemetry-proto's generated
`MetricsServiceServicer`. The real sidecar over a real nats-server and backend pushes its registry
there; what arrives carries the §13 names, units and `lane`, the resource, and counts equal to the
work done, as over HTTP (test_otlp_metrics.py)."""

from __future__ import annotations

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

from .conftest import NatsServer
from .otlp_receiver import Receiver
from .stack import running_stack, work_item

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


@contextlib.asynccontextmanager
async def otlp_grpc_receiver(*, refuse: int = 0) -> AsyncIterator[GrpcReceiver]:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    receiver = GrpcReceiver(f"http://127.0.0.1:{port}", refuse=refuse)
    service_grpc.add_MetricsServiceServicer_to_server(_MetricsService(receiver), server)  # type: ignore[no-untyped-call]
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
