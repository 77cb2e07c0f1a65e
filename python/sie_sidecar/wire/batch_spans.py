# SPDX-License-Identifier: Apache-2.0
"""The batch tracer, compiled (`_native.BatchTracer`, whose spans are their own finished records:
no Python object per span beyond the span) unless this process runs the twins (`_twins.tracing`):
one switch for it, as for the wire core. `otel.tracer` is where the runtime takes it from."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._switch import load

if TYPE_CHECKING:
    from .._native import BatchSpan, BatchTracer
else:
    _implementation = load("tracing")
    BatchTracer = _implementation.BatchTracer
    BatchSpan = _implementation.BatchSpan

__all__ = ["BatchSpan", "BatchTracer"]
