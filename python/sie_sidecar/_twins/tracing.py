# SPDX-License-Identifier: Apache-2.0
"""Twin of `_native.BatchTracer` / `_native.BatchSpan` (`otel.tracer`): the batch span in Python.
Each span ends into a `SpanRecord` (the compiled span is its own record); the sampler, the ids'
format, the attributes and the links are the same (tests/unit/test_traces.py runs both)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from typing import Any, Final

from ..wire.trace_context import (
    KIND_CONSUMER,
    SAMPLED,
    SPAN_NAME,
    SpanContext,
    SpanRecord,
    format_traceparent,
    parse_traceparent,
)

IMPLEMENTATION = "py"
#: (model, operation) attribute prefixes a tracer keeps before starting over.
_MAX_PREFIXES: Final = 1024


def _contexts(values: Iterable[Any]) -> tuple[str, ...]:
    """The distinct non-empty `traceparent` strings, in order: each value a context itself, or an
    item carrying one (`.traceparent`); None and non-strings are skipped."""
    found = (v if isinstance(v, str) else getattr(v, "traceparent", None) for v in values if v is not None)
    return tuple(dict.fromkeys(v for v in found if isinstance(v, str) and v))


def _random_trace_id() -> int:
    return random.getrandbits(128) or 1


def _random_span_id() -> str:
    return f"{random.getrandbits(64) or 1:016x}"


class BatchSpan:
    """The span of one batch while it runs: its context goes to the backend in every RunBatchItem
    (`wire_context`), its links are the items' own contexts."""

    __slots__ = (
        "_attrs",
        "_buffer",
        "_ended",
        "_events",
        "_links",
        "_name",
        "_start",
        "parent_span_id",
        "span_id",
        "trace_id",
    )

    def __init__(
        self,
        buffer: Any,
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
        self._ended = False

    @property
    def wire_context(self) -> tuple[str, None]:
        """(traceparent, tracestate) for the backend: this span, sampled; no tracestate (the
        sidecar's own span carries no vendor state)."""
        return format_traceparent(self.trace_id, self.span_id, SAMPLED), None

    def link(self, traceparents: Iterable[Any]) -> None:
        """Links to these contexts instead (the items', or the contexts themselves), kept as their
        distinct strings; the exporter parses them (`links_of`)."""
        self._links = _contexts(traceparents)

    def event(self, name: str) -> None:
        """A named moment of the batch (`ipc.request`, `published`...), stamped now."""
        if not self._ended:
            self._events.append((name, time.time_ns()))

    def attribute(self, key: str, value: str | int) -> None:
        """Set an attribute (a repeated key keeps its place and takes the new value)."""
        if self._ended:
            return
        for i, (k, _) in enumerate(self._attrs):
            if k == key:
                self._attrs[i] = (key, value)
                return
        self._attrs.append((key, value))

    def end(self, error: str | None = None) -> None:
        """Finish the span (status ERROR with `error` when the batch RPC failed) into the buffer.
        Once: a second call, and events or attributes after the first, change nothing."""
        if self._ended:
            return
        self._ended = True
        buffer = self._buffer  # straight to where the buffer forwards, as the compiled span does
        sink = getattr(buffer, "forward", None) or buffer.add
        sink(
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


class BatchTracer:
    """Starts batch spans (or not: the sampler decides, once per batch, before any per-item work).
    `sampler`: an `otel.tracing.Sampler`; `buffer`: an `otel.tracing.SpanBuffer` (read by duck type:
    the twins import nothing above the wire values)."""

    def __init__(self, sampler: Any, buffer: Any, *, lane: str = "other") -> None:
        self.sampler = sampler
        self.buffer = buffer
        self._lane = lane
        self._never = bool(sampler.never)
        #: (model, operation) -> the span's first four attributes, made once per pair.
        self._prefixes: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}

    @property
    def never(self) -> bool:
        """No batch is ever sampled (the items' contexts need not even be read)."""
        return self._never

    def start_batch(
        self, model: str, operation: str, size: int, cost: int, traceparents: Iterable[Any] | None = None
    ) -> BatchSpan | None:
        """The `sidecar.dispatch` span of a batch about to be sent, or None when it is not sampled.
        `traceparents`: the items' incoming contexts; the first valid one is the parent, the others
        links. `model` may be `model:profile` (the profile attribute is its suffix, else `default`),
        as the metrics read it."""
        if self._never:
            return None
        contexts = _contexts(traceparents or ())
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


__all__ = ["IMPLEMENTATION", "BatchSpan", "BatchTracer"]
