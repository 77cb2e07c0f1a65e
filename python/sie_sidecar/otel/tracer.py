# SPDX-License-Identifier: Apache-2.0
"""The batch tracer this process runs (`wire.batch_spans`): the compiled core's, or its twin
(`SIE_SIDECAR_NO_EXTENSIONS=1`). Both take the sampler and buffer of `otel.tracing` and the same
calls: `start_batch(model, operation, size, cost, items)` (the items' contexts read in place), then
the span's `wire_context`, `event`, `attribute` and `end`."""

from __future__ import annotations

from ..wire.batch_spans import BatchSpan
from ..wire.batch_spans import BatchTracer as Tracer

__all__ = ["BatchSpan", "Tracer"]
