# SPDX-License-Identifier: Apache-2.0
"""OTLP export (sidecar-behaviour §13) by the OpenTelemetry SDK: the in-process telemetry registry's
snapshots converted to the SDK's metric data (`metrics`) and the batch spans (`tracing`, presented
to the SDK by `traces`) handed to the SDK's OTLP exporters, which run in their own thread
(`export`) with the settings of the standard `OTEL_*` environment (`target`, `sdk`). Recording stays
in `telemetry` (per batch); this room only reads snapshots and finished spans."""

from __future__ import annotations

# The submodules are imported where they are used (runtime.telemetry_side.start_metrics, start_tracing): a sidecar
# with both signals off imports none of them, and the SDK is imported only in the OTLP thread.
__all__: list[str] = []
