# SPDX-License-Identifier: Apache-2.0
"""Batch spans (`SIE_TRACING_ENABLED`, issue 14): W3C trace context, the OTEL samplers, the
finished span's fields (`FinishedSpan`) and where finished spans go (`SpanBuffer`, then the SDK's
span processor). The tracer that starts one span per batch RPC is `otel.tracer`: the compiled
core's, or its twin (`_twins.tracing`).

Python touches a batch, not a message: a batch is sampled (or not) once. Its items' incoming
`traceparent`s are read in place and kept as distinct strings; the first valid one is the span's
parent and the rest its links, parsed when the exporter encodes them (`links_of`, the compiled
encoder), off the batch's path (sidecar-behaviour §5.4: a `sidecar.dispatch` span parented on the
first valid inbound W3C context, the other contexts links).

A batch without a valid inbound context is a root span: the `parentbased_*` samplers decide with
their root sampler (on, off, or the trace-id ratio). With a parent they follow its sampled flag;
the other samplers decide on the parent's trace id.

Nothing here imports the OpenTelemetry SDK: `otel.traces` presents finished spans to the SDK and
`otel.export` runs the SDK off the event loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final, Protocol

from ..wire.trace_context import (
    KIND_CONSUMER,
    MAX_LINKS,
    SAMPLED,
    SPAN_NAME,
    SpanContext,
    SpanRecord,
    format_traceparent,
    links_of,
    parse_traceparent,
)

#: The ratio samplers compare the trace id's low 64 bits with ratio * 2^64 (as the OTEL SDKs do).
_ID_LIMIT: Final = (1 << 64) - 1
_ROOT: Final = {
    "always_on": "on",
    "always_off": "off",
    "traceidratio": "ratio",
    "parentbased_always_on": "on",
    "parentbased_always_off": "off",
    "parentbased_traceidratio": "ratio",
}


class Sampler:
    """OTEL_TRACES_SAMPLER for a root span (every batch span is one, see the module docstring)."""

    __slots__ = ("_bound", "_root", "name", "ratio")

    def __init__(self, name: str = "parentbased_always_on", ratio: float = 1.0) -> None:
        if name not in _ROOT:
            raise ValueError(f"unknown sampler {name!r}")
        self.name = name
        self.ratio = min(1.0, max(0.0, ratio))
        self._root = _ROOT[name]
        self._bound = round(self.ratio * (1 << 64))

    @property
    def never(self) -> bool:
        """Whether no batch is ever sampled (then no trace id is even drawn, no context read). Never
        for the `parentbased_*` samplers: a sampled parent is followed whatever the root says."""
        if self.name.startswith("parentbased_"):
            return False
        return self._root == "off" or (self._root == "ratio" and self._bound == 0)

    def sampled_under(self, parent: SpanContext) -> bool:
        """The decision for a span whose parent is `parent` (a remote context): `parentbased_*`
        follow its sampled flag, the others decide on its trace id as for a root."""
        if self.name.startswith("parentbased_"):
            return parent.sampled
        return self.sampled(int(parent.trace_id, 16))

    def sampled(self, trace_id: int) -> bool:
        """The decision for a new trace id (128-bit int)."""
        if self._root == "on":
            return True
        if self._root == "off":
            return False
        return (trace_id & _ID_LIMIT) < self._bound


class FinishedSpan(Protocol):
    """A finished batch span as the buffer, the SDK's processor and the encoders read it: a
    `SpanRecord` (the twin tracer's) or the compiled tracer's `BatchSpan` itself."""

    @property
    def trace_id(self) -> str: ...
    @property
    def span_id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def start_ns(self) -> int: ...
    @property
    def end_ns(self) -> int: ...
    @property
    def attributes(self) -> tuple[tuple[str, str | int], ...]: ...
    @property
    def events(self) -> tuple[tuple[str, int], ...]: ...
    @property
    def links(self) -> tuple[str, ...]: ...
    @property
    def error(self) -> str | None: ...
    @property
    def parent_span_id(self) -> str: ...


class SpanBuffer:
    """Where finished spans go: kept here (at most `capacity`, the oldest dropped and counted) until
    the SDK's span processor is loaded off the event loop (`otel.export`), then handed to it as they
    end (`forward`), the kept ones first."""

    def __init__(self, capacity: int = 2048) -> None:
        self.capacity = max(1, capacity)
        self._spans: deque[FinishedSpan] = deque(maxlen=self.capacity)
        self.dropped = 0
        #: Where each span goes as it ends while attached (None: kept here). The tracers read it
        #: when a span ends and call it themselves: `add` is then no Python frame a batch.
        self.forward: Callable[[FinishedSpan], None] | None = None

    def __len__(self) -> int:
        return len(self._spans)

    def add(self, span: FinishedSpan) -> None:
        forward = self.forward
        if forward is not None:
            forward(span)
            return
        spans = self._spans
        if len(spans) == self.capacity:
            self.dropped += 1  # the deque drops the oldest itself
        spans.append(span)

    def take(self, n: int | None = None) -> list[FinishedSpan]:
        """Up to `n` (default all) of the oldest kept spans, removed."""
        spans = self._spans
        count = len(spans) if n is None else min(len(spans), n)
        return [spans.popleft() for _ in range(count)]

    def attach(self, forward: Callable[[FinishedSpan], None]) -> None:
        """From now on each span goes to `forward` as it ends; the kept ones go first, in order."""
        for span in self.take():
            forward(span)
        self.forward = forward

    def detach(self) -> None:
        """Keep spans here again (the processor is shutting down)."""
        self.forward = None


__all__ = [
    "KIND_CONSUMER",
    "MAX_LINKS",
    "SAMPLED",
    "SPAN_NAME",
    "FinishedSpan",
    "Sampler",
    "SpanBuffer",
    "SpanContext",
    "SpanRecord",
    "format_traceparent",
    "links_of",
    "parse_traceparent",
]
