# SPDX-License-Identifier: Apache-2.0
"""What tracing adds to a batch, in instructions: N batches of the dispatcher's tracing lines
(`pipeline.execution.Execution._call_backend` and `_execute`): the span started over 64 gateway-shaped
items (their contexts read by `start_batch`), its context written into the RunBatch body, two
events, the end, and the SDK's batch span processor with the sidecar's OTLP/HTTP exporter (to
`--endpoint`: run `benches/metrics_overhead.py --sink PORT` for a receiver). `--mode off` writes
the same bodies untraced. Run under callgrind at two N; the slope is the cost per batch
(docs/benchmarks.md, "Tracing built by the compiled core"):

    valgrind --tool=callgrind --callgrind-out-file=/tmp/t.500 python benches/profilers/trace_batches.py --batches 500
    valgrind --tool=callgrind --callgrind-out-file=/tmp/t.2500 python benches/profilers/trace_batches.py --batches 2500
"""

from __future__ import annotations

import argparse

import msgpack

from sie_sidecar.ipc.requests import run_batch_body
from sie_sidecar.otel.sdk import make_resource
from sie_sidecar.otel.span_exporters import http_span_exporter
from sie_sidecar.otel.tracer import Tracer
from sie_sidecar.otel.traces import SpanPipeline
from sie_sidecar.otel.tracing import Sampler, SpanBuffer
from sie_sidecar.tools.loadgen import LoadConfig, build_work_item
from sie_sidecar.wire.workitem import decode_work_item

ITEMS = 64


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mode", choices=("off", "traced"), default="traced")
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--endpoint", default="http://127.0.0.1:4399/v1/traces")
    args = parser.parse_args(argv)
    config = LoadConfig(nats_url="nats://unused", operation="encode")
    items = [
        decode_work_item(
            msgpack.packb(
                build_work_item(
                    config, request_id=f"r{i}", item_index=i, total_items=ITEMS, text_index=i, timestamp=1.7e9 + i
                )
            )
        )
        for i in range(ITEMS)
    ]
    fetch = [0.0] * ITEMS
    buffer = SpanBuffer()
    pipeline = SpanPipeline(http_span_exporter(endpoint=args.endpoint), make_resource({"service.name": "bench"}))
    buffer.attach(pipeline.forward)
    tracer = Tracer(Sampler("parentbased_always_on"), buffer) if args.mode == "traced" else None
    for _ in range(args.batches):
        span = tracer.start_batch("m", "encode", ITEMS, ITEMS, items) if tracer is not None else None
        trace = span.wire_context if span is not None else None
        run_batch_body("m", "encode", items, "", ITEMS, payload_fetch_ms=fetch, trace=trace)
        if span is not None:
            span.event("ipc.request")
            span.event("published")
            span.end()
    pipeline.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
