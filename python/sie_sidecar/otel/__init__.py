# SPDX-License-Identifier: Apache-2.0
"""OTLP export of the in-process telemetry registry (sidecar-behaviour §13): the registry's instruments
encoded as OTLP/HTTP protobuf and pushed every export interval. Recording stays in `telemetry` (per
batch); this room only reads snapshots."""

from __future__ import annotations

from .export import MetricsExporter
from .metrics import UNITS, encode_metrics

__all__ = ["UNITS", "MetricsExporter", "encode_metrics"]
