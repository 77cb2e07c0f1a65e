# SPDX-License-Identifier: Apache-2.0
"""The SDK's OTLP span exporters with the compiled encoder in place of the SDK's, taking the
tracer's finished records as they are (`traces.TakesRecords`).

Why: the SDK's encoder builds a protobuf object per span, attribute, event and link in Python:
~30 µs per batch span without links, ~200 µs with 64 (docs/benchmarks.md), about 4% of the
sidecar's CPU when every batch is traced. `wire.otlp` writes the same request in ~1-7 µs. The
SDK's exporter still does everything else: endpoint, headers, TLS, compression, timeouts, retries.

- HTTP: the request's bytes go to the exporter's HTTP client, as its own `export` sends them.
- gRPC: the bytes are parsed into the SDK's `ExportTraceServiceRequest` (in C) where the exporter
  asks for its request (`_translate_data`, the hook its subclasses fill).

Spans that are not the sidecar's batch spans of one resource and scope, a process running the
twins (`SIE_SIDECAR_NO_EXTENSIONS=1`), or an SDK whose HTTP exporter lacks its client fall back
to the SDK's own encoding. Only the OTLP thread imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from ..wire.otlp import trace_request_encoder
from .traces import BatchSpanData, TakesRecords


def native_request(
    spans: Sequence[object],
    resource: Resource | None = None,
    scope: InstrumentationScope | None = None,
) -> bytes | None:
    """The export request for `spans`, compiled-encoded; None when the SDK's encoder must do it.
    `spans`: finished records (of `resource` and `scope`, which the exporter was bound to) or
    `BatchSpanData` (each carrying its own, all the same ones)."""
    encode = trace_request_encoder()
    if encode is None or not spans:
        return None
    records: list[object] = []
    for span in spans:
        if isinstance(span, BatchSpanData):
            if resource is None:
                resource, scope = span.resource, span.instrumentation_scope
            elif span.resource is not resource or span.instrumentation_scope is not scope:
                return None
            records.append(span.record)
        elif isinstance(span, ReadableSpan):
            return None  # not one of the sidecar's batch spans
        else:
            records.append(span)
    if resource is None or scope is None:
        return None
    attributes = list(resource.attributes.items())
    if not all(isinstance(value, str) for _, value in attributes):
        return None
    return encode(records, attributes, scope.name, scope.version or "")  # type: ignore[arg-type]


def http_span_exporter(**options: Any) -> SpanExporter:
    """The SDK's OTLP/HTTP span exporter, sending compiled-encoded requests."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    class HttpSpans(TakesRecords, OTLPSpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            client = getattr(self, "_client", None)
            limit = getattr(self, "_max_request_size", None)
            shut = getattr(self, "_shutdown", True)
            body = None if client is None or shut else native_request(spans, self.resource, self.scope)
            if body is None or (isinstance(limit, int) and len(body) > limit):
                return super().export(self.readable(spans))  # the SDK encodes, and logs what it refuses
            result = client.export(body)  # type: ignore[union-attr]
            return SpanExportResult.SUCCESS if result.success else SpanExportResult.FAILURE

    return HttpSpans(**options)


def grpc_span_exporter(**options: Any) -> SpanExporter:
    """The SDK's OTLP/gRPC span exporter, its request parsed from the compiled encoding."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    class GrpcSpans(TakesRecords, OTLPSpanExporter):
        def _translate_data(self, data: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
            body = native_request(data, self.resource, self.scope)
            if body is None:
                return super()._translate_data(self.readable(data))
            request: ExportTraceServiceRequest = ExportTraceServiceRequest.FromString(body)
            return request

    return GrpcSpans(**options)


__all__ = ["grpc_span_exporter", "http_span_exporter", "native_request"]
