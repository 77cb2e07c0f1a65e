# SPDX-License-Identifier: Apache-2.0
"""The compiled OTLP span encoder (`wire.otlp`, sie-core `otlp`) writes what the SDK's encoder
writes for the same batch spans, byte for byte, and refuses malformed records with a typed error;
the exporters fall back to the SDK's encoder for anything else."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from sie_sidecar import wire
from sie_sidecar.otel.sdk import make_resource
from sie_sidecar.otel.span_exporters import http_span_exporter, native_request
from sie_sidecar.otel.traces import BatchSpanData
from sie_sidecar.otel.tracing import MAX_LINKS, SpanRecord, format_traceparent
from sie_sidecar.wire.otlp import trace_request_encoder

pytestmark = pytest.mark.skipif(not wire.USING_NATIVE, reason="the compiled encoder")

HEX = "0123456789abcdef"
SCOPE = InstrumentationScope("sie_sidecar", "1.2.3")
RESOURCE = make_resource({"service.name": "sidecar", "service.instance.id": "w-1"})


def _spans(records: Sequence[SpanRecord]) -> list[BatchSpanData]:
    return [BatchSpanData(r, RESOURCE, SCOPE) for r in records]


def _sdk_bytes(records: Sequence[SpanRecord]) -> bytes:
    return bytes(sdk_encode_spans(_spans(records)).SerializeToString())


def _native_bytes(records: Sequence[SpanRecord]) -> bytes:
    body = native_request(_spans(records))
    assert body is not None
    return body


def _hex_id(n: int) -> st.SearchStrategy[str]:
    return st.text(HEX, min_size=n, max_size=n).filter(lambda s: s.strip("0") != "")


_traceparents = st.one_of(
    st.builds(format_traceparent, _hex_id(32), _hex_id(16), st.integers(0, 255)),
    st.text(max_size=60),
    st.just(f"00-{'0' * 32}-{'1' * 16}-01"),
)
_values = st.one_of(st.text(max_size=20), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False))
_records = st.builds(
    SpanRecord,
    trace_id=_hex_id(32),
    span_id=_hex_id(16),
    name=st.text(max_size=30),
    kind=st.sampled_from(["consumer", "internal"]),
    start_ns=st.integers(0, 2**64 - 1),
    end_ns=st.integers(0, 2**64 - 1),
    attributes=st.lists(st.tuples(st.text(max_size=12), _values), max_size=8).map(tuple),
    events=st.lists(st.tuples(st.text(max_size=12), st.integers(0, 2**64 - 1)), max_size=3).map(tuple),
    links=st.lists(_traceparents, max_size=MAX_LINKS + 4, unique=True).map(tuple),
    error=st.none() | st.text(max_size=30),
    parent_span_id=st.just("") | _hex_id(16),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_records, min_size=1, max_size=6))
def test_the_compiled_encoder_writes_the_sdks_bytes(records: list[SpanRecord]) -> None:
    assert _native_bytes(records) == _sdk_bytes(records)


def test_links_past_the_cap_are_counted_and_repeats_are_not_links() -> None:
    many = tuple(format_traceparent(f"{i + 1:032x}", f"{i + 1:016x}") for i in range(MAX_LINKS + 3))
    record = SpanRecord(f"{1:032x}", f"{2:016x}", "sidecar.dispatch", "consumer", 1, 2, (), (), ("junk", *many), None)
    body = _native_bytes([record])
    assert body == _sdk_bytes([record])
    (span,) = ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans
    assert (len(span.links), span.dropped_links_count) == (MAX_LINKS, 3)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"trace_id": "ABC"}, ValueError),
        ({"trace_id": "g" * 32}, ValueError),
        ({"span_id": "1" * 15}, ValueError),
        ({"parent_span_id": "x" * 16}, ValueError),
        ({"attributes": (("k", b"bytes"),)}, TypeError),
        ({"attributes": (("k", None),)}, TypeError),
        ({"events": (("e", -1),)}, OverflowError),
        ({"links": ("a", 3)}, TypeError),
    ],
)
def test_malformed_records_get_a_typed_error(change: dict[str, Any], error: type[Exception]) -> None:
    fields: dict[str, Any] = {
        "trace_id": f"{1:032x}",
        "span_id": f"{1:016x}",
        "name": "n",
        "kind": "consumer",
        "start_ns": 1,
        "end_ns": 2,
        "attributes": (),
        "events": (),
        "links": (),
        "error": None,
    }
    encode = trace_request_encoder()
    assert encode is not None
    with pytest.raises(error):
        encode([SpanRecord(**(fields | change))], [("service.name", "s")], "s", "1")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=40), st.text(max_size=40)), max_size=3))
def test_arbitrary_ids_never_crash_the_encoder(ids: list[tuple[str, str]]) -> None:
    encode = trace_request_encoder()
    assert encode is not None
    records = [SpanRecord(t, s, "n", "consumer", 0, 0, (), (), (t, s), None, s) for t, s in ids]
    try:
        encode(records, [], "s", "")
    except ValueError as exc:
        assert "lower-case hex" in str(exc)


def test_spans_that_are_not_batch_spans_of_one_resource_go_to_the_sdks_encoder() -> None:
    record = SpanRecord(f"{1:032x}", f"{1:016x}", "n", "consumer", 1, 2, (), (), (), None)
    assert native_request([]) is None
    other = BatchSpanData(record, make_resource({"service.name": "other"}), SCOPE)
    assert native_request([*_spans([record]), other]) is None
    plain = ReadableSpan("plain")
    assert native_request([plain]) is None
    assert native_request(_spans([record, record])) is not None


def test_the_http_exporter_sends_the_compiled_bytes_through_its_own_client() -> None:
    """The exporter hands the compiled request to the SDK's HTTP client (which owns headers,
    compression, TLS and retries); without that client it encodes as the SDK does."""
    record = SpanRecord(f"{1:032x}", f"{1:016x}", "n", "consumer", 1, 2, (("a", 1),), (), (), None)
    exporter = http_span_exporter(endpoint="http://127.0.0.1:1/v1/traces", timeout=0.2)
    sent: list[bytes] = []

    class Client:
        def export(self, body: bytes) -> Any:
            sent.append(body)
            return type("Result", (), {"success": True})()

        def shutdown(self) -> None:
            sent.append(b"shutdown")

    exporter._client = Client()  # type: ignore[attr-defined]
    assert exporter.export(_spans([record])) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert sent == [_sdk_bytes([record]), b"shutdown"]


@settings(max_examples=100, deadline=None)
@given(
    model=st.text(max_size=12),
    contexts=st.lists(_traceparents, max_size=6),
    events=st.lists(st.text(max_size=8), max_size=3),
    extra=st.lists(st.tuples(st.sampled_from(["sie.ipc.method", "lane", "k"]), st.text(max_size=6)), max_size=3),
    error=st.none() | st.text(max_size=10),
)
def test_the_compiled_tracers_spans_encode_as_the_sdk_reads_them(
    model: str, contexts: list[str], events: list[str], extra: list[tuple[str, str]], error: str | None
) -> None:
    """A compiled `BatchSpan` is its own finished record: the encoder reads it in place and writes
    what the SDK's encoder writes for the same span read through its Python fields."""
    from sie_sidecar._native import BatchTracer
    from sie_sidecar.otel.tracing import Sampler, SpanBuffer

    buffer = SpanBuffer()
    span = BatchTracer(Sampler("always_on"), buffer, lane="p|l4|b").start_batch(model, "score", 3, 9, contexts)
    assert span is not None
    for name in events:
        span.event(name)
    for key, value in extra:
        span.attribute(key, value)
    span.end(error)
    (record,) = buffer.take()
    assert record is span
    body = native_request([record], RESOURCE, SCOPE)
    assert body is not None and body == _sdk_bytes([record])  # type: ignore[list-item]


def test_the_http_exporter_takes_finished_records_once_bound() -> None:
    """Bound to a resource and scope (`SpanPipeline` does), the exporter takes the tracer's records
    as they are; past the size limit it hands the SDK's own path the records wrapped as the SDK's
    spans, which encodes them and refuses the request as the SDK does."""
    from sie_sidecar.otel.traces import TakesRecords

    record = SpanRecord(f"{1:032x}", f"{1:016x}", "n", "consumer", 1, 2, (("a", 1),), (), (), None)
    exporter = http_span_exporter(endpoint="http://127.0.0.1:1/v1/traces", timeout=0.2)
    assert isinstance(exporter, TakesRecords)
    exporter.bind(RESOURCE, SCOPE)
    sent: list[bytes] = []

    class Client:
        def export(self, body: bytes) -> Any:
            sent.append(body)
            return type("Result", (), {"success": True})()

        def shutdown(self) -> None: ...

    exporter._client = Client()  # type: ignore[attr-defined]
    assert exporter.export([record]) is SpanExportResult.SUCCESS  # type: ignore[list-item]
    assert sent == [_sdk_bytes([record])]
    exporter._max_request_size = 10  # type: ignore[attr-defined]  # the SDK's own path, its own limit
    assert [type(s) for s in exporter.readable([record])] == [BatchSpanData]
    assert exporter.export([record]) is SpanExportResult.FAILURE  # type: ignore[list-item]  # the SDK refuses it
    assert len(sent) == 1


def test_a_request_mixing_compiled_spans_and_records_writes_the_sdks_bytes() -> None:
    """Compiled spans beside records of another shape go through the message encoder, each span
    converted from its fields: the same bytes the SDK's encoder writes for both."""
    from sie_sidecar._native import BatchTracer
    from sie_sidecar.otel.tracing import Sampler, SpanBuffer

    buffer = SpanBuffer()
    span = BatchTracer(Sampler("always_on"), buffer).start_batch(
        "m:fast", "encode", 2, 4, [format_traceparent("a" * 32, "b" * 16)]
    )
    assert span is not None
    span.event("published")
    span.end("boom")
    (compiled,) = buffer.take()
    record = SpanRecord(f"{1:032x}", f"{1:016x}", "n", "consumer", 1, 2, (("a", 1),), (), (), None)
    body = native_request([compiled, record], RESOURCE, SCOPE)
    assert body is not None and body == _sdk_bytes([compiled, record])  # type: ignore[list-item]
