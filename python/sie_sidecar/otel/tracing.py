# SPDX-License-Identifier: Apache-2.0
"""Batch spans (`SIE_TRACING_ENABLED`, issue 14): one span per batch RPC, W3C trace context, the
OTEL samplers, and where finished spans go (`SpanBuffer`, then the SDK's span processor).

Python touches a batch, not a message: a batch is sampled (or not) once. Its items' incoming
`traceparent`s are read in one native call and kept as distinct strings (deduplicated in C); the
first valid one is the span's parent and the rest its links, parsed when the SDK's exporter reads
them (`links_of`, `otel.traces`), off the batch's path (sidecar-behaviour §5.4: a `sidecar.dispatch`
span parented on the first valid inbound W3C context, the other contexts links).

A batch without a valid inbound context is a root span: the `parentbased_*` samplers decide with
their root sampler (on, off, or the trace-id ratio). With a parent they follow its sampled flag;
the other samplers decide on the parent's trace id.

Nothing here imports the OpenTelemetry SDK: recording a span is a small record per batch;
`otel.traces` presents it to the SDK and `otel.export` runs the SDK off the event loop.
"""

from __future__ import annotations

import random
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, NamedTuple

#: version 00 only, lower-case hex, nothing after the flags (W3C Trace Context §3.2, strict).
_TRACEPARENT: Final = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16
SAMPLED: Final = 0x01
#: Links kept per span; the rest are counted in the span's `dropped_links_count`.
MAX_LINKS: Final = 128
KIND_CONSUMER: Final = "consumer"
#: (model, operation) attribute prefixes a tracer keeps before starting over.
_MAX_PREFIXES: Final = 1024
#: sidecar-behaviour §5.4: the batch span's name.
SPAN_NAME: Final = "sidecar.dispatch"
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


@dataclass(frozen=True, slots=True)
class SpanContext:
    """A parsed `traceparent`: ids as lower-case hex, the trace flags."""

    trace_id: str
    span_id: str
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)

    @property
    def traceparent(self) -> str:
        return format_traceparent(self.trace_id, self.span_id, self.flags)


def parse_traceparent(value: object) -> SpanContext | None:
    """A W3C `traceparent`, strictly: version 00, 32-hex trace id and 16-hex span id (neither all
    zero), two-hex flags, lower case, nothing else. Anything else is None (no link, no error)."""
    if not isinstance(value, str) or len(value) != 55:
        return None
    m = _TRACEPARENT.fullmatch(value)
    if m is None:
        return None
    trace_id, span_id, flags = m.groups()
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return SpanContext(trace_id, span_id, int(flags, 16))


def links_of(traceparents: Iterable[str]) -> tuple[list[SpanContext], int]:
    """A span's links from its items' `traceparent`s: valid ones only, each (trace, span) once, at
    most MAX_LINKS; and how many valid distinct ones did not fit."""
    seen: dict[tuple[str, str], SpanContext] = {}
    dropped = 0
    for value in traceparents:
        ctx = parse_traceparent(value)
        if ctx is None or (key := (ctx.trace_id, ctx.span_id)) in seen:
            continue
        if len(seen) < MAX_LINKS:
            seen[key] = ctx
        else:
            dropped += 1
    return list(seen.values()), dropped


def format_traceparent(trace_id: str, span_id: str, flags: int = SAMPLED) -> str:
    """`00-{trace_id}-{span_id}-{flags:02x}` (ids already lower-case hex of 32 and 16 digits)."""
    return f"00-{trace_id}-{span_id}-{flags & 0xFF:02x}"


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


class SpanRecord(NamedTuple):
    """One finished span, ready to encode. Times are Unix nanoseconds; ids lower-case hex. A named
    tuple: one is made per traced batch, and a frozen dataclass took 1.8 µs to build, this 0.3."""

    trace_id: str
    span_id: str
    name: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: tuple[tuple[str, str | int], ...]
    #: (name, Unix ns)
    events: tuple[tuple[str, int], ...]
    #: The items' distinct `traceparent` strings, unparsed (`links_of` makes the links, at export).
    links: tuple[str, ...]
    #: None: status unset (the batch ran); else the ERROR status' message.
    error: str | None
    #: The remote parent's span id (lower-case hex), "" for a root span.
    parent_span_id: str = ""


class SpanBuffer:
    """Where finished spans go: kept here (at most `capacity`, the oldest dropped and counted) until
    the SDK's span processor is loaded off the event loop (`otel.export`), then handed to it as they
    end (`forward`), the kept ones first."""

    def __init__(self, capacity: int = 2048) -> None:
        self.capacity = max(1, capacity)
        self._spans: deque[SpanRecord] = deque(maxlen=self.capacity)
        self.dropped = 0
        self._forward: Callable[[SpanRecord], None] | None = None

    def __len__(self) -> int:
        return len(self._spans)

    def add(self, span: SpanRecord) -> None:
        forward = self._forward
        if forward is not None:
            forward(span)
            return
        spans = self._spans
        if len(spans) == self.capacity:
            self.dropped += 1  # the deque drops the oldest itself
        spans.append(span)

    def take(self, n: int | None = None) -> list[SpanRecord]:
        """Up to `n` (default all) of the oldest kept spans, removed."""
        spans = self._spans
        count = len(spans) if n is None else min(len(spans), n)
        return [spans.popleft() for _ in range(count)]

    def attach(self, forward: Callable[[SpanRecord], None]) -> None:
        """From now on each span goes to `forward` as it ends; the kept ones go first, in order."""
        for span in self.take():
            forward(span)
        self._forward = forward

    def detach(self) -> None:
        """Keep spans here again (the processor is shutting down)."""
        self._forward = None


def _random_trace_id() -> int:
    return random.getrandbits(128) or 1


def _random_span_id() -> str:
    return f"{random.getrandbits(64) or 1:016x}"


class BatchSpan:
    """The span of one batch while it runs: its context goes to the backend in every RunBatchItem
    (`wire_context`), its links are the items' own contexts."""

    __slots__ = ("_attrs", "_buffer", "_events", "_links", "_name", "_start", "parent_span_id", "span_id", "trace_id")

    def __init__(
        self,
        buffer: SpanBuffer,
        trace_id: str,
        name: str,
        attributes: list[tuple[str, str | int]],
        parent_span_id: str = "",
    ) -> None:
        self._buffer = buffer
        self.trace_id = trace_id
        self.parent_span_id = parent_span_id
        self.span_id = _random_span_id()
        self._name = name
        self._attrs = attributes
        self._events: list[tuple[str, int]] = []
        self._links: tuple[str, ...] = ()
        self._start = time.time_ns()

    @property
    def wire_context(self) -> tuple[str, None]:
        """(traceparent, tracestate) for the backend: this span, sampled; no tracestate (the
        sidecar's own span carries no vendor state)."""
        return format_traceparent(self.trace_id, self.span_id, SAMPLED), None

    def link(self, traceparents: Iterable[str | None]) -> None:
        """Links to the items' incoming contexts, kept as their distinct strings (no per-item Python:
        `dict.fromkeys` and `filter` run in C); the exporter parses them (`links_of`)."""
        self._links = tuple(dict.fromkeys(filter(None, traceparents)))

    def event(self, name: str) -> None:
        self._events.append((name, time.time_ns()))

    def attribute(self, key: str, value: str | int) -> None:
        self._attrs.append((key, value))

    def end(self, error: str | None = None) -> None:
        """Finish the span (status ERROR with `error` when the batch RPC failed) into the buffer."""
        self._buffer.add(
            SpanRecord(
                self.trace_id,
                self.span_id,
                self._name,
                KIND_CONSUMER,
                self._start,
                time.time_ns(),
                tuple(self._attrs),
                tuple(self._events),
                self._links,
                error,
                self.parent_span_id,
            )
        )


class Tracer:
    """Starts batch spans (or not: the sampler decides, once per batch, before any per-item work)."""

    def __init__(self, sampler: Sampler, buffer: SpanBuffer, *, lane: str = "other") -> None:
        self.sampler = sampler
        self.buffer = buffer
        self._lane = lane
        self._never = sampler.never
        #: (model, operation) -> the span's first four attributes, made once per pair.
        self._prefixes: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}

    @property
    def never(self) -> bool:
        """No batch is ever sampled (the items' contexts need not even be read)."""
        return self._never

    def start_batch(
        self, model: str, operation: str, size: int, cost: int, traceparents: Iterable[str | None] = ()
    ) -> BatchSpan | None:
        """The `sidecar.dispatch` span of a batch about to be sent, or None when it is not sampled.
        `traceparents`: the items' incoming contexts; the first valid one is the parent, the others
        links. `model` may be `model:profile` (the profile attribute is its suffix, else `default`),
        as the metrics read it."""
        if self._never:
            return None
        contexts = tuple(dict.fromkeys(filter(None, traceparents)))
        parent: SpanContext | None = None
        for value in contexts:
            parent = parse_traceparent(value)
            if parent is not None:
                break
        if parent is None:
            trace_id = _random_trace_id()
            if not self.sampler.sampled(trace_id):
                return None
        else:
            trace_id = int(parent.trace_id, 16)
            if not self.sampler.sampled_under(parent):
                return None
        prefix = self._prefixes.get((model, operation))
        if prefix is None:
            base, sep, profile = model.partition(":")
            prefix = self._prefixes[(model, operation)] = (
                ("lane", self._lane),
                ("operation", operation),
                ("model", base if sep else model),
                ("profile", profile if sep and profile else "default"),
            )
            if len(self._prefixes) > _MAX_PREFIXES:  # model ids come from work items: bounded
                self._prefixes.clear()
        attrs: list[tuple[str, str | int]] = [*prefix, ("sie.batch.size", size), ("sie.batch.cost", cost)]
        span = BatchSpan(
            self.buffer, f"{trace_id:032x}", SPAN_NAME, attrs, parent.span_id if parent is not None else ""
        )
        if contexts:
            parent_value = parent.traceparent if parent is not None else None
            span._links = tuple(v for v in contexts if v != parent_value)
        return span


__all__ = [
    "KIND_CONSUMER",
    "MAX_LINKS",
    "SAMPLED",
    "SPAN_NAME",
    "BatchSpan",
    "Sampler",
    "SpanBuffer",
    "SpanContext",
    "SpanRecord",
    "Tracer",
    "format_traceparent",
    "links_of",
    "parse_traceparent",
]
