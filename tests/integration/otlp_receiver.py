# SPDX-License-Identifier: Apache-2.0
"""A real OTLP/HTTP receiver on loopback: an aiohttp server that decodes each POSTed
`ExportMetricsServiceRequest` (`/v1/metrics`) and `ExportTraceServiceRequest` (`/v1/traces`) with
opentelemetry-proto and keeps them for the test to read."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from sie_sidecar.tools.localhost import free_port


@dataclass
class Receiver:
    url: str
    requests: list[ExportMetricsServiceRequest] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)
    traces_url: str = ""
    trace_requests: list[ExportTraceServiceRequest] = field(default_factory=list)

    def spans(self) -> list[Span]:
        """Every span received, in arrival order."""
        return [s for r in self.trace_requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]

    def trace_resource(self) -> dict[str, str]:
        attrs = self.trace_requests[-1].resource_spans[0].resource.attributes
        return {kv.key: kv.value.string_value for kv in attrs}

    def last_metrics(self) -> dict[str, Any]:
        """The metrics of the last request by name (cumulative values: the last is the total)."""
        assert self.requests, "no export arrived"
        out: dict[str, Any] = {}
        for rm in self.requests[-1].resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    out[metric.name] = metric
        return out

    def resource(self) -> dict[str, str]:
        attrs = self.requests[-1].resource_metrics[0].resource.attributes
        return {kv.key: kv.value.string_value for kv in attrs}


@contextlib.asynccontextmanager
async def otlp_receiver() -> AsyncIterator[Receiver]:
    port = free_port()
    receiver = Receiver(f"http://127.0.0.1:{port}/v1/metrics", traces_url=f"http://127.0.0.1:{port}/v1/traces")

    async def metrics(request: web.Request) -> web.Response:
        receiver.content_types.append(request.content_type)
        parsed = ExportMetricsServiceRequest()
        parsed.ParseFromString(await request.read())
        receiver.requests.append(parsed)
        body = ExportMetricsServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    async def traces(request: web.Request) -> web.Response:
        receiver.content_types.append(request.content_type)
        parsed = ExportTraceServiceRequest()
        parsed.ParseFromString(await request.read())
        receiver.trace_requests.append(parsed)
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/metrics", metrics)
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield receiver
    finally:
        await runner.cleanup()
