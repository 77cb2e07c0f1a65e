# SPDX-License-Identifier: Apache-2.0
"""CPU per item of each native stage of the hot path, on one batch, side by side.

Why: the e2e bench shares two cores between four processes, and `pipeline_cpu.py` gives one figure
for the whole pipeline; this says which stage a change moved. A real RunBatch response is captured
once from the reference null backend (384-dim float32 embeddings), then each stage runs over the
same batch: the intake (scanned deliveries, payloads kept in place, against the decoder alone),
the RunBatch body, the response decode, the reply framing, and bulk settlement. Each figure is the
minimum over `--repeats` timings of `--loops` calls (CPU time of this process), so a noisy host
mostly adds repeats, not error.

Run from the repository root: `python benches/stage_costs.py [--items 64] [--repeats 15]`.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import asyncio
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benches.gateway_items import bench_payload, gateway_texts
from benches.null_backend import null_backend
from sie_sidecar import wire
from sie_sidecar._native import deliveries_of_run
from sie_sidecar._native.wire import scan_direct_msgs
from sie_sidecar.ipc.client import IpcClient
from sie_sidecar.ipc.requests import run_batch_body
from sie_sidecar.pipeline.admission import Admission, PoolDecision
from sie_sidecar.pipeline.delivery import Settler
from sie_sidecar.pipeline.intake import Intake
from sie_sidecar.wire.workitem import WorkItem, decode_work_item

MODEL = "org/model-a"
SUBJECT = wire.pool_work_subject("default", "cpu", "default", MODEL)


_TEXTS = gateway_texts()


def _payload(i: int) -> bytes:
    """Item `i` as the gateway writes it (benches/gateway_items.py)."""
    return bench_payload(MODEL, 0, i, _TEXTS[i % len(_TEXTS)])


def _frames(n: int) -> bytes:
    return b"".join(
        b"MSG %s 1 $JS.ACK.WORK.w.1.%d.%d.1733100000000000000.0 %d\r\n%s\r\n"
        % (SUBJECT.encode(), i + 1, i + 1, len(p), p)
        for i, p in enumerate(_payload(i) for i in range(n))
    )


def _scan(frames: bytes) -> list[Any]:
    got: list[Any] = []
    make_run = functools.partial(deliveries_of_run, item_cls=WorkItem)
    scan_direct_msgs(bytearray(frames), {1: got.extend}, None, Msg, make_run)
    return got


async def _response(n: int) -> bytes:
    """One RunBatch response of the reference null backend for `n` encode items."""
    async with null_backend(MODEL) as sock:
        ipc = IpcClient(sock, pool_size=1, request_timeout_s=10.0)
        await ipc.ensure_model_ready(MODEL)
        items = [decode_work_item(_payload(i)) for i in range(n)]
        captured: list[bytes] = []

        def keep(raw: memoryview) -> None:
            captured.append(bytes(raw))

        await ipc.run_batch_with(run_batch_body(MODEL, "encode", items, "", n), keep)
        await ipc.close()
        return captured[0]


def best_us(fn: Callable[[], object], n: int, loops: int, repeats: int) -> float:
    """The fastest of `repeats` timings of `loops` calls, in µs of CPU per item."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(loops):
            fn()
        best = min(best, (time.process_time() - start) / loops / n * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--items", type=int, default=64, help="items per batch (default 64)")
    parser.add_argument("--loops", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    if not wire.USING_NATIVE:
        parser.error("the native core is what this measures (unset SIE_SIDECAR_NO_EXTENSIONS)")
    n = args.items
    response = asyncio.run(_response(n))
    frames = _frames(n)
    intake = Intake()
    lazy = intake.intake(_scan(frames), None).groups[MODEL]
    gated = Intake()  # pool admission on (§8): each item's admission_pool checked, in place
    gated.admission = Admission("default")
    gated.admission.record(PoolDecision(True, "assigned", frozenset({"tenant-x"})))
    decoded = [decode_work_item(_payload(i)) for i in range(n)]
    payloads = [_payload(i) for i in range(n)]
    common: dict[str, Any] = {"worker_id": "w", "current_hash": None, "max_payload": 1 << 20, "acks": True}
    wire_items: Callable[[], list[Any]] = lambda: [d.wire_item for d in lazy]  # noqa: E731

    def settle() -> None:
        for d in lazy:
            d.settled = False
        Settler()._finish_many(lazy)

    stages: list[tuple[str, Callable[[], object]]] = [
        ("scan: frames to deliveries", lambda: _scan(frames)),
        ("intake: verdicts, groups", lambda: intake.intake(_scan(frames), None)),
        ("intake, pool admission on", lambda: gated.intake(_scan(frames), None)),
        ("  (WorkItem decoder alone)", lambda: [decode_work_item(p) for p in payloads]),
        ("RunBatch body, in place", lambda: run_batch_body(MODEL, "encode", wire_items(), "", n)),
        ("  (from decoded WorkItems)", lambda: run_batch_body(MODEL, "encode", decoded, "", n)),
        ("response: decode only", lambda: wire.decode_batch_outcome(response)),
        (
            "response: replies + ACKs framed",
            lambda: wire.frame_batch_response(response, lazy, now=time.time(), **common),
        ),
        ("settlement (bulk)", settle),
    ]
    scan_us = 0.0
    print(f"{n} encode items per batch, response {len(response) / n:,.0f} bytes per item; µs of CPU per item:")
    for name, fn in stages:
        us = best_us(fn, n, args.loops, args.repeats)
        if name.startswith("scan"):
            scan_us = us
        shown = f"{us:6.2f}" + (
            f"  (scan included; intake alone ~{us - scan_us:.2f})" if name.startswith("intake") else ""
        )
        print(f"  {name:34s} {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
