# SPDX-License-Identifier: Apache-2.0
"""The OTLP requests built with opentelemetry-proto's generated classes: the oracle the sidecar's
hand-written encoders (`sie_sidecar.otel.protowire`) are checked against byte for byte. These were
the sidecar's encoders until the import cost moved them here (docs/benchmarks.md, issue 14)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1 import trace_pb2 as tpb

from sie_sidecar.otel.tracing import KIND_CONSUMER, SpanRecord, links_of
from sie_sidecar.telemetry import INSTRUMENTS, Point

#: §13: the unit of every instrument (names not listed there are exported without one).
UNITS: Final[Mapping[str, str]] = {name: unit for name, (_, unit, _) in INSTRUMENTS.items()}
SCOPE: Final = "sie_sidecar"
_CUMULATIVE: Final = pb.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def oracle_metrics(
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


_KINDS: Final = {KIND_CONSUMER: tpb.Span.SpanKind.SPAN_KIND_CONSUMER}
_HAS_IS_REMOTE: Final = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE: Final = 0x200  # SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK


def _kv_trace(key: str, value: str | int) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _span(record: SpanRecord) -> tpb.Span:
    links, dropped = links_of(record.links)
    span = tpb.Span(
        trace_id=bytes.fromhex(record.trace_id),
        span_id=bytes.fromhex(record.span_id),
        flags=0x01 | _HAS_IS_REMOTE,  # sampled; a root, so its (absent) parent is not remote
        name=record.name,
        kind=_KINDS.get(record.kind, tpb.Span.SpanKind.SPAN_KIND_INTERNAL),
        start_time_unix_nano=record.start_ns,
        end_time_unix_nano=record.end_ns,
        attributes=[_kv_trace(k, v) for k, v in record.attributes],
        dropped_links_count=dropped,
    )
    for name, at in record.events:
        span.events.add(name=name, time_unix_nano=at)
    for link in links:
        span.links.add(
            trace_id=bytes.fromhex(link.trace_id),
            span_id=bytes.fromhex(link.span_id),
            flags=(link.flags & 0xFF) | _HAS_IS_REMOTE | _IS_REMOTE,
        )
    if record.error is not None:
        span.status.code = tpb.Status.StatusCode.STATUS_CODE_ERROR
        span.status.message = record.error
    return span


def oracle_spans(spans: Sequence[SpanRecord], *, resource: Mapping[str, str], version: str = "") -> bytes:
    """One request carrying every span under one resource and the sidecar's scope."""
    request = ExportTraceServiceRequest(
        resource_spans=[
            tpb.ResourceSpans(
                resource=Resource(attributes=[_kv_trace(k, v) for k, v in resource.items()]),
                scope_spans=[
                    tpb.ScopeSpans(
                        scope=InstrumentationScope(name=SCOPE, version=version),
                        spans=[_span(s) for s in spans],
                    )
                ],
            )
        ]
    )
    return bytes(request.SerializeToString())
