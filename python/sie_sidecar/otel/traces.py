# SPDX-License-Identifier: Apache-2.0
"""Finished batch spans as an OTLP `ExportTraceServiceRequest` written with `protowire`, the traces'
twin of `metrics.encode_metrics`: one resource, one scope, the spans as `tracing` recorded them.

Span flags carry the W3C trace flags (sampled) and, as OTLP 1.4 defines, the "is remote" bits of
the span's parent (remote when there is one: the gateway's context) and of each link (remote).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from .common import key_value, resource_message, scope_message
from .protowire import fixed32, fixed64, message, string, uint
from .tracing import KIND_CONSUMER, SpanRecord, links_of

_KIND_INTERNAL, _KIND_CONSUMER = 1, 5  # Span.SpanKind
_KINDS: Final = {KIND_CONSUMER: _KIND_CONSUMER}
_STATUS_ERROR: Final = 2  # Status.StatusCode.STATUS_CODE_ERROR
_HAS_IS_REMOTE: Final = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE: Final = 0x200  # SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK

# Field numbers (opentelemetry-proto trace.proto, trace_service.proto).
_REQUEST_RESOURCE_SPANS, _RS_RESOURCE, _RS_SCOPE_SPANS, _SS_SCOPE, _SS_SPANS = 1, 1, 2, 1, 2
_TRACE_ID, _SPAN_ID, _NAME, _KIND, _START, _END, _ATTRIBUTES = 1, 2, 5, 6, 7, 8, 9
_PARENT_SPAN_ID = 4
_EVENTS, _LINKS, _DROPPED_LINKS, _STATUS, _FLAGS = 11, 13, 14, 15, 16
_EVENT_TIME, _EVENT_NAME = 1, 2
_LINK_TRACE_ID, _LINK_SPAN_ID, _LINK_FLAGS = 1, 2, 6
_STATUS_MESSAGE, _STATUS_CODE = 2, 3


def _bytes(field: int, hex_id: str) -> bytes:
    raw = bytes.fromhex(hex_id)
    return message(field, raw) if raw else b""


def _span(record: SpanRecord) -> bytes:
    links, dropped = links_of(record.links)
    body = _bytes(_TRACE_ID, record.trace_id) + _bytes(_SPAN_ID, record.span_id)
    body += _bytes(_PARENT_SPAN_ID, record.parent_span_id) + string(_NAME, record.name)
    body += uint(_KIND, _KINDS.get(record.kind, _KIND_INTERNAL))
    body += fixed64(_START, record.start_ns) + fixed64(_END, record.end_ns)
    body += b"".join(key_value(_ATTRIBUTES, k, v) for k, v in record.attributes)
    for name, at in record.events:
        body += message(_EVENTS, fixed64(_EVENT_TIME, at) + string(_EVENT_NAME, name))
    for link in links:
        flags = (link.flags & 0xFF) | _HAS_IS_REMOTE | _IS_REMOTE
        ids = _bytes(_LINK_TRACE_ID, link.trace_id) + _bytes(_LINK_SPAN_ID, link.span_id)
        body += message(_LINKS, ids + fixed32(_LINK_FLAGS, flags))
    body += uint(_DROPPED_LINKS, dropped)
    if record.error is not None:
        body += message(_STATUS, string(_STATUS_MESSAGE, record.error) + uint(_STATUS_CODE, _STATUS_ERROR))
    remote = _IS_REMOTE if record.parent_span_id else 0  # a root's (absent) parent is not remote
    return message(_SS_SPANS, body + fixed32(_FLAGS, 0x01 | _HAS_IS_REMOTE | remote))


def encode_spans(spans: Sequence[SpanRecord], *, resource: Mapping[str, str], version: str = "") -> bytes:
    """One request carrying every span under one resource and the sidecar's scope."""
    scope_spans = message(_RS_SCOPE_SPANS, scope_message(_SS_SCOPE, version) + b"".join(map(_span, spans)))
    return message(_REQUEST_RESOURCE_SPANS, resource_message(_RS_RESOURCE, resource) + scope_spans)


__all__ = ["encode_spans"]
