# SPDX-License-Identifier: Apache-2.0
"""OTLP export requests encoded by the compiled core: the batch spans' (sie-core `otlp`) and the
registry's metrics (sie-core `otlp_metrics`).

The twin is the OpenTelemetry SDK's own encoder (`otel.span_exporters` and `otel.metrics` fall
back to it): with `SIE_SIDECAR_NO_EXTENSIONS=1`, for spans that are not the sidecar's batch spans,
or for the gRPC metric exporter, the exporters encode as the SDK does. Both write the same message
(tests/unit/test_otlp_span_encoding.py, tests/unit/test_otlp_metrics_encoding.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._switch import USING_NATIVE

#: (span records, resource attributes, scope name, scope version) -> the request's bytes.
TraceRequestEncoder = Callable[[Sequence[Any], list[tuple[str, str]], str, str], bytes]


#: (resource attributes, scope name, scope version, `MetricsBridge.shapes`) -> the request's bytes.
MetricsRequestEncoder = Callable[[list[tuple[str, str]], str, str, Sequence[Any]], bytes]


def trace_request_encoder() -> TraceRequestEncoder | None:
    """The compiled encoder, or None where this process runs the twins."""
    if not USING_NATIVE:
        return None
    from .._native import encode_trace_request

    return encode_trace_request


def metrics_request_encoder() -> MetricsRequestEncoder | None:
    """The compiled encoder, or None where this process runs the twins."""
    if not USING_NATIVE:
        return None
    from .._native import encode_metrics_request

    return encode_metrics_request


__all__ = ["MetricsRequestEncoder", "TraceRequestEncoder", "metrics_request_encoder", "trace_request_encoder"]
