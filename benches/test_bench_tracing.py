# SPDX-License-Identifier: Apache-2.0
"""What tracing adds to one batch's RPC preparation (`Dispatcher._call_backend`): the RunBatch body of
64 loadgen items, each with its own traceparent, written as the dispatcher writes it with tracing off
(no tracer), on but not sampled (the sampler's one decision), and sampled (links read in place, the
span's context written into every item, the span finished into the buffer)."""

from __future__ import annotations

import msgpack
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from sie_sidecar.ipc.requests import item_traceparents, run_batch_body
from sie_sidecar.otel.tracing import Sampler, SpanBuffer, Tracer
from sie_sidecar.tools.loadgen import LoadConfig, build_work_item
from sie_sidecar.wire.workitem import WorkItem, decode_work_item

ITEMS = 64
MODES = {
    "off": None,
    "unsampled": Sampler("traceidratio", 1e-12),  # a trace id is drawn and refused
    "sampled": Sampler("always_on"),
}


def _items() -> list[WorkItem]:
    config = LoadConfig(nats_url="nats://unused", operation="encode")
    out = []
    for i in range(ITEMS):
        item = build_work_item(
            config, request_id=f"req-{i}", item_index=i, total_items=ITEMS, text_index=i, timestamp=1.7e9 + i
        )
        item["traceparent"] = f"00-{i + 1:032x}-{i + 1:016x}-01"
        out.append(decode_work_item(msgpack.packb(item)))
    return out


@pytest.mark.parametrize("mode", list(MODES))
def test_run_batch_with_tracing_64_items(benchmark: BenchmarkFixture, mode: str) -> None:
    benchmark.group = f"tracing: one batch's RunBatch body and span, {ITEMS} encode items"
    items = _items()
    sampler = MODES[mode]
    buffer = SpanBuffer(1 << 20, export_batch=1 << 20)
    tracer = Tracer(sampler, buffer) if sampler is not None else None
    fetch = [0.0] * ITEMS

    def call() -> bytes:  # the dispatcher's lines, in its order
        span = tracer.start_batch("m", "encode", len(items), ITEMS) if tracer is not None else None
        trace = None
        if span is not None:
            span.link(item_traceparents(items))
            trace = span.wire_context
        body = run_batch_body("m", "encode", items, "", ITEMS, payload_fetch_ms=fetch, trace=trace)
        if span is not None:
            span.event("ipc.request")
            span.event("ipc.response")
            span.end()
        return body

    body = benchmark(call)
    first = msgpack.unpackb(body)["items"][0]["traceparent"]
    assert (first == "00-" + "0" * 31 + "1-" + "0" * 15 + "1-01") is (mode != "sampled")
    assert (len(buffer) > 0) is (mode == "sampled")
