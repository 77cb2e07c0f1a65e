# SPDX-License-Identifier: Apache-2.0
"""A registry snapshot as an OTLP `ExportMetricsServiceRequest`, written with `protowire` (the
bytes protobuf would write for opentelemetry-proto's messages, without importing it).

Counters become cumulative monotonic sums, gauges gauges, histograms cumulative explicit-bucket
histograms (the registry's bucket i holds values in (bounds[i-1], bounds[i]], as OTLP's does). Every
point carries the fixed `lane` attribute first (§13); units come from the §13 table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from ..telemetry import INSTRUMENTS, Point
from .common import SCOPE, key_value, resource_message, scope_message
from .protowire import double, fixed64, message, packed_double, packed_fixed64, string, uint

#: §13: the unit of every instrument (names not listed there are exported without one).
UNITS: Final[Mapping[str, str]] = {name: unit for name, (_, unit, _) in INSTRUMENTS.items()}
_CUMULATIVE: Final = 2  # AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE

# Field numbers (opentelemetry-proto metrics.proto, metrics_service.proto).
_REQUEST_RESOURCE_METRICS = 1
_RM_RESOURCE, _RM_SCOPE_METRICS = 1, 2
_SM_SCOPE, _SM_METRICS = 1, 2
_METRIC_NAME, _METRIC_UNIT, _METRIC_GAUGE, _METRIC_SUM, _METRIC_HISTOGRAM = 1, 3, 5, 7, 9
_DATA_POINTS, _TEMPORALITY, _MONOTONIC = 1, 2, 3
_NDP_START, _NDP_TIME, _NDP_DOUBLE, _NDP_ATTRIBUTES = 2, 3, 4, 7
_HDP_START, _HDP_TIME, _HDP_COUNT, _HDP_SUM, _HDP_BUCKETS, _HDP_BOUNDS, _HDP_ATTRIBUTES = 2, 3, 4, 5, 6, 7, 9


def _data_point(point: Point, attributes: bytes, start_ns: int, now_ns: int) -> bytes:
    if point.kind == "counter":
        body = fixed64(_NDP_START, start_ns) + fixed64(_NDP_TIME, now_ns) + double(_NDP_DOUBLE, point.value)
        return message(_DATA_POINTS, body + attributes)
    if point.kind == "gauge":
        return message(_DATA_POINTS, fixed64(_NDP_TIME, now_ns) + double(_NDP_DOUBLE, point.value) + attributes)
    body = fixed64(_HDP_START, start_ns) + fixed64(_HDP_TIME, now_ns) + fixed64(_HDP_COUNT, point.count)
    body += double(_HDP_SUM, point.value) + packed_fixed64(_HDP_BUCKETS, point.buckets)
    return message(_DATA_POINTS, body + packed_double(_HDP_BOUNDS, point.bounds) + attributes)


def encode_metrics(
    points: Sequence[Point],
    *,
    resource: Mapping[str, str],
    lane: str,
    start_ns: int,
    now_ns: int,
    version: str = "",
) -> bytes:
    """One request carrying every point, grouped into one metric per instrument name (in the
    order names first appear), each point's attributes led by the fixed `lane`."""
    by_name: dict[str, list[bytes]] = {}
    kinds: dict[str, str] = {}
    for point in points:
        kinds.setdefault(point.name, point.kind)
        field = _HDP_ATTRIBUTES if point.kind == "histogram" else _NDP_ATTRIBUTES
        attributes = key_value(field, "lane", lane) + b"".join(key_value(field, k, v) for k, v in point.attrs)
        by_name.setdefault(point.name, []).append(_data_point(point, attributes, start_ns, now_ns))
    metrics = []
    for name, data_points in by_name.items():
        head = string(_METRIC_NAME, name) + string(_METRIC_UNIT, UNITS.get(name, ""))
        body = b"".join(data_points)
        if kinds[name] == "counter":
            data = message(_METRIC_SUM, body + uint(_TEMPORALITY, _CUMULATIVE) + uint(_MONOTONIC, 1))
        elif kinds[name] == "gauge":
            data = message(_METRIC_GAUGE, body)
        else:
            data = message(_METRIC_HISTOGRAM, body + uint(_TEMPORALITY, _CUMULATIVE))
        metrics.append(message(_SM_METRICS, head + data))
    scope_metrics = message(_RM_SCOPE_METRICS, scope_message(_SM_SCOPE, version) + b"".join(metrics))
    return message(_REQUEST_RESOURCE_METRICS, resource_message(_RM_RESOURCE, resource) + scope_metrics)


__all__ = ["SCOPE", "UNITS", "encode_metrics"]
