# SPDX-License-Identifier: Apache-2.0
"""OTLP export (sidecar-behaviour §13): the in-process telemetry registry's snapshots encoded as
OTLP protobuf (`protowire`, no protobuf runtime) and pushed every export interval over gRPC or
HTTP/protobuf, and the batch spans of tracing. Recording stays in `telemetry` (per batch); this
room only reads snapshots."""

from __future__ import annotations

# The submodules are imported where they are used (app.start_metrics, app.start_tracing): a
# sidecar with both signals off imports none of them.
__all__: list[str] = []
