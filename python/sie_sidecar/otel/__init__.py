# SPDX-License-Identifier: Apache-2.0
"""OTLP export of the in-process telemetry registry (sidecar-behaviour §13): the registry's instruments
encoded as OTLP/HTTP protobuf and pushed every export interval. Recording stays in `telemetry` (per
batch); this room only reads snapshots."""

from __future__ import annotations

# The submodules are imported where they are used: `metrics` loads protobuf, which the sidecar only
# pays for at its first push (`export.MetricsExporter.body`).
__all__: list[str] = []
