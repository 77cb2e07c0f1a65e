# SPDX-License-Identifier: Apache-2.0
"""The hand-written OTLP encoders (`otel/protowire`, `otel/metrics`, `otel/traces`) write the very
bytes protobuf's own serializer writes for opentelemetry-proto's messages (`tests/otlp_oracle.py`,
the sidecar's encoders before), for any registry snapshot and any finished spans; and protobuf
parses them back."""

from __future__ import annotations

from typing import get_args

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from sie_sidecar.otel import protowire
from sie_sidecar.otel.metrics import encode_metrics
from sie_sidecar.otel.traces import encode_spans
from sie_sidecar.otel.tracing import KIND_CONSUMER, SpanRecord
from sie_sidecar.telemetry import INSTRUMENTS, Point
from sie_sidecar.telemetry.names import Kind

from ..otlp_oracle import oracle_metrics, oracle_spans

text = st.text(max_size=12)
names = st.one_of(st.sampled_from(sorted(INSTRUMENTS)), st.text(min_size=1, max_size=20))
attrs = st.lists(st.tuples(text, text), max_size=3).map(tuple)
numbers = st.one_of(st.floats(allow_nan=False), st.sampled_from([0.0, -0.0, 1.0]), st.integers(-(10**6), 10**6))
u64 = st.integers(0, 2**64 - 1)
resources = st.dictionaries(text, text, max_size=3)


@st.composite
def points(draw: st.DrawFn) -> list[Point]:
    """A snapshot: each name has one kind, as the registry enforces."""
    kinds: dict[str, Kind] = draw(st.dictionaries(names, st.sampled_from(list(get_args(Kind))), max_size=6))
    out = []
    for name, kind in kinds.items():
        for point_attrs in draw(st.lists(attrs, min_size=1, max_size=3)):
            if kind == "histogram":
                bounds = tuple(sorted(draw(st.sets(st.floats(allow_nan=False, allow_infinity=False), max_size=5))))
                buckets = tuple(draw(st.lists(u64, min_size=len(bounds) + 1, max_size=len(bounds) + 1)))
                out.append(Point(name, kind, point_attrs, draw(numbers), draw(u64), buckets, bounds))
            else:
                out.append(Point(name, kind, point_attrs, draw(numbers)))
    return draw(st.permutations(out))


@given(snapshot=points(), resource=resources, lane=text, start=u64, now=u64, version=text)
def test_metrics_bytes_equal_protobufs(
    *, snapshot: list[Point], resource: dict[str, str], lane: str, start: int, now: int, version: str
) -> None:
    ours = encode_metrics(snapshot, resource=resource, lane=lane, start_ns=start, now_ns=now, version=version)
    assert ours == oracle_metrics(snapshot, resource=resource, lane=lane, start_ns=start, now_ns=now, version=version)


hex_ids = st.one_of(st.binary(min_size=16, max_size=16).map(bytes.hex), st.just(""))
traceparents = st.one_of(
    st.tuples(st.binary(min_size=16, max_size=16), st.binary(min_size=8, max_size=8), st.integers(0, 255)).map(
        lambda t: f"00-{t[0].hex()}-{t[1].hex()}-{t[2]:02x}"
    ),
    text,
)
spans = st.builds(
    SpanRecord,
    trace_id=hex_ids,
    span_id=st.one_of(st.binary(min_size=8, max_size=8).map(bytes.hex), st.just("")),
    name=text,
    kind=st.sampled_from([KIND_CONSUMER, "internal", "other"]),
    start_ns=u64,
    end_ns=u64,
    attributes=st.lists(st.tuples(text, st.one_of(text, st.integers(-(2**63), 2**63 - 1))), max_size=4).map(tuple),
    events=st.lists(st.tuples(text, u64), max_size=3).map(tuple),
    links=st.lists(traceparents, max_size=5).map(tuple),
    error=st.one_of(st.none(), text),
)


@given(records=st.lists(spans, max_size=4), resource=resources, version=text)
def test_span_bytes_equal_protobufs(records: list[SpanRecord], resource: dict[str, str], version: str) -> None:
    ours = encode_spans(records, resource=resource, version=version)
    assert ours == oracle_spans(records, resource=resource, version=version)
    parsed = ExportTraceServiceRequest()
    parsed.ParseFromString(ours)
    assert len(parsed.resource_spans[0].scope_spans[0].spans) == len(records)


@given(value=st.integers(-(2**63), 2**64 - 1))
def test_varints_round_trip(value: int) -> None:
    raw = protowire.varint(value)
    decoded, shift = 0, 0
    for i, byte in enumerate(raw):
        decoded |= (byte & 0x7F) << shift
        shift += 7
        assert (byte & 0x80 == 0) is (i == len(raw) - 1)
    assert decoded == value % 2**64
    assert len(raw) <= 10
