# SPDX-License-Identifier: Apache-2.0
"""OTLP export (sidecar-behaviour §13): the in-process telemetry registry's snapshots encoded with
opentelemetry-proto and pushed every export interval over gRPC or HTTP/protobuf, and the batch spans
of tracing. Recording stays in `telemetry` (per batch); this room only reads snapshots."""

from __future__ import annotations

# The submodules are imported where they are used: `metrics` loads protobuf, which the sidecar only
# pays for at its first push (`export.MetricsExporter.body`).
__all__: list[str] = []
