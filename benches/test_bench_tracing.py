# SPDX-License-Identifier: Apache-2.0
"""What tracing adds to one batch's RPC preparation (`pipeline.execution.Execution._call_backend`): the RunBatch body of
64 loadgen items, each with its own traceparent, written as the dispatcher writes it with tracing off
(no tracer), on but not sampled (the sampler's one decision), and sampled (the items' contexts read
in place by `start_batch`, the span's context written into every item, the span finished and handed
to the OpenTelemetry SDK's batch span processor, as `otel.export.TracePush` attaches it; its
exporter drops the spans, so the finished spans reach it as `BatchSpanData`)."""

from __future__ import annotations

from collections.abc import Sequence

import msgpack
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from pytest_benchmark.fixture import BenchmarkFixture

from sie_sidecar import wire
from sie_sidecar.ipc.requests import run_batch_body
from sie_sidecar.otel.sdk import make_resource
from sie_sidecar.otel.tracer import Tracer
from sie_sidecar.otel.traces import SpanPipeline
from sie_sidecar.otel.tracing import Sampler, SpanBuffer
from sie_sidecar.tools.loadgen import LoadConfig, build_work_item
from sie_sidecar.wire.workitem import WorkItem, decode_work_item

ITEMS = 64
MODES = {
    "off": None,
    "unsampled": Sampler("traceidratio", 1e-12),  # a trace id is drawn and refused
    "sampled": Sampler("always_on"),
}


class _Dropping(SpanExporter):
    """Counts the spans the processor exports, and drops them."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def _items() -> list[WorkItem]:
    config = LoadConfig(nats_url="nats://unused", operation="encode")
    out = []
    for i in range(ITEMS):
        item = build_work_item(
            config, request_id=f"req-{i}", item_index=i, total_items=ITEMS, text_index=i, timestamp=1.7e9 + i
        )
        # Trace ids high in their low 64 bits: the ratio sampler refuses them (the "unsampled" mode).
        item["traceparent"] = f"00-{i + 1:016x}{'f' * 16}-{i + 1:016x}-01"
        out.append(decode_work_item(msgpack.packb(item)))
    return out


@pytest.mark.parametrize("mode", list(MODES))
def test_run_batch_with_tracing_64_items(benchmark: BenchmarkFixture, mode: str) -> None:
    benchmark.group = f"tracing: one batch's RunBatch body and span, {ITEMS} encode items"
    items = _items()
    sampler = MODES[mode]
    buffer = SpanBuffer()
    exporter = _Dropping()
    pipeline = SpanPipeline(exporter, make_resource({"service.name": "bench"}), schedule_delay_s=0.2)
    buffer.attach(pipeline.forward)
    tracer = Tracer(sampler, buffer) if sampler is not None else None
    fetch = [0.0] * ITEMS

    def call() -> bytes:  # the dispatcher's lines, in its order
        span = tracer.start_batch("m", "encode", len(items), ITEMS, items) if tracer is not None else None
        trace = span.wire_context if span is not None else None
        body = run_batch_body("m", "encode", items, "", ITEMS, payload_fetch_ms=fetch, trace=trace)
        if span is not None:
            span.event("ipc.request")
            span.event("ipc.response")
            span.end()
        return body

    body = benchmark(call)
    pipeline.shutdown()
    first = msgpack.unpackb(body)["items"][0]["traceparent"]
    assert (first == "00-" + "0" * 15 + "1" + "f" * 16 + "-" + "0" * 15 + "1-01") is (mode != "sampled")
    assert (exporter.spans > 0) is (mode == "sampled")


@pytest.mark.parametrize("encoder", ["sdk", "compiled"])
@pytest.mark.parametrize("links", [0, ITEMS])
def test_otlp_encoding_of_512_spans(benchmark: BenchmarkFixture, encoder: str, links: int) -> None:
    """What the span exporter does with one full export batch (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, 512)
    of batch spans before sending it, in the batch span processor's thread: the SDK's OTLP encoder
    over `BatchSpanData` (what shipped before), or the compiled encoder over their records (what the
    sidecar's exporters use, `otel.span_exporters`). Both write the same bytes (checked here). Spans
    without links (items that carry no context) and with 64 (every item traced by its caller). The
    figure per span is this / 512."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from sie_sidecar.otel.span_exporters import native_request
    from sie_sidecar.otel.traces import BatchSpanData
    from sie_sidecar.otel.tracing import format_traceparent

    if encoder == "compiled" and not wire.USING_NATIVE:
        pytest.skip("the compiled encoder")
    benchmark.group = f"tracing: OTLP encoding of 512 batch spans with {links} links each"
    buffer = SpanBuffer(1024)
    tracer = Tracer(Sampler("always_on"), buffer, lane="default|cpu|default")
    contexts = [format_traceparent(f"{i + 1:032x}", f"{i + 1:016x}") for i in range(links)]
    for n in range(512):
        span = tracer.start_batch("org/model", "encode", ITEMS, ITEMS)
        assert span is not None
        span.link(contexts[n % 2 :] + contexts[: n % 2])
        for event in ("ipc.request", "ipc.response", "published"):
            span.event(event)
        span.end()
    resource = make_resource({"service.name": "bench", "service.instance.id": "pod-0", "cloud.region": "unknown"})
    scope = InstrumentationScope("sie_sidecar", "0")
    spans = [BatchSpanData(record, resource, scope) for record in buffer.take()]
    sdk = bytes(encode_spans(spans).SerializeToString())
    if encoder == "sdk":
        body = benchmark(lambda: encode_spans(spans).SerializeToString())
    else:
        body = benchmark(lambda: native_request(spans))
    assert body == sdk and len(spans) == 512 and len(sdk) > 512 * 100
