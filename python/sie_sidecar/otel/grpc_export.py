# SPDX-License-Identifier: Apache-2.0
"""OTLP/gRPC metrics push (sidecar-behaviour §1.2: gRPC is the default protocol): each push is one
unary `MetricsService/Export` call carrying the same serialized `ExportMetricsServiceRequest` the
HTTP exporter posts, so both transports export identical data.

The endpoint follows the OTLP exporter rules: `http://host:4317` is a plaintext channel to
`host:4317`, `https://host:4317` a TLS one (system roots); a path is ignored (gRPC has none); an
endpoint without a scheme is TLS (`OTEL_EXPORTER_OTLP_INSECURE` is not read: write `http://` for
plaintext). grpcio is imported at the first push, not at start-up.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import urlsplit

from .export import EXPORT_TIMEOUT_S, PushExporter

#: The OTLP metrics service method (opentelemetry-proto `metrics_service.proto`).
EXPORT_METHOD: Final = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
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


class GrpcMetricsExporter(PushExporter[Any]):
    """Pushes one registry to one OTLP/gRPC metrics endpoint over one `grpc.aio` channel (grpcio has
    no type information: the channel is `Any`)."""

    def _open(self) -> Any:
        import grpc  # type: ignore[import-untyped]

        target, secure = grpc_target(self._endpoint)
        if secure:
            return grpc.aio.secure_channel(target, grpc.ssl_channel_credentials())
        return grpc.aio.insecure_channel(target)

    async def _close(self, connection: Any) -> None:
        await connection.close()

    async def _send(self, connection: Any, body: bytes) -> None:
        # No serializers: the body is already the serialized request, and the reply (an
        # ExportMetricsServiceResponse) is not needed. A non-OK status raises AioRpcError.
        export = connection.unary_unary(EXPORT_METHOD, request_serializer=None, response_deserializer=None)
        await export(body, timeout=EXPORT_TIMEOUT_S)


__all__ = ["EXPORT_METHOD", "GrpcMetricsExporter", "grpc_target"]
