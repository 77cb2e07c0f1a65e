# SPDX-License-Identifier: Apache-2.0
"""Finished batch spans as an OTLP `ExportTraceServiceRequest` (opentelemetry-proto), the traces'
twin of `metrics.encode_metrics`: one resource, one scope, the spans as `tracing` recorded them.

Span flags carry the W3C trace flags (sampled) and, as OTLP 1.4 defines, the "is remote" bits of
the span's parent (none: a batch span is a root) and of each link (remote: the gateway's context).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1 import trace_pb2 as pb

from .metrics import SCOPE
from .tracing import KIND_CONSUMER, SpanRecord, links_of

_KINDS: Final = {KIND_CONSUMER: pb.Span.SpanKind.SPAN_KIND_CONSUMER}
_HAS_IS_REMOTE: Final = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE: Final = 0x200  # SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK


def _kv(key: str, value: str | int) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _span(record: SpanRecord) -> pb.Span:
    links, dropped = links_of(record.links)
    span = pb.Span(
        trace_id=bytes.fromhex(record.trace_id),
        span_id=bytes.fromhex(record.span_id),
        flags=0x01 | _HAS_IS_REMOTE,  # sampled; a root, so its (absent) parent is not remote
        name=record.name,
        kind=_KINDS.get(record.kind, pb.Span.SpanKind.SPAN_KIND_INTERNAL),
        start_time_unix_nano=record.start_ns,
        end_time_unix_nano=record.end_ns,
        attributes=[_kv(k, v) for k, v in record.attributes],
        dropped_links_count=dropped,
    )
    for name, at in record.events:
        span.events.add(name=name, time_unix_nano=at)
    for link in links:
        span.links.add(
            trace_id=bytes.fromhex(link.trace_id),
            span_id=bytes.fromhex(link.span_id),
            flags=(link.flags & 0xFF) | _HAS_IS_REMOTE | _IS_REMOTE,
        )
    if record.error is not None:
        span.status.code = pb.Status.StatusCode.STATUS_CODE_ERROR
        span.status.message = record.error
    return span


def encode_spans(spans: Sequence[SpanRecord], *, resource: Mapping[str, str], version: str = "") -> bytes:
    """One request carrying every span under one resource and the sidecar's scope."""
    request = ExportTraceServiceRequest(
        resource_spans=[
            pb.ResourceSpans(
                resource=Resource(attributes=[_kv(k, v) for k, v in resource.items()]),
                scope_spans=[
                    pb.ScopeSpans(
                        scope=InstrumentationScope(name=SCOPE, version=version),
                        spans=[_span(s) for s in spans],
                    )
                ],
            )
        ]
    )
    return bytes(request.SerializeToString())


__all__ = ["encode_spans"]
