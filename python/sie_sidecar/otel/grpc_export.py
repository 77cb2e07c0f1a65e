# SPDX-License-Identifier: Apache-2.0
"""OTLP/gRPC (sidecar-behaviour §1.2: gRPC is the default protocol) for both signals: each push is
one unary `Export` call of the signal's collector service carrying the same serialized request the
HTTP exporter posts, so both transports export identical data. `GrpcTransport` is the shared part
(endpoint, channel, call); metrics push `MetricsService/Export`, spans `TraceService/Export`.

The endpoint follows the OTLP exporter rules: `http://host:4317` is a plaintext channel to
`host:4317`, `https://host:4317` a TLS one (system roots); a path is ignored (gRPC has none); an
endpoint without a scheme is TLS (`OTEL_EXPORTER_OTLP_INSECURE` is not read: write `http://` for
plaintext). grpcio is imported when the exporter is built, at start-up, not at the first push.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final
from urllib.parse import urlsplit

from .export import EXPORT_TIMEOUT_S, PushExporter
from .trace_export import SpanExporter

#: The OTLP metrics service method (opentelemetry-proto `metrics_service.proto`).
EXPORT_METHOD: Final = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
#: The OTLP trace service method (opentelemetry-proto `trace_service.proto`).
TRACES_EXPORT_METHOD: Final = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
DEFAULT_PORT: Final = 4317


def grpc_target(endpoint: str) -> tuple[str, bool]:
    """(`host:port` target, secure) of an OTLP gRPC endpoint."""
    text = endpoint.strip()
    if "://" not in text:
        text = "https://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an OTLP gRPC endpoint: {endpoint!r}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port or DEFAULT_PORT}", parts.scheme == "https"


class GrpcTransport:
    """The gRPC side of an OTLP exporter, mixed in before its signal's base (which stores
    `_endpoint` and declares these three as abstract): one `grpc.aio` channel to the endpoint, one
    unary `METHOD` call per export. grpcio has no type information: the channel is `Any`."""

    METHOD: ClassVar[str]
    _endpoint: str

    def _load(self) -> None:
        import grpc  # type: ignore[import-untyped]  # noqa: F401 (once, before serving: see PushExporter)

    def _open(self) -> Any:
        import grpc

        target, secure = grpc_target(self._endpoint)
        if secure:
            return grpc.aio.secure_channel(target, grpc.ssl_channel_credentials())
        return grpc.aio.insecure_channel(target)

    async def _close(self, connection: Any) -> None:
        await connection.close()

    async def _send(self, connection: Any, body: bytes) -> None:
        # No serializers: the body is already the serialized request, and the reply (an
        # Export*ServiceResponse) is not needed. A non-OK status raises AioRpcError.
        export = connection.unary_unary(self.METHOD, request_serializer=None, response_deserializer=None)
        await export(body, timeout=EXPORT_TIMEOUT_S)


class GrpcMetricsExporter(GrpcTransport, PushExporter[Any]):
    """Pushes one registry to one OTLP/gRPC metrics endpoint (`MetricsService/Export`)."""

    METHOD = EXPORT_METHOD


class GrpcTraceExporter(GrpcTransport, SpanExporter[Any]):
    """Pushes one span buffer to one OTLP/gRPC traces endpoint (`TraceService/Export`); a failed
    call puts its spans back in front of the buffer, as over HTTP."""

    METHOD = TRACES_EXPORT_METHOD


__all__ = [
    "EXPORT_METHOD",
    "TRACES_EXPORT_METHOD",
    "GrpcMetricsExporter",
    "GrpcTraceExporter",
    "GrpcTransport",
    "grpc_target",
]
