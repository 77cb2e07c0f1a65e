# SPDX-License-Identifier: Apache-2.0
"""Batch spans (`tracing.SpanRecord`) as the OpenTelemetry SDK reads a finished span, and the SDK's
`BatchSpanProcessor` that batches them to its OTLP span exporter (`OTEL_BSP_*`).

A `BatchSpanData` is made on the event loop when a batch's span ends, so it costs only what the
processor reads there (the span context, for the sampled flag); attributes, events, links and status
are built when the exporter encodes the span, in the processor's own thread. That is where the
items' `traceparent`s are parsed into links (`tracing.links_of`), off the batch's path.

The parent (the first valid inbound context) and every link are remote contexts; the SDK's encoder
writes that in the OTLP span and link flags. Only the OTLP thread (`otel.export`) imports this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from types import MappingProxyType
from typing import Final

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import Attributes

from .metrics import SCOPE
from .tracing import KIND_CONSUMER, SpanRecord, links_of

_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_UNSET: Final = Status(StatusCode.UNSET)
_KINDS: Final = {KIND_CONSUMER: SpanKind.CONSUMER}


def _context(trace_id: str, span_id: str, *, remote: bool, flags: TraceFlags = _SAMPLED) -> SpanContext:
    return SpanContext(int(trace_id, 16), int(span_id, 16), remote, flags)


class BatchSpanData(ReadableSpan):
    """One finished batch span, read by the SDK's processor and exporter (see the module docstring)."""

    def __init__(self, record: SpanRecord, resource: Resource, scope: InstrumentationScope) -> None:
        super().__init__(
            record.name,
            context=_context(record.trace_id, record.span_id, remote=False),
            resource=resource,
            kind=_KINDS.get(record.kind, SpanKind.INTERNAL),
            start_time=record.start_ns,
            end_time=record.end_ns,
            instrumentation_scope=scope,
        )
        self.record = record

    @property
    def parent(self) -> SpanContext | None:
        record = self.record
        return _context(record.trace_id, record.parent_span_id, remote=True) if record.parent_span_id else None

    @property
    def attributes(self) -> Attributes:
        return MappingProxyType(dict(self.record.attributes))

    @property
    def events(self) -> Sequence[Event]:
        return tuple(Event(name, timestamp=at) for name, at in self.record.events)

    @cached_property
    def _links_and_dropped(self) -> tuple[tuple[Link, ...], int]:
        contexts, dropped = links_of(self.record.links)
        links = tuple(
            Link(_context(c.trace_id, c.span_id, remote=True, flags=TraceFlags(c.flags & 0xFF))) for c in contexts
        )
        return links, dropped

    @property
    def links(self) -> Sequence[trace_api.Link]:
        return self._links_and_dropped[0]

    @property
    def dropped_links(self) -> int:
        return self._links_and_dropped[1]

    @property
    def status(self) -> Status:
        error = self.record.error
        return _UNSET if error is None else Status(StatusCode.ERROR, error)


class SpanPipeline:
    """The SDK's batch span processor over one exporter, and `forward`, which hands it a record
    (the tracer's buffer calls it on the event loop as each span ends)."""

    def __init__(
        self,
        exporter: SpanExporter,
        resource: Resource,
        *,
        version: str = "",
        max_queue_size: int = 2048,
        schedule_delay_s: float = 5.0,
        max_export_batch_size: int = 512,
        export_timeout_s: float = 30.0,
    ) -> None:
        self._resource = resource
        self._scope = InstrumentationScope(SCOPE, version)
        self.processor = BatchSpanProcessor(
            exporter,
            max_queue_size=max_queue_size,
            schedule_delay_millis=schedule_delay_s * 1000.0,
            max_export_batch_size=min(max_export_batch_size, max_queue_size),
            export_timeout_millis=export_timeout_s * 1000.0,
        )

    @property
    def forward(self) -> Callable[[SpanRecord], None]:
        on_end, resource, scope = self.processor.on_end, self._resource, self._scope

        def forward(record: SpanRecord) -> None:
            on_end(BatchSpanData(record, resource, scope))

        return forward

    def shutdown(self) -> None:
        """Export what the processor holds and stop its thread (blocking: the OTLP thread calls it)."""
        self.processor.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated


__all__ = ["BatchSpanData", "SpanPipeline"]
