# SPDX-License-Identifier: Apache-2.0
"""The bridge from the sidecar's registry to the OpenTelemetry SDK: a registry snapshot becomes the
SDK's `MetricsData`, which the SDK's OTLP metric exporter encodes and sends. The registry stays what
the stages record into (a number per instrument, no SDK on the hot path); the SDK is used from its
exporter interface on, at export time, in the OTLP thread (`otel.export`).

Counters become monotonic sums, gauges gauges, histograms explicit-bucket histograms (the registry's
bucket i holds the values in (bounds[i-1], bounds[i]], as OTLP's does). Every point carries `lane`
first, then its §13 attributes in the §13 order; units come from the §13 table.

Temporality (`OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`): `cumulative` (the default) sends
the totals since start-up; `delta` sends what each counter and histogram gained since the previous
export (which is the points' start time); `lowmemory` is delta for the recorded counters and
histograms and cumulative for the observed counters (`Counter.catch_up`), the specification's rule
for synchronous and asynchronous counters (a metric with any observed series stays cumulative
whole: one metric has one temporality). Gauges are gauges in every mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, cast

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from ..telemetry import INSTRUMENTS, Attrs, Point
from ..wire.otlp import metrics_request_encoder

#: §13: the unit of every instrument (names not listed there are exported without one).
UNITS: Final[Mapping[str, str]] = {name: unit for name, (_, unit, _) in INSTRUMENTS.items()}
#: The instrumentation scope of every point and span.
SCOPE: Final = "sie_sidecar"
_CUMULATIVE: Final = AggregationTemporality.CUMULATIVE
_DELTA: Final = AggregationTemporality.DELTA
#: One metric as `MetricsBridge.shapes` gives it: (name, kind, delta, points).
Shape = tuple[str, str, bool, list[tuple[Any, ...]]]


class MetricsBridge:
    """Registry snapshots to `MetricsData` with one resource, scope and temporality; in delta
    modes it keeps the previous export's points to subtract (only the OTLP thread calls it)."""

    def __init__(
        self, resource: Resource, *, lane: str, version: str = "", temporality: str = "cumulative", start_ns: int = 0
    ) -> None:
        if temporality not in ("cumulative", "delta", "lowmemory"):
            raise ValueError(f"unknown temporality {temporality!r}")
        self._resource = resource
        self._scope = InstrumentationScope(SCOPE, version)
        self._lane = lane
        self._temporality = temporality
        self._start_ns = start_ns
        self._previous: dict[tuple[str, Attrs], Point] = {}
        self._previous_ns = start_ns
        #: The resource's attributes as the compiled encoder takes them; None: one is not a str.
        attributes = list(resource.attributes.items())
        self._str_resource = attributes if all(isinstance(v, str) for _, v in attributes) else None

    def data(self, points: Sequence[Point], now_ns: int) -> MetricsData:
        """One `MetricsData` carrying every point, one metric per instrument name (in the order
        names first appear)."""
        return self.data_of(self.shapes(points, now_ns))

    def data_of(self, shapes: Sequence[Shape]) -> MetricsData:
        """`shapes` as the SDK's `MetricsData`. A histogram's min or max of None (no value recorded,
        or a delta, whose extremes the registry does not keep) leaves the field unset: the SDK's
        encoder passes it to protobuf as is."""
        metrics = []
        for name, kind, delta, raw in shapes:
            data_points: list[NumberDataPoint | HistogramDataPoint]
            if kind == "histogram":
                data_points = [HistogramDataPoint(*p) for p in raw]
            else:
                data_points = [NumberDataPoint(*p) for p in raw]
            metrics.append(self._metric(name, kind, delta, data_points))
        scope_metrics = ScopeMetrics(self._scope, metrics, "")
        return MetricsData([ResourceMetrics(self._resource, [scope_metrics], "")])

    def shapes(self, points: Sequence[Point], now_ns: int) -> list[Shape]:
        """Every point as the export carries it, one `(name, kind, delta, points)` per instrument
        name (in the order names first appear); a number point `(attributes, start_ns, time_ns,
        value)`, a histogram point `(attributes, start_ns, time_ns, count, sum, bucket_counts,
        bounds, min, max)`. In delta modes this is the export: the previous points are replaced."""
        by_name: dict[str, list[tuple[Any, ...]]] = {}
        shapes: dict[str, tuple[str, bool]] = {}
        previous = self._previous
        mode = self._temporality
        # One temporality per metric: under lowmemory a name with any observed series stays cumulative.
        observed = {p.name for p in points if p.observed} if mode == "lowmemory" else set()
        for point in points:
            delta = mode != "cumulative" and point.kind != "gauge" and point.name not in observed
            shapes.setdefault(point.name, (point.kind, delta))
            attributes = {"lane": self._lane, **dict(point.attrs)}
            start = self._previous_ns if delta else self._start_ns
            before = previous.get((point.name, point.attrs)) if delta else None
            data_point: tuple[Any, ...]
            if point.kind == "histogram":
                count, total, buckets = point.count, point.value, point.buckets
                low, high = point.min, point.max
                if delta:
                    low = high = None
                    if before is not None:
                        count, total = count - before.count, total - before.value
                        buckets = tuple(b - a for a, b in zip(before.buckets, buckets, strict=True))
                data_point = (attributes, start, now_ns, count, float(total), buckets, point.bounds, low, high)
            else:
                value = point.value - before.value if before is not None else point.value
                data_point = (attributes, 0 if point.kind == "gauge" else start, now_ns, float(value))
            by_name.setdefault(point.name, []).append(data_point)
        if mode != "cumulative":
            self._previous = {(p.name, p.attrs): p for p in points}
            self._previous_ns = now_ns
        return [(name, *shapes[name], data_points) for name, data_points in by_name.items()]

    def request_of(self, shapes: Sequence[Shape]) -> bytes | None:
        """The export request's bytes, compiled-encoded: the message the SDK's encoder makes of
        `data_of(shapes)`. None where it cannot be (the twins, an attribute that is not a str):
        then `data_of` is the way."""
        encode = metrics_request_encoder()
        resource = self._str_resource
        if encode is None or resource is None:
            return None
        metrics = [
            (name, UNITS.get(name, ""), kind, int(_DELTA if delta else _CUMULATIVE), raw)
            for name, kind, delta, raw in shapes
        ]
        try:
            return encode(resource, self._scope.name, self._scope.version or "", metrics)  # type: ignore[arg-type]
        except (
            TypeError,
            ValueError,
            OverflowError,
        ):  # e.g. a count that went down: the SDK's encoder refuses and logs
            return None

    @staticmethod
    def _metric(name: str, kind: str, delta: bool, data_points: list[NumberDataPoint | HistogramDataPoint]) -> Metric:
        temporality = _DELTA if delta else _CUMULATIVE
        numbers = cast(list[NumberDataPoint], data_points)
        data: Sum | Gauge | Histogram
        if kind == "counter":
            data = Sum(numbers, temporality, is_monotonic=True)
        elif kind == "gauge":
            data = Gauge(numbers)
        else:
            data = Histogram(cast(list[HistogramDataPoint], data_points), temporality)
        return Metric(name, "", UNITS.get(name, ""), data)


class TakesRequests:
    """A metric exporter that sends an already encoded request (`otel.sdk`'s OTLP/HTTP one):
    `export_request` returns None where it cannot, and the SDK's encoder is used instead."""

    def export_request(self, body: bytes) -> MetricExportResult | None:
        raise NotImplementedError


class MetricsSender:
    """One bridge and the SDK exporter it feeds: `send` is one export (called in the OTLP thread)."""

    def __init__(self, bridge: MetricsBridge, exporter: MetricExporter) -> None:
        self.bridge = bridge
        self.exporter = exporter

    def send(self, points: Sequence[Point], now_ns: int) -> bool:
        """Export one snapshot; False when the receiver did not take it (the SDK has logged why).
        An exporter that takes encoded requests (`TakesRequests`) gets the compiled encoding."""
        shapes = self.bridge.shapes(points, now_ns)
        if isinstance(self.exporter, TakesRequests):
            body = self.bridge.request_of(shapes)
            if body is not None:
                result = self.exporter.export_request(body)
                if result is not None:
                    return result is MetricExportResult.SUCCESS
        return self.exporter.export(self.bridge.data_of(shapes)) is MetricExportResult.SUCCESS

    def shutdown(self) -> None:
        self.exporter.shutdown()


__all__ = ["SCOPE", "UNITS", "MetricsBridge", "MetricsSender", "Shape", "TakesRequests"]
