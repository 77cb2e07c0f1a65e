# SPDX-License-Identifier: Apache-2.0
"""Batch spans (`SIE_TRACING_ENABLED`, issue 14): the strict W3C `traceparent`, the OTEL samplers for a
root span, links (valid, deduplicated, capped), the span buffer, the spans as the OpenTelemetry SDK
reads them encoded by the SDK's OTLP encoder and read back with opentelemetry-proto, the settings, and
the RunBatch writer's trace context (native and twin)."""

from __future__ import annotations

import re
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1 import trace_pb2 as pb
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from sie_sidecar import wire
from sie_sidecar._twins.requests import write_run_batch_body as write_run_batch_body_py
from sie_sidecar._twins.tracing import BatchTracer as TwinTracer
from sie_sidecar.config import Settings
from sie_sidecar.ipc.requests import run_batch_body
from sie_sidecar.otel.sdk import make_resource, span_exporter
from sie_sidecar.otel.target import PROTOCOLS, Target
from sie_sidecar.otel.traces import BatchSpanData
from sie_sidecar.otel.tracing import (
    MAX_LINKS,
    Sampler,
    SpanBuffer,
    SpanContext,
    SpanRecord,
    format_traceparent,
    links_of,
    parse_traceparent,
)
from sie_sidecar.wire.workitem import WorkItem, decode_work_item

from .test_run_batch_body import BASE

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{SPAN}-01"
ENV = {
    "SIE_NATS_URL": "nats://127.0.0.1:4222",
    "SIE_POOL": "default",
    "SIE_BUNDLE": "default",
    "SIE_MACHINE_PROFILE": "l4",
    "HOSTNAME": "pod-0",
}

#: Both batch tracers: the compiled one (when built) and its twin; the tracer tests run on each.
TRACERS: list[Any] = [TwinTracer]
if wire.USING_NATIVE:
    from sie_sidecar._native import BatchTracer as NativeTracer

    TRACERS.insert(0, NativeTracer)


@pytest.fixture(params=TRACERS, ids=lambda cls: "native" if cls is not TwinTracer else "twin")
def tracer_cls(request: pytest.FixtureRequest) -> Any:
    return request.param


# -------------------------------------------------------------------------------------- traceparent


def test_a_valid_traceparent_parses_and_formats_back() -> None:
    ctx = parse_traceparent(VALID)
    assert ctx == SpanContext(TRACE, SPAN, 1) and ctx.sampled and ctx.traceparent == VALID
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-00") == SpanContext(TRACE, SPAN, 0)


@pytest.mark.parametrize(
    "value",
    [
        None,
        17,
        b"00-" + TRACE.encode() + b"-" + SPAN.encode() + b"-01",
        "",
        f"01-{TRACE}-{SPAN}-01",  # strict: version 00 only
        f"ff-{TRACE}-{SPAN}-01",
        f"00-{'0' * 32}-{SPAN}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero span id
        f"00-{TRACE.upper()}-{SPAN}-01",  # upper case
        f"00-{TRACE}-{SPAN}-1",
        f"00-{TRACE}-{SPAN}-01-",
        f"00-{TRACE}-{SPAN}-01\n",
        f" 00-{TRACE}-{SPAN}-01",
        f"00-{TRACE[:-1]}-{SPAN}-01",
        f"00_{TRACE}_{SPAN}_01",
        f"00-{TRACE}-{SPAN}-0g",
    ],
)
def test_anything_else_is_no_context(value: object) -> None:
    assert parse_traceparent(value) is None


_STRICT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


@settings(max_examples=400, deadline=None)
@given(value=st.one_of(st.text(max_size=70), st.from_regex(_STRICT, fullmatch=True), st.from_regex(_STRICT)))
def test_parsing_never_raises_and_accepts_exactly_the_strict_form(value: str) -> None:
    ctx = parse_traceparent(value)
    strict = _STRICT.fullmatch(value) is not None and value[3:35] != "0" * 32 and value[36:52] != "0" * 16
    assert (ctx is not None) is strict
    if ctx is not None:
        assert ctx.traceparent == value


@given(trace=st.integers(1, 2**128 - 1), span=st.integers(1, 2**64 - 1), flags=st.integers(0, 255))
def test_formatted_contexts_parse_back(trace: int, span: int, flags: int) -> None:
    text = format_traceparent(f"{trace:032x}", f"{span:016x}", flags)
    assert parse_traceparent(text) == SpanContext(f"{trace:032x}", f"{span:016x}", flags)


# ------------------------------------------------------------------------------------------ sampler


@pytest.mark.parametrize(
    ("name", "ratio", "low_id", "high_id"),
    [
        ("always_on", 1.0, True, True),
        ("parentbased_always_on", 1.0, True, True),
        ("always_off", 1.0, False, False),
        ("parentbased_always_off", 1.0, False, False),
        ("traceidratio", 0.5, True, False),
        ("parentbased_traceidratio", 0.5, True, False),
        ("traceidratio", 0.0, False, False),
        ("traceidratio", 1.0, True, True),
    ],
)
def test_a_root_batch_span_for_every_sampler(name: str, ratio: float, low_id: bool, high_id: bool) -> None:
    """A batch without a valid inbound context is a root: the parent-based samplers decide with their
    root sampler; the ratio compares the trace id's low 64 bits (the high 64 are ignored, as in the
    OTEL SDKs). Only a sampler that follows no parent can be `never`."""
    sampler = Sampler(name, ratio)
    assert sampler.sampled((0xFFFF << 64) | 1) is low_id
    assert sampler.sampled((1 << 64) - 1) is high_id
    assert sampler.never is (not low_id and not high_id and not name.startswith("parentbased_"))


def test_a_ratio_samples_about_its_share(tracer_cls: Any) -> None:
    tracer = tracer_cls(Sampler("traceidratio", 0.25), SpanBuffer())
    sampled = sum(tracer.start_batch("m", "encode", 1, 1) is not None for _ in range(4000))
    assert 800 < sampled < 1200


def test_an_unknown_sampler_is_refused_by_the_class() -> None:
    with pytest.raises(ValueError, match="unknown sampler"):
        Sampler("jaeger_remote")


@pytest.mark.parametrize(
    ("env", "sampler", "ratio", "warned"),
    [
        ({}, "parentbased_always_on", 1.0, False),
        ({"OTEL_TRACES_SAMPLER": "always_off"}, "always_off", 1.0, False),
        ({"OTEL_TRACES_SAMPLER": " TraceIdRatio ", "OTEL_TRACES_SAMPLER_ARG": "0.1"}, "traceidratio", 0.1, False),
        ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio"}, "parentbased_traceidratio", 1.0, False),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "traceidratio", 1.0, True),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "x"}, "traceidratio", 1.0, True),
        ({"OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_SAMPLER_ARG": "x"}, "always_on", 1.0, False),
        ({"OTEL_TRACES_SAMPLER": "jaeger_remote"}, "parentbased_always_on", 1.0, True),
    ],
)
def test_the_sampler_comes_from_the_standard_variables(
    env: dict[str, str], sampler: str, ratio: float, warned: bool
) -> None:
    s = Settings.from_env(ENV | env)
    assert (s.otel.traces_sampler, s.otel.traces_sampler_ratio) == (sampler, ratio)
    assert bool(s.warnings) is warned
    Sampler(s.otel.traces_sampler, s.otel.traces_sampler_ratio)  # every resolved value is one the class takes


# ----------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("env", "endpoint", "enabled"),
    [
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            "http://c:4318/v1/traces",
            True,
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:9/x",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            "http://t:9/x",
            True,
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317/"}, "http://c:4317/", True),  # gRPC: as it is
        ({}, None, False),  # no endpoint
    ],
)
def test_the_traces_endpoint_resolves_like_the_metrics_one(
    env: dict[str, str], endpoint: str | None, enabled: bool
) -> None:
    s = Settings.from_env(ENV | env | {"SIE_TRACING_ENABLED": "true"})
    assert s.otel.traces_endpoint == endpoint and s.tracing_enabled is enabled
    assert bool(s.warnings) is (not enabled)
    assert s.unsupported() == []  # no longer refused


@pytest.mark.parametrize(
    ("env", "protocol", "endpoint", "enabled"),
    [
        ({}, "grpc", "http://c:4317", True),  # the default, as for metrics
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "http/protobuf", "http://c:4317/v1/traces", True),
        (  # the signal-specific protocol wins over the generic one, both ways
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
            "grpc",
            "http://c:4317",
            True,
        ),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": " HTTP/Protobuf "},
            "http/protobuf",
            "http://c:4317/v1/traces",
            True,
        ),
        (  # the traces protocol is the traces' own: the metrics one does not decide it
            {"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf"},
            "grpc",
            "http://c:4317",
            True,
        ),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "http/json", "http://c:4317/v1/traces", False),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}, "thrift", "http://c:4317", False),
    ],
)
def test_the_traces_protocol_resolves_like_the_metrics_one(
    env: dict[str, str], protocol: str, endpoint: str, enabled: bool
) -> None:
    base = ENV | {"SIE_TRACING_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}
    s = Settings.from_env(base | env)
    assert (s.otel.traces_protocol, s.otel.traces_endpoint, s.tracing_enabled) == (protocol, endpoint, enabled)
    warned = [w for w in s.warnings if "tracing is off" in w]
    assert len(warned) == (0 if enabled else 1)
    if not enabled:
        assert repr(protocol) in warned[0] and "grpc and http/protobuf" in warned[0]
    else:
        assert protocol in PROTOCOLS


@pytest.mark.parametrize(("protocol", "kind"), [("grpc", GrpcSpanExporter), ("http/protobuf", HttpSpanExporter)])
def test_the_span_exporter_follows_the_protocol(protocol: str, kind: type[object]) -> None:
    exporter = span_exporter(Target("http://127.0.0.1:1/v1/traces", protocol))
    try:
        assert isinstance(exporter, kind)  # the SDK's exporter, with the compiled encoder (otel.span_exporters)
    finally:
        exporter.shutdown()


def test_the_batch_processor_variables() -> None:
    s = Settings.from_env(
        ENV
        | {
            "OTEL_BSP_SCHEDULE_DELAY": "250",
            "OTEL_BSP_MAX_QUEUE_SIZE": "10",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "99",
            "OTEL_BSP_EXPORT_TIMEOUT": "1500",
        }
    )
    otel = s.otel
    assert (otel.traces_schedule_delay_s, otel.traces_max_queue, otel.traces_max_export_batch) == (0.25, 10, 10)
    assert otel.traces_export_timeout_s == 1.5
    assert Settings.from_env(ENV).tracing_enabled is False


# ---------------------------------------------------------------------------------- spans and links


def _record(i: int = 0, **kw: Any) -> SpanRecord:
    base: dict[str, Any] = {
        "trace_id": f"{i + 1:032x}",
        "span_id": f"{i + 1:016x}",
        "name": "sie.worker.batch encode",
        "kind": "consumer",
        "start_ns": 1_000 + i,
        "end_ns": 2_000 + i,
        "attributes": (("lane", "l"), ("sie.batch.size", 3)),
        "events": (),
        "links": (),
        "error": None,
    }
    return SpanRecord(**(base | kw))


def test_a_sampled_batch_links_to_its_items_valid_contexts_once_each(tracer_cls: Any) -> None:
    buffer = SpanBuffer()
    span = tracer_cls(Sampler("always_on"), buffer, lane="p|l4|b").start_batch("bge:fast", "encode", 4, 40)
    assert span is not None
    other = f"00-{'1' * 32}-{'2' * 16}-00"
    span.link([VALID, None, "garbage", VALID, other, f"00-{TRACE}-{SPAN}-00"])  # same ids, other flags: once
    parent, state = span.wire_context
    assert state is None
    ctx = parse_traceparent(parent)
    assert ctx is not None and ctx.sampled and (ctx.trace_id, ctx.span_id) == (span.trace_id, span.span_id)
    span.event("ipc.request")
    span.end()
    (record,) = buffer.take()
    assert record.links == (VALID, "garbage", other, f"00-{TRACE}-{SPAN}-00")  # distinct strings, unparsed
    links, dropped = links_of(record.links)  # parsed when the exporter reads the span
    assert [(c.trace_id, c.span_id) for c in links] == [(TRACE, SPAN), ("1" * 32, "2" * 16)]
    assert dropped == 0 and record.error is None
    assert dict(record.attributes) == {
        "lane": "p|l4|b",
        "operation": "encode",
        "model": "bge",
        "profile": "fast",
        "sie.batch.size": 4,
        "sie.batch.cost": 40,
    }
    assert record.name == "sidecar.dispatch" and record.start_ns <= record.events[0][1] <= record.end_ns


def test_links_are_capped_and_the_rest_counted(tracer_cls: Any) -> None:
    buffer = SpanBuffer()
    span = tracer_cls(Sampler("always_on"), buffer).start_batch("m", "score", 300, 300)
    assert span is not None
    span.link([format_traceparent(f"{i + 1:032x}", SPAN) for i in range(300)])
    span.end("boom")
    (record,) = buffer.take()
    links, dropped = links_of(record.links)
    assert len(links) == MAX_LINKS and dropped == 300 - MAX_LINKS and record.error == "boom"


def test_an_unsampled_batch_is_none(tracer_cls: Any) -> None:
    assert tracer_cls(Sampler("always_off"), SpanBuffer()).start_batch("m", "encode", 1, 1) is None
    assert tracer_cls(Sampler("parentbased_traceidratio", 0.0), SpanBuffer()).start_batch("m", "encode", 1, 1) is None


def test_the_buffer_keeps_spans_until_attached_dropping_its_oldest() -> None:
    buffer = SpanBuffer(4)
    for i in range(6):
        buffer.add(_record(i))
    assert len(buffer) == 4 and buffer.dropped == 2
    forwarded: list[int] = []
    buffer.attach(lambda record: forwarded.append(record.start_ns))
    assert forwarded == [1002, 1003, 1004, 1005] and len(buffer) == 0  # the kept ones first, in order
    buffer.add(_record(6))
    assert forwarded[-1] == 1006 and len(buffer) == 0  # then each as it ends
    buffer.detach()
    buffer.add(_record(7))
    assert len(buffer) == 1 and forwarded[-1] == 1006


class CountingBuffer(SpanBuffer):
    """A buffer that counts the spans that went through its `add`."""

    def __init__(self) -> None:
        super().__init__()
        self.added = 0

    def add(self, span: Any) -> None:
        self.added += 1
        super().add(span)


def test_an_ended_span_goes_straight_to_where_the_buffer_forwards(tracer_cls: Any) -> None:
    """Attached, a span that ends is handed to the processor by the tracer itself, not through the
    buffer's `add` (one Python frame a batch, issue 32); detached, it is kept again, even a span
    started while the buffer was attached."""
    buffer = CountingBuffer()
    tracer = tracer_cls(Sampler("always_on"), buffer)
    kept = tracer.start_batch("m", "encode", 1, 1)
    kept.end()
    assert (buffer.added, len(buffer)) == (1, 1)
    forwarded: list[Any] = []
    buffer.attach(forwarded.append)
    assert buffer.added == 1 and len(forwarded) == 1 and len(buffer) == 0
    span = tracer.start_batch("m", "encode", 2, 2)
    running = tracer.start_batch("m", "encode", 3, 3)
    span.end()
    assert buffer.added == 1 and len(forwarded) == 2 and forwarded[-1].span_id == span.span_id
    buffer.detach()
    running.end()
    assert (buffer.added, len(buffer), len(forwarded)) == (2, 1, 2)


def _encode(records: list[SpanRecord], resource: dict[str, str], version: str = "") -> ExportTraceServiceRequest:
    """The records as the SDK's exporter sends them: `BatchSpanData`, encoded by the SDK's encoder."""
    scope = InstrumentationScope("sie_sidecar", version)
    sdk_resource = make_resource(resource)
    request = sdk_encode_spans([BatchSpanData(r, sdk_resource, scope) for r in records])
    decoded: ExportTraceServiceRequest = ExportTraceServiceRequest.FromString(request.SerializeToString())
    return decoded


def test_spans_encode_to_an_otlp_request_that_reads_back() -> None:
    too_many = tuple(format_traceparent(f"{i + 1:032x}", SPAN) for i in range(MAX_LINKS + 2))
    records = [
        _record(0, events=(("ipc.request", 1_500),), links=(VALID, "x")),
        _record(1, error="transport: gone", links=too_many),
    ]
    request = _encode(records, {"service.name": "s", "cloud.region": "r"}, version="9.9")
    (rs,) = request.resource_spans
    resource = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
    assert {k: v for k, v in resource.items() if not k.startswith("telemetry.sdk.")} == {
        "service.name": "s",
        "cloud.region": "r",
    }
    (ss,) = rs.scope_spans
    assert (ss.scope.name, ss.scope.version) == ("sie_sidecar", "9.9")
    first, second = ss.spans
    assert first.trace_id == bytes.fromhex(f"{1:032x}") and first.span_id == bytes.fromhex(f"{1:016x}")
    assert first.kind == pb.Span.SpanKind.SPAN_KIND_CONSUMER and first.parent_span_id == b""
    assert (first.start_time_unix_nano, first.end_time_unix_nano) == (1_000, 2_000)
    attrs = {kv.key: kv.value for kv in first.attributes}
    assert attrs["lane"].string_value == "l" and attrs["sie.batch.size"].int_value == 3
    assert [(e.name, e.time_unix_nano) for e in first.events] == [("ipc.request", 1_500)]
    (lk,) = first.links
    assert (lk.trace_id.hex(), lk.span_id.hex(), lk.flags) == (TRACE, SPAN, 0x300)  # a remote context
    assert first.status.code == pb.Status.StatusCode.STATUS_CODE_UNSET
    assert second.status.code == pb.Status.StatusCode.STATUS_CODE_ERROR
    assert second.status.message == "transport: gone" and second.dropped_links_count == 2


# --------------------------------------------------------------------- the RunBatch writer's context


def _items(traceparents: list[str | None]) -> list[WorkItem]:
    payloads = [
        msgpack.packb(BASE | {"item": {"text": str(i)}, **({"traceparent": tp} if tp is not None else {})})
        for i, tp in enumerate(traceparents)
    ]
    return [decode_work_item(p) for p in payloads]


def test_a_trace_context_replaces_every_items_own_and_nothing_else() -> None:
    items = _items([VALID, None, "x"])
    untraced = write_run_batch_body_py("m", "encode", "", 3, 1, items)
    traced = write_run_batch_body_py("m", "encode", "", 3, 1, items, trace=("00-ab-cd-01", None))
    a, b = msgpack.unpackb(untraced), msgpack.unpackb(traced)
    assert [i["traceparent"] for i in a["items"]] == [VALID, None, "x"]
    assert [(i["traceparent"], i["tracestate"]) for i in b["items"]] == [("00-ab-cd-01", None)] * 3
    for i in (*a["items"], *b["items"]):
        del i["traceparent"], i["tracestate"]
    assert a == b


@pytest.mark.skipif(not wire.USING_NATIVE, reason="the native writer")
@settings(max_examples=60, deadline=None)
@given(
    tps=st.lists(st.none() | st.just(VALID) | st.text(max_size=8), max_size=5),
    trace=st.none() | st.tuples(st.text(max_size=60), st.none() | st.text(max_size=20)),
)
def test_the_native_writer_and_the_twin_write_the_same_trace_context(
    tps: list[str | None], trace: tuple[str, str | None] | None
) -> None:
    from sie_sidecar._native import write_run_batch_body

    items = _items(tps)
    twin = write_run_batch_body_py("m", "encode", "", 1, 5, items, trace=trace)
    assert write_run_batch_body("m", "encode", "", 1, 5, items, None, None, None, trace) == twin
    body = msgpack.unpackb(run_batch_body("m", "encode", items, "", 1, trace=trace))
    assert [i["traceparent"] for i in body["items"]] == [trace[0] if trace else tp for tp in tps]


def test_a_batch_span_is_parented_on_the_first_valid_inbound_context(tracer_cls: Any) -> None:
    """sidecar-behaviour §5.4: a `sidecar.dispatch` span whose parent is the items' first valid W3C
    context (its trace id, its span id as the parent), the other valid contexts as links."""
    buffer = SpanBuffer()
    other = f"00-{'1' * 32}-{'2' * 16}-01"
    span = tracer_cls(Sampler("always_on"), buffer).start_batch(
        "m", "encode", 4, 4, [None, "garbage", VALID, other, VALID]
    )
    assert span is not None
    assert (span.trace_id, span.parent_span_id) == (TRACE, SPAN) and span.span_id != SPAN
    span.end()
    (record,) = buffer.take()
    assert record.parent_span_id == SPAN and record.trace_id == TRACE
    assert record.links == ("garbage", other)  # the parent is not also a link
    assert [(c.trace_id, c.span_id) for c in links_of(record.links)[0]] == [("1" * 32, "2" * 16)]


@pytest.mark.parametrize(
    ("sampler", "flags", "sampled"),
    [
        ("parentbased_always_on", "01", True),
        ("parentbased_always_on", "00", False),
        ("parentbased_traceidratio", "01", True),
        ("always_on", "00", True),
    ],
)
def test_parentbased_samplers_follow_the_parent(sampler: str, flags: str, sampled: bool, tracer_cls: Any) -> None:
    parent = f"00-{TRACE}-{SPAN}-{flags}"
    span = tracer_cls(Sampler(sampler, 0.0 if "ratio" in sampler else 1.0), SpanBuffer()).start_batch(
        "m", "encode", 1, 1, [parent]
    )
    assert (span is not None) is sampled


def test_a_parented_span_is_encoded_with_its_remote_parent() -> None:
    """OTLP span flags: "has is-remote" always, "is remote" when the parent is (the gateway's context)."""
    request = _encode([_record(0, parent_span_id=SPAN), _record(1)], {"service.name": "s"})
    parented, root = request.resource_spans[0].scope_spans[0].spans
    assert parented.parent_span_id.hex() == SPAN and parented.flags == 0x300
    assert root.parent_span_id == b"" and root.flags == 0x100


# ------------------------------------------------------------------------- both tracers, one contract


def test_a_span_ends_once_and_nothing_changes_it_after(tracer_cls: Any) -> None:
    buffer = SpanBuffer()
    span = tracer_cls(Sampler("always_on"), buffer).start_batch("m", "encode", 2, 2)
    assert span is not None
    span.attribute("sie.ipc.method", "Encode")
    span.attribute("lane", "again")  # a repeated key keeps its place, takes the new value
    span.event("ipc.request")
    span.end("boom")
    span.event("late")
    span.attribute("late", 1)
    span.end()
    (record,) = buffer.take()
    assert [k for k, _ in record.attributes] == [
        "lane",
        "operation",
        "model",
        "profile",
        "sie.batch.size",
        "sie.batch.cost",
        "sie.ipc.method",
    ]
    assert dict(record.attributes)["lane"] == "again" and record.error == "boom"
    assert [name for name, _ in record.events] == ["ipc.request"] and record.end_ns >= record.start_ns > 0
    assert len(buffer) == 0


def test_spans_of_one_model_and_operation_keep_their_attributes_apart(tracer_cls: Any) -> None:
    """The compiled tracer shares a (model, operation)'s attributes between its spans: setting one
    of them again on a span changes that span alone, in place."""
    buffer = SpanBuffer()
    tracer = tracer_cls(Sampler("always_on"), buffer, lane="l4")
    first = tracer.start_batch("org/m:fast", "encode", 3, 30)
    second = tracer.start_batch("org/m:fast", "encode", 4, 40)
    other = tracer.start_batch("org/m", "score", 5, 50)
    assert first is not None and second is not None and other is not None
    first.attribute("model", "renamed")
    first.attribute("sie.batch.cost", 31)
    first.event("a custom moment")
    for span in (first, second, other):
        span.event("published")
        span.end()
    a, b, c = buffer.take()
    expected_keys = ["lane", "operation", "model", "profile", "sie.batch.size", "sie.batch.cost"]
    assert [k for k, _ in a.attributes] == expected_keys
    assert dict(a.attributes) == {
        "lane": "l4",
        "operation": "encode",
        "model": "renamed",
        "profile": "fast",
        "sie.batch.size": 3,
        "sie.batch.cost": 31,
    }
    assert dict(b.attributes) == {
        "lane": "l4",
        "operation": "encode",
        "model": "org/m",
        "profile": "fast",
        "sie.batch.size": 4,
        "sie.batch.cost": 40,
    }
    assert dict(c.attributes)["operation"] == "score" and dict(c.attributes)["profile"] == "default"
    assert [name for name, _ in a.events] == ["a custom moment", "published"]
    assert [name for name, _ in b.events] == ["published"]


def _started(cls: Any, items: Any) -> tuple[str, str, tuple[str, ...]]:
    buffer = SpanBuffer()
    span = cls(Sampler("parentbased_always_on"), buffer).start_batch("m", "encode", 9, 9, items)
    assert span is not None
    span.end()
    (record,) = buffer.take()
    return record.trace_id, record.parent_span_id, record.links


def test_both_tracers_read_the_items_contexts_alike() -> None:
    """`start_batch` takes the batch's items or their contexts; the compiled tracer and the twin
    pick the same parent (the first valid context) and the same links (the other distinct ones)."""
    other = f"00-{'1' * 32}-{'2' * 16}-01"
    items = _items([None, "garbage", VALID, other, VALID, ""])
    contexts = [None, "garbage", VALID, other, VALID, ""]
    for cls in TRACERS:
        assert _started(cls, items) == _started(cls, contexts) == (TRACE, SPAN, ("garbage", other))


@pytest.mark.skipif(not wire.USING_NATIVE, reason="LazyDelivery is the extension's")
def test_the_compiled_tracer_reads_undecoded_deliveries_in_place() -> None:
    from sie_sidecar._native import BatchTracer

    from .test_lazy_delivery import intake

    other = f"00-{'1' * 32}-{'2' * 16}-01"
    payloads = [msgpack.packb(BASE | {"item": {"text": "a"}, "traceparent": tp}) for tp in ("x", VALID, other)]
    ds = intake([*payloads, msgpack.packb(BASE), msgpack.packb(BASE | {"traceparent": None})])
    assert _started(BatchTracer, ds) == (TRACE, SPAN, ("x", other))
    assert all(d.wire_item is d for d in ds)  # still undecoded
    ds[1].item  # noqa: B018  decoded now: read from the WorkItem
    assert _started(BatchTracer, ds) == (TRACE, SPAN, ("x", other))


def test_ids_are_lower_case_hex_and_differ_between_spans(tracer_cls: Any) -> None:
    tracer = tracer_cls(Sampler("always_on"), SpanBuffer())
    spans = [tracer.start_batch("m", "encode", 1, 1) for _ in range(200)]
    ids = {(s.trace_id, s.span_id) for s in spans}
    assert len(ids) == 200 and len({t for t, _ in ids}) == 200
    for trace_id, span_id in ids:
        assert re.fullmatch("[0-9a-f]{32}", trace_id) and re.fullmatch("[0-9a-f]{16}", span_id)
        assert parse_traceparent(format_traceparent(trace_id, span_id)) is not None


def test_the_pipeline_hands_the_processor_records_as_they_are_with_the_sidecars_exporters() -> None:
    """With the sidecar's exporters, a finished span goes into the SDK's batch processor's queue as
    it is (no `ReadableSpan` per span on the event loop); any other exporter gets `BatchSpanData`.
    This fails if an SDK upgrade moves the processor's queue: the slower path would still work."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from sie_sidecar.otel.traces import SpanPipeline

    resource = make_resource({"service.name": "s"})
    ours = SpanPipeline(span_exporter(Target("http://127.0.0.1:1/v1/traces", "http/protobuf")), resource)
    emit: object = ours.processor._batch_processor.emit
    assert ours.takes_records and ours.forward == emit
    got: list[object] = []

    class Listing(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            got.extend(spans)
            return SpanExportResult.SUCCESS

    theirs = SpanPipeline(Listing(), resource, schedule_delay_s=0.01)
    assert not theirs.takes_records
    theirs.forward(_record(1))
    theirs.shutdown()
    ours.shutdown()
    assert [type(s) for s in got] == [BatchSpanData] and got[0].record == _record(1)  # type: ignore[attr-defined]
