# SPDX-License-Identifier: Apache-2.0
"""Finished batch spans (`tracing.FinishedSpan`) handed to the SDK's `BatchSpanProcessor`, which
batches them to its OTLP span exporter (`OTEL_BSP_*`) in its own thread.

With the sidecar's own exporters (`otel.span_exporters`, which encode the records themselves), each
finished span goes into the processor's queue as it is: no `ReadableSpan` is built per span on the
event loop (that was ~30,000 instructions a batch, docs/benchmarks.md "Tracing built by the compiled
core"). Any other exporter gets a `BatchSpanData` per span, the SDK's `ReadableSpan` of a record;
the sidecar's exporters build one too where they fall back to the SDK's encoder. Its attributes,
events, links and status are built when read; the items' `traceparent`s are parsed into links
there (`tracing.links_of`), off the batch's path.

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
from .tracing import KIND_CONSUMER, FinishedSpan, links_of

_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_UNSET: Final = Status(StatusCode.UNSET)
_KINDS: Final = {KIND_CONSUMER: SpanKind.CONSUMER}


def _context(trace_id: str, span_id: str, *, remote: bool, flags: TraceFlags = _SAMPLED) -> SpanContext:
    return SpanContext(int(trace_id, 16), int(span_id, 16), remote, flags)


class BatchSpanData(ReadableSpan):
    """One finished batch span, read by the SDK's processor and exporter (see the module docstring)."""

    def __init__(self, record: FinishedSpan, resource: Resource, scope: InstrumentationScope) -> None:
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


class TakesRecords:
    """An exporter that takes finished records as they are (the sidecar's own, `otel.span_exporters`):
    `bind` tells it the resource and scope they belong to, and `readable` makes the SDK's spans of
    them where it falls back to the SDK's encoder."""

    resource: Resource | None = None
    scope: InstrumentationScope | None = None

    def bind(self, resource: Resource, scope: InstrumentationScope) -> None:
        self.resource, self.scope = resource, scope

    def readable(self, spans: Sequence[object]) -> list[ReadableSpan]:
        """`spans` as the SDK's encoder reads them (records wrapped, `ReadableSpan`s as they are)."""
        resource, scope = self.resource, self.scope
        if resource is None or scope is None:
            return [s for s in spans if isinstance(s, ReadableSpan)]
        return [s if isinstance(s, ReadableSpan) else BatchSpanData(s, resource, scope) for s in spans]  # type: ignore[arg-type]


class SpanPipeline:
    """The SDK's batch span processor over one exporter, and `forward`, which hands it a finished
    span (the tracer's buffer calls it on the event loop as each span ends)."""

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
        #: The processor's queue, which `on_end` puts each sampled span into (SDK 1.45 and later).
        queue = getattr(self.processor, "_batch_processor", None)
        emit = getattr(queue, "emit", None)
        self._emit: Callable[[FinishedSpan], None] | None = None
        if isinstance(exporter, TakesRecords) and callable(emit):
            exporter.bind(resource, self._scope)
            self._emit = emit

    @property
    def takes_records(self) -> bool:
        """Whether finished records go into the processor's queue as they are (see the module docstring)."""
        return self._emit is not None

    @property
    def forward(self) -> Callable[[FinishedSpan], None]:
        if self._emit is not None:
            # Every batch span is sampled (an unsampled batch has none): `on_end`'s only check.
            return self._emit
        on_end, resource, scope = self.processor.on_end, self._resource, self._scope

        def forward(record: FinishedSpan) -> None:
            on_end(BatchSpanData(record, resource, scope))

        return forward

    def shutdown(self) -> None:
        """Export what the processor holds and stop its thread (blocking: the OTLP thread calls it)."""
        self.processor.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated


__all__ = ["BatchSpanData", "SpanPipeline", "TakesRecords"]
