# SPDX-License-Identifier: Apache-2.0
"""The sidecar pipeline's CPU per item without NATS: intake to settlement, backend in its own process.

Why: the e2e bench shares two cores between four processes, so a change worth a few percent of the
sidecar drowns in the noise there. Here the dispatcher runs on the in-memory `Source` of
tests/pipeline (the same one the sequencing tests use), against the reference null backend over its
real Unix socket, and only this process's CPU is counted (`time.process_time`). The reply sink
drops the framed bytes, so what is measured is the sidecar's own work per item: intake, scheduling,
the RunBatch body, the IPC call, reply and ACK framing, settlement.

`--work gateway` (the default, issue 30) is what the NATS source hands on: gateway-shaped WorkItems
(benches/gateway_items.py) framed as JetStream `MSG`s and scanned into one native delivery each by the
inbound scanner, in runs of 256 frames (a socket read's worth), the scan counted. `--work memory` is
the older figure: `MemoryMessage`s of the sequencing tests, which intake must decode one by one.

`--metrics` measures recording with telemetry off and on (issue 14), alternating fresh dispatchers
in ABBA order in this one process: "on" is what the runtime wires when `SIE_METRICS_ENABLED` is true
(the model catalog on the dispatcher, the IPC client recording per request) plus a registry
snapshot and an OTLP encode every `--export-every` items, standing in for the 5 s push. With
`--tracing` "on" also traces every batch, as `SIE_TRACING_ENABLED` does: spans handed to the SDK's
batch span processor, whose exporter encodes them as the sidecar's do (the compiled encoder) and
sends nothing.

Run from the repository root: `python benches/pipeline_cpu.py [--items 20000] [--rounds 3] [--metrics]`.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's threads would spin on this process's CPU

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import functools  # noqa: E402

from nats.aio.msg import Msg  # noqa: E402
from tests.pipeline.memory import MemoryAcks, MemorySink, MemorySource  # noqa: E402
from tests.pipeline.test_sequencing import _item, _msg  # noqa: E402

from benches.gateway_items import bench_payload, gateway_texts  # noqa: E402
from benches.null_backend import null_backend  # noqa: E402
from sie_sidecar import wire  # noqa: E402
from sie_sidecar.ipc.client import IpcClient, observe_ipc  # noqa: E402
from sie_sidecar.otel.tracer import Tracer  # noqa: E402
from sie_sidecar.otel.tracing import Sampler, SpanBuffer  # noqa: E402
from sie_sidecar.pipeline.delivery import Settler  # noqa: E402
from sie_sidecar.pipeline.dispatcher import Dispatcher, DispatchSettings  # noqa: E402
from sie_sidecar.pipeline.feed import feed  # noqa: E402
from sie_sidecar.runtime.gc import tune_gc_for_steady_state  # noqa: E402
from sie_sidecar.sched.quantum import LatencyWindow, QuantumController  # noqa: E402
from sie_sidecar.sched.scheduler import SchedulerConfig  # noqa: E402
from sie_sidecar.telemetry import ModelCatalog, Registry  # noqa: E402
from sie_sidecar.wire.workitem import WorkItem  # noqa: E402

MODEL = "org/model-a"
SUBJECT = wire.pool_work_subject("default", "cpu", "default", MODEL)
MAX_OUTSTANDING = 256  # the pull consumer's bound at the defaults (SIE_PULL_LOOP_MAX_OUTSTANDING)
RUN_FRAMES = 256  # frames per scanned run: about one 64 KiB socket read of gateway-shaped items


def gateway_frames(n: int, tag: int, texts: Sequence[str] | None = None) -> list[bytes]:
    """`n` gateway-shaped WorkItems as JetStream `MSG` frames, in runs of RUN_FRAMES (`texts`: the
    items' texts, in turn; default 32-256 random bytes)."""
    texts = gateway_texts(seed=tag) if texts is None else texts
    frames = []
    for i in range(n):
        payload = bench_payload(MODEL, tag, i, texts[i % len(texts)])
        ack = b"$JS.ACK.WORK_POOL_default.w.1.%d.%d.1733100000000000000.0" % (i + 1, i + 1)
        frames.append(b"MSG %s 1 %s %d\r\n%s\r\n" % (SUBJECT.encode(), ack, len(payload), payload))
    return [b"".join(frames[i : i + RUN_FRAMES]) for i in range(0, n, RUN_FRAMES)]


def scan(run: bytes) -> list[Any]:
    """One run of frames into native deliveries, as the NATS inbound fast path makes them."""
    from sie_sidecar._native import deliveries_of_run
    from sie_sidecar._native.wire import scan_direct_msgs

    got: list[Any] = []
    scan_direct_msgs(
        bytearray(run), {1: got.extend}, None, Msg, functools.partial(deliveries_of_run, item_cls=WorkItem)
    )
    return got


async def _dropped(_: object) -> bool:
    return True


async def measure(items: int, rounds: int, work: str = "gateway") -> list[float]:
    """µs of this process's CPU per item, one figure per round (after a warm-up)."""
    async with null_backend(MODEL) as sock:
        return await _rounds(sock, items, rounds, work=work)


async def measure_metrics(
    items: int, rounds: int, export_every: int, *, tracing: bool = False
) -> dict[str, list[float]]:
    """µs per item with telemetry off and on, `rounds` of each, ABBA (one dispatcher per figure)."""
    figures: dict[str, list[float]] = {"off": [], "on": []}
    _export(Registry())  # the SDK's import, once, outside the measured rounds (the sidecar's OTLP thread pays it)
    async with null_backend(MODEL) as sock:
        for r in range(rounds):
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                figures[mode] += await _rounds(
                    sock, items, 1, metrics=mode == "on", export_every=export_every, tracing=tracing and mode == "on"
                )
    return figures


def _tracer() -> tuple[Tracer, Callable[[], None]]:
    """A tracer as `runtime.telemetry_side.start_tracing` wires it, its spans to the SDK's batch span processor; the
    exporter encodes each batch with the SDK's OTLP encoder and drops it. And what stops it."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from sie_sidecar.otel.sdk import make_resource
    from sie_sidecar.otel.span_exporters import native_request
    from sie_sidecar.otel.traces import SpanPipeline

    class Encoding(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            if native_request(spans) is None:  # the compiled encoder, as the sidecar's exporters use it
                encode_spans(spans).SerializeToString()
            return SpanExportResult.SUCCESS

    pipeline = SpanPipeline(Encoding(), make_resource({"service.name": "bench"}), schedule_delay_s=1.0)
    buffer = SpanBuffer()
    buffer.attach(pipeline.forward)
    return Tracer(Sampler("parentbased_always_on"), buffer), pipeline.shutdown


def _export(registry: Registry) -> None:
    """What one OTLP push costs in CPU, whichever thread: the snapshot (the event loop's), its
    conversion to the SDK's `MetricsData` and the SDK's protobuf encoding (the OTLP thread's)."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    from sie_sidecar.otel.metrics import MetricsBridge
    from sie_sidecar.otel.sdk import make_resource

    bridge = MetricsBridge(make_resource({"service.name": "bench"}), lane="bench")
    encode_metrics(bridge.data(registry.snapshot(), 1)).SerializeToString()


async def _rounds(
    sock: str,
    items: int,
    rounds: int,
    *,
    metrics: bool = False,
    export_every: int = 0,
    tracing: bool = False,
    work: str = "memory",
    frames_of: Callable[[int, int], list[bytes]] | None = None,
) -> list[float]:
    """CPU per item of `rounds` rounds of `items` (after a warm-up): `work` "gateway" scans gateway
    frames (`frames_of(n, round)` makes them, default `gateway_frames`), "memory" sends memory messages."""
    make_frames = frames_of if frames_of is not None else gateway_frames
    ipc = IpcClient(sock, pool_size=4, request_timeout_s=10.0)
    source, acks = MemorySource(MAX_OUTSTANDING), MemoryAcks()
    sink = MemorySink(framed=True, acks=acks)
    sink.publish_framed = _dropped  # type: ignore[method-assign,assignment]
    settler = Settler(acks)
    stop = asyncio.Event()
    quantum = QuantumController(LatencyWindow(), min_ms=2, max_ms=15, target_p50_ms=50)
    tracer, stop_tracing = _tracer() if tracing else (None, None)
    dispatcher = Dispatcher(
        DispatchSettings(worker_id="bench", scheduler=SchedulerConfig(requests_from_budget=True)),
        ipc,
        sink,
        settler,
        shutdown=stop,
        quantum=quantum,
        acks_with_replies=True,
        tracer=tracer,
    )
    if metrics:  # as runtime.telemetry_side.attach_catalog and start_metrics wire it
        dispatcher.catalog = ModelCatalog([MODEL])
        dispatcher.generations.telemetry = dispatcher.telemetry
        ipc.telemetry = dispatcher.telemetry
        observe_ipc(dispatcher.telemetry, [ipc])
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.create_task(
        feed(source, dispatcher.handle, budget=64, inflight=4, stop=stop, tasks=tasks, quantum=quantum)
    )

    async def one(n: int, tag: int) -> float:
        runs = make_frames(n, tag) if work == "gateway" else []
        msgs = [] if runs else [_msg(_item(f"{tag}-{i}", model=MODEL)) for i in range(n)]
        target = settler.counts.settled + n
        cpu = time.process_time()
        for run in runs:  # the scan is the NATS source's work: counted
            source.put(scan(run))
        if msgs:
            source.put(msgs)
        exported = settler.counts.settled
        while settler.counts.settled < target:
            await asyncio.sleep(0.001)
            if metrics and export_every and settler.counts.settled - exported >= export_every:
                _export(dispatcher.telemetry)
                exported = settler.counts.settled
        return (time.process_time() - cpu) / n * 1e6

    await one(2000, 1000)
    tune_gc_for_steady_state()  # as the app does once started
    figures = [await one(items, r) for r in range(rounds)]
    stop.set()
    source.stop()
    await loop
    await dispatcher.close_schedulers(1.0)
    if stop_tracing is not None:
        stop_tracing()
    if os.environ.get("PIPELINE_CPU_SIZES"):
        print(dispatcher.batch_summary(), sorted(dispatcher.batch_sizes.items())[:8])
    await ipc.close()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--metrics", action="store_true", help="telemetry off against on, ABBA")
    parser.add_argument("--tracing", action="store_true", help="with --metrics: 'on' traces every batch too")
    parser.add_argument(
        "--work",
        choices=("gateway", "memory"),
        default="gateway",
        help="scanned gateway-shaped deliveries (default) or the sequencing tests' memory messages",
    )
    parser.add_argument(
        "--export-every",
        type=int,
        default=50_000,
        help="items between snapshot+encode in 'on' runs (default 50000: ~2 s at the e2e rate, under the 5 s push)",
    )
    args = parser.parse_args(argv)
    if args.metrics:
        by_mode = asyncio.run(measure_metrics(args.items, args.rounds, args.export_every, tracing=args.tracing))
        med = {mode: statistics.median(f) for mode, f in by_mode.items()}
        for mode, f in by_mode.items():
            print(f"telemetry {mode:<3}: median {med[mode]:.2f} us per item ({' / '.join(f'{x:.2f}' for x in f)})")
        print(f"on/off: {med['on'] / med['off']:.3f}x ({args.items:,} items a figure, ABBA, export every"
              f" {args.export_every:,} items)")  # fmt: skip
        return 0
    figures = asyncio.run(measure(args.items, args.rounds, args.work))
    rounds = " / ".join(f"{f:.1f}" for f in figures)
    print(
        f"pipeline CPU per item ({args.work}): median {statistics.median(figures):.1f} us ({rounds}),"
        f" {args.items:,} items a round"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
