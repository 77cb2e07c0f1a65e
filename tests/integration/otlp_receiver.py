# SPDX-License-Identifier: Apache-2.0
"""Real OTLP receivers on loopback, for the sidecar's exporters (the OpenTelemetry SDK's) to send to:

* `otlp_receiver`: OTLP/HTTP, an aiohttp server taking `/v1/metrics` and `/v1/traces`;
* `otlp_grpc_receiver`: OTLP/gRPC, a `grpc.aio` server with both collector services.

Each decodes every request with opentelemetry-proto and keeps it, with what came with it: the
headers (gRPC metadata), the content encoding (the body is decompressed here, not by the server
library, so a body that says gzip and is not fails), and the client certificate's common name.
Either can require a header (answering 401 / UNAUTHENTICATED without it), require a client
certificate signed by the test CA over TLS (`make_mtls`), and refuse its first calls (a Collector
that is not up yet: 503 / UNAVAILABLE, which the SDK retries)."""

from __future__ import annotations

import contextlib
import gzip
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
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

from .tls_certs import Pki, make_pki

METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"
TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


#: The CN of the test client certificate (the receivers record who connected).
CLIENT_CN = "sie-sidecar-test-client"
MtlsFiles = Pki


def make_mtls(directory: Path) -> Pki:
    """A CA, a server pair for 127.0.0.1 / localhost and a client pair with CN `CLIENT_CN`."""
    return make_pki(directory, name="sie-sidecar OTLP test CA", client_cn=CLIENT_CN)


@dataclass
class Receiver:
    """What a receiver took. `url` is the metrics endpoint as the sidecar is given it (HTTP: the
    `/v1/metrics` URL; gRPC: `scheme://host:port`), `base` the generic endpoint."""

    url: str
    base: str = ""
    traces_url: str = ""
    requests: list[ExportMetricsServiceRequest] = field(default_factory=list)
    trace_requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)
    #: Per accepted request: its content encoding (`gzip`, or `identity`).
    encodings: list[str] = field(default_factory=list)
    #: Per request, accepted or not: its headers (gRPC: metadata), keys lower case.
    headers: list[dict[str, str]] = field(default_factory=list)
    #: Per accepted request: the common name of the client certificate ("" without one).
    peers: list[str] = field(default_factory=list)
    #: Calls answered 401 / UNAUTHENTICATED (a required header missing or wrong).
    rejected: int = 0
    #: Calls refused as unavailable (`refuse` of them, first).
    refuse: int = 0
    refused: int = 0

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

    def sidecar_resource(self) -> dict[str, str]:
        """`resource()` without the SDK's own `telemetry.sdk.*` attributes."""
        return {k: v for k, v in self.resource().items() if not k.startswith("telemetry.sdk.")}

    def _admit(self, headers: Mapping[str, str], require: Mapping[str, str]) -> str | None:
        """None when the call is taken, else why not ("unauthenticated" or "unavailable")."""
        self.headers.append(dict(headers))
        if any(headers.get(k.lower()) != v for k, v in require.items()):
            self.rejected += 1
            return "unauthenticated"
        if self.refused < self.refuse:
            self.refused += 1
            return "unavailable"
        return None


def _server_tls(tls: MtlsFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tls.ca))
    context.load_cert_chain(str(tls.server_cert), str(tls.server_key))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def _peer_cn(peercert: Any) -> str:
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


@contextlib.asynccontextmanager
async def otlp_receiver(
    *, require: Mapping[str, str] | None = None, tls: MtlsFiles | None = None, refuse: int = 0
) -> AsyncIterator[Receiver]:
    """OTLP/HTTP on loopback; with `tls`, HTTPS that requires a client certificate from the CA."""
    port = free_port()
    base = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    receiver = Receiver(f"{base}/v1/metrics", base=base, traces_url=f"{base}/v1/traces", refuse=refuse)
    required = dict(require or {})

    async def take(request: web.Request) -> bytes | web.Response:
        why = receiver._admit({k.lower(): v for k, v in request.headers.items()}, required)
        if why == "unauthenticated":
            return web.Response(status=401)
        if why == "unavailable":
            return web.Response(status=503)
        body = await request.read()
        encoding = request.headers.get("Content-Encoding", "identity").lower()
        if encoding == "gzip":
            body = gzip.decompress(body)  # raises (a 500) when the body is not gzip
        elif encoding != "identity":
            return web.Response(status=415)
        receiver.content_types.append(request.content_type)
        receiver.encodings.append(encoding)
        receiver.peers.append(_peer_cn(request.transport.get_extra_info("peercert") if request.transport else None))
        return body

    async def metrics(request: web.Request) -> web.Response:
        body = await take(request)
        if isinstance(body, web.Response):
            return body
        receiver.requests.append(ExportMetricsServiceRequest.FromString(body))
        return web.Response(
            body=ExportMetricsServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    async def traces(request: web.Request) -> web.Response:
        body = await take(request)
        if isinstance(body, web.Response):
            return body
        receiver.trace_requests.append(ExportTraceServiceRequest.FromString(body))
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    app = web.Application()
    app.router.add_post("/v1/metrics", metrics)
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app, auto_decompress=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=_server_tls(tls) if tls else None)
    await site.start()
    try:
        yield receiver
    finally:
        await runner.cleanup()


def _grpc_peer_cn(context: Any) -> str:
    names = context.auth_context().get("x509_common_name") or [b""]
    return bytes(names[0]).decode()


@contextlib.asynccontextmanager
async def otlp_grpc_receiver(
    *, require: Mapping[str, str] | None = None, tls: MtlsFiles | None = None, refuse: int = 0
) -> AsyncIterator[Receiver]:
    """Both OTLP collector services on one loopback port; `refuse` counts calls to either. The server
    leaves messages compressed (`grpc.per_message_decompression` off): the deserializer inflates a
    gzip one itself and records which each was."""
    required = dict(require or {})
    server = grpc.aio.server(options=[("grpc.per_message_decompression", 0)])
    if tls is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        credentials = grpc.ssl_server_credentials(
            [(tls.server_key.read_bytes(), tls.server_cert.read_bytes())],
            root_certificates=tls.ca.read_bytes(),
            require_client_auth=True,
        )
        port = server.add_secure_port("127.0.0.1:0", credentials)
    base = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    receiver = Receiver(base, base=base, traces_url=base, refuse=refuse)
    encodings: list[str] = []

    def inflate(data: bytes) -> bytes:
        gzipped = data[:2] == b"\x1f\x8b"
        encodings.append("gzip" if gzipped else "identity")
        return gzip.decompress(data) if gzipped else data

    async def admit(context: Any) -> None:
        metadata = {str(m.key).lower(): str(m.value) for m in context.invocation_metadata()}
        why = receiver._admit(metadata, required)
        if why == "unauthenticated":
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing header")
        if why == "unavailable":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "not yet")
        receiver.encodings.append(encodings[-1])
        receiver.peers.append(_grpc_peer_cn(context))
        receiver.content_types.append("application/grpc")

    async def export_metrics(request: ExportMetricsServiceRequest, context: Any) -> ExportMetricsServiceResponse:
        await admit(context)
        receiver.requests.append(request)
        return ExportMetricsServiceResponse()

    async def export_traces(request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:
        await admit(context)
        receiver.trace_requests.append(request)
        return ExportTraceServiceResponse()

    def handler(service: str, method: Any, message: Any, reply: Any) -> Any:
        rpc = grpc.unary_unary_rpc_method_handler(
            method,
            request_deserializer=lambda data: message.FromString(inflate(data)),
            response_serializer=reply.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(service, {"Export": rpc})

    server.add_generic_rpc_handlers(
        (
            handler(METRICS_SERVICE, export_metrics, ExportMetricsServiceRequest, ExportMetricsServiceResponse),
            handler(TRACE_SERVICE, export_traces, ExportTraceServiceRequest, ExportTraceServiceResponse),
        )
    )
    await server.start()
    try:
        yield receiver
    finally:
        await server.stop(grace=None)


__all__ = ["CLIENT_CN", "MtlsFiles", "Receiver", "make_mtls", "otlp_grpc_receiver", "otlp_receiver"]
