# SPDX-License-Identifier: Apache-2.0
"""A registry snapshot as an OTLP `ExportMetricsServiceRequest` (opentelemetry-proto).

Counters become cumulative monotonic sums, gauges gauges, histograms cumulative explicit-bucket
histograms (the registry's bucket i holds values in (bounds[i-1], bounds[i]], as OTLP's does). Every
point carries the fixed `lane` attribute first (§13); units come from the §13 table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from ..telemetry import INSTRUMENTS, Point

#: §13: the unit of every instrument (names not listed there are exported without one).
UNITS: Final[Mapping[str, str]] = {name: unit for name, (_, unit, _) in INSTRUMENTS.items()}
SCOPE: Final = "sie_sidecar"
_CUMULATIVE: Final = pb.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def encode_metrics(
    points: Sequence[Point],
    *,
    resource: Mapping[str, str],
    lane: str,
    start_ns: int,
    now_ns: int,
    version: str = "",
) -> bytes:
    """One request carrying every point, grouped into one metric per instrument name."""
    by_name: dict[str, pb.Metric] = {}
    scope_metrics = pb.ScopeMetrics(scope=InstrumentationScope(name=SCOPE, version=version))
    for point in points:
        metric = by_name.get(point.name)
        if metric is None:
            metric = scope_metrics.metrics.add(name=point.name, unit=UNITS.get(point.name, ""))
            if point.kind == "counter":
                metric.sum.aggregation_temporality = _CUMULATIVE
                metric.sum.is_monotonic = True
            elif point.kind == "gauge":
                metric.gauge.SetInParent()
            else:
                metric.histogram.aggregation_temporality = _CUMULATIVE
            by_name[point.name] = metric
        attributes = [_kv("lane", lane), *(_kv(k, v) for k, v in point.attrs)]
        if point.kind == "counter":
            metric.sum.data_points.add(
                attributes=attributes, start_time_unix_nano=start_ns, time_unix_nano=now_ns, as_double=point.value
            )
        elif point.kind == "gauge":
            metric.gauge.data_points.add(attributes=attributes, time_unix_nano=now_ns, as_double=point.value)
        else:
            metric.histogram.data_points.add(
                attributes=attributes,
                start_time_unix_nano=start_ns,
                time_unix_nano=now_ns,
                count=point.count,
                sum=point.value,
                bucket_counts=list(point.buckets),
                explicit_bounds=list(point.bounds),
            )
    request = ExportMetricsServiceRequest(
        resource_metrics=[
            pb.ResourceMetrics(
                resource=Resource(attributes=[_kv(k, v) for k, v in resource.items()]),
                scope_metrics=[scope_metrics],
            )
        ]
    )
    return bytes(request.SerializeToString())


__all__ = ["SCOPE", "UNITS", "encode_metrics"]
