# SPDX-License-Identifier: Apache-2.0
"""OTLP trace export requests for the batch spans, encoded by the compiled core (sie-core `otlp`).

The twin is the OpenTelemetry SDK's own encoder (`otel.span_exporters` falls back to it): with
`SIE_SIDECAR_NO_EXTENSIONS=1`, or for spans that are not the sidecar's batch spans, the exporters
encode as the SDK does. Both write the same message (tests/unit/test_otlp_span_encoding.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._switch import USING_NATIVE

#: (span records, resource attributes, scope name, scope version) -> the request's bytes.
TraceRequestEncoder = Callable[[Sequence[Any], list[tuple[str, str]], str, str], bytes]


def trace_request_encoder() -> TraceRequestEncoder | None:
    """The compiled encoder, or None where this process runs the twins."""
    if not USING_NATIVE:
        return None
    from .._native import encode_trace_request

    return encode_trace_request


__all__ = ["TraceRequestEncoder", "trace_request_encoder"]
