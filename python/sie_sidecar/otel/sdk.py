# SPDX-License-Identifier: Apache-2.0
"""The OpenTelemetry SDK's OTLP exporters and resource, built from the sidecar's resolved settings
(`Target`, `otel.export`). Every value is passed explicitly, so what the settings resolved (with
the specification's precedence and units) is what the exporter uses.

Only the OTLP thread imports this module (`otel.export.OtlpThread`): the SDK, its exporters and
protobuf cost ~0.1 s of CPU to import (docs/benchmarks.md), which the serving event loop never pays.
gRPC's exporter (and grpcio) is imported only for a gRPC target.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.resources import (
    TELEMETRY_SDK_LANGUAGE,
    TELEMETRY_SDK_NAME,
    TELEMETRY_SDK_VERSION,
    Resource,
)
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.version import __version__ as sdk_version
from opentelemetry.util.re import parse_env_headers

from .target import Target


class _HashedResource(Resource):
    """A resource that hashes once: the SDK's span encoder groups spans by resource and hashed it
    per span (a JSON dump each time), a fifth of a span's encoding (docs/benchmarks.md)."""

    def __init__(self, attributes: Mapping[str, str]) -> None:
        super().__init__(dict(attributes))
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other)


def make_resource(attributes: Mapping[str, str]) -> Resource:
    """The SDK's own `telemetry.sdk.*` attributes (as `Resource.create` adds them), then the
    sidecar's, which win."""
    base = {TELEMETRY_SDK_LANGUAGE: "python", TELEMETRY_SDK_NAME: "opentelemetry", TELEMETRY_SDK_VERSION: sdk_version}
    return _HashedResource({**base, **attributes})


def _headers(target: Target) -> dict[str, str]:
    """`key=value,...` as the SDK reads `OTEL_EXPORTER_OTLP_HEADERS` (W3C baggage form, values
    URL-decoded, keys lower case; liberal, as the SDK's exporters are)."""
    return dict(parse_env_headers(target.headers, liberal=True))


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def _grpc_options(target: Target) -> dict[str, Any]:
    """The gRPC exporter's channel: plaintext for `http://` (or `_INSECURE` without a scheme), else
    TLS verified with `_CERTIFICATE` (system roots without it) and the client pair when given."""
    import grpc  # type: ignore[import-untyped]

    scheme = target.endpoint.partition("://")[0].lower() if "://" in target.endpoint else ""
    insecure = scheme == "http" or (scheme != "https" and target.insecure)
    options: dict[str, Any] = {
        "endpoint": target.endpoint,
        "insecure": insecure,
        "headers": _headers(target) or None,
        "timeout": target.timeout_s,
        "compression": grpc.Compression.Gzip if target.compression == "gzip" else grpc.Compression.NoCompression,
    }
    if not insecure:
        options["credentials"] = grpc.ssl_channel_credentials(
            root_certificates=_read(target.certificate),
            private_key=_read(target.client_key),
            certificate_chain=_read(target.client_certificate),
        )
    return options


def _http_session(target: Target) -> Any:
    """The exporter's requests session: `otel.http_session`'s light one (one kept-alive
    `http.client` connection) unless a proxy or `.netrc` from the environment applies to the
    endpoint; then requests' own. requests lets `REQUESTS_CA_BUNDLE` / `CURL_CA_BUNDLE` replace a
    session's CA bundle at each request (set in many images, it silently beat
    `OTEL_EXPORTER_OTLP_CERTIFICATE`, tests/integration/test_otlp_env.py); in both the configured
    certificate wins, and the rest of the environment (proxies) applies as before."""
    import requests

    from .http_session import light_session

    light = light_session(target.endpoint)
    if light is not None:
        return light

    class OtlpSession(requests.Session):
        def merge_environment_settings(
            self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any
        ) -> dict[str, Any]:
            merged: dict[str, Any] = super().merge_environment_settings(url, proxies, stream, verify, cert)
            merged["verify"] = self.verify
            return merged

    return OtlpSession() if target.certificate is not None else None


def _http_options(target: Target) -> dict[str, Any]:
    from opentelemetry.exporter.otlp.proto.http import Compression

    return {
        "session": _http_session(target),
        "endpoint": target.endpoint,
        "headers": _headers(target),
        "timeout": target.timeout_s,
        "compression": Compression.Gzip if target.compression == "gzip" else Compression.NoCompression,
        "certificate_file": target.certificate,
        "client_key_file": target.client_key,
        "client_certificate_file": target.client_certificate,
    }


def metric_exporter(target: Target) -> MetricExporter:
    """The SDK's OTLP metric exporter for `target`'s protocol (`grpc` or `http/protobuf`)."""
    if target.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics

        return GrpcMetrics(**_grpc_options(target))
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    from .metrics import TakesRequests

    class HttpMetrics(TakesRequests, OTLPMetricExporter):
        """The SDK's OTLP/HTTP metric exporter, sending the compiled encoding (`MetricsBridge.request_of`):
        the SDK's encoder was about half of an export's CPU. Everything else is the SDK's: endpoint,
        headers, TLS, compression, timeout, retries."""

        def export_request(self, body: bytes) -> MetricExportResult | None:
            client = getattr(self, "_client", None)
            limit = getattr(self, "_max_request_size", None)
            if (
                client is None
                or getattr(self, "_shutdown", True)
                or getattr(self, "_max_export_batch_size", None) is not None
                or (isinstance(limit, int) and len(body) > limit)
            ):
                return None  # the SDK's own path: it splits, refuses and logs as it does
            result = client.export(body)
            return MetricExportResult.SUCCESS if result.success else MetricExportResult.FAILURE

    return HttpMetrics(**_http_options(target))


def span_exporter(target: Target) -> SpanExporter:
    """The SDK's OTLP span exporter for `target`'s protocol (`grpc` or `http/protobuf`), encoding
    the batch spans with the compiled encoder (`otel.span_exporters`)."""
    from .span_exporters import grpc_span_exporter, http_span_exporter

    if target.protocol == "grpc":
        return grpc_span_exporter(**_grpc_options(target))
    return http_span_exporter(**_http_options(target))


__all__ = ["make_resource", "metric_exporter", "span_exporter"]
