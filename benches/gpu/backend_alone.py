# SPDX-License-Identifier: Apache-2.0
"""The torch MiniLM backend alone: items/s of back-to-back full batches through `run_batch`, no IPC.

Each measured call is the adapter's whole `run_batch` on 512 encode items of 64-token texts (text ->
ids, pinned copy in, forward, copy out, `frame_dense_batch`, ItemOutcome maps): what the backend
does per RunBatch minus the socket and msgpack envelope. After a warm-up, `--batches` calls run
with `--concurrency` of them in flight at once (1: strictly back to back; N: how the sidecar drives
it with SIE_PULL_LOOP_INFLIGHT=N, so host work overlaps the GPU), for each mode: eager, and replay
of a CUDA graph. Prints one JSON object; `best` is the fastest run, the ceiling `gpu_e2e.sh` compares
the end-to-end figure with.

Run: `python benches/gpu/backend_alone.py [--batches 200] [--concurrency 1,4] [--modes eager,graph]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `benches.gpu`

from benches.gpu.torch_minilm_backend import (
    MODEL_ID,
    TorchMiniLM,
    TorchMiniLMAdapter,
    add_model_arguments,
    bench_texts,
    token_ids,
)

MODES = ("eager", "graph")


def make_items(texts: Sequence[str], batch: int, round_no: int) -> list[dict[str, Any]]:
    """EncodeBatchItem maps as the server hands them to `run_batch` (validated, unwrapped)."""
    now = time.time()
    return [
        {
            "work_item_id": f"r{round_no}-{i}.0",
            "request_id": f"r{round_no}-{i}",
            "item_index": 0,
            "total_items": 1,
            "timestamp": now,
            "item": {"text": texts[(round_no * batch + i) % len(texts)]},
            "options": None,
        }
        for i in range(batch)
    ]


async def measure(adapter: TorchMiniLMAdapter, batches: list[list[dict[str, Any]]], concurrency: int) -> float:
    """Seconds to run every batch through `run_batch` with `concurrency` calls in flight."""
    queue = list(reversed(batches))

    async def worker() -> None:
        while queue:
            items = queue.pop()
            outcomes = await adapter.run_batch(MODEL_ID, "encode", items, "")
            if len(outcomes) != len(items) or outcomes[0]["disposition"] != "publish_and_ack":
                raise RuntimeError(f"unexpected outcomes: {outcomes[0]!r}")

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


async def run(args: argparse.Namespace) -> dict[str, Any]:
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        raise SystemExit(f"backend_alone: unknown modes {sorted(unknown)} (choose from {', '.join(MODES)})")
    levels = [int(c) for c in args.concurrency.split(",") if c]
    model = TorchMiniLM(
        seq=args.seq,
        max_batch=args.batch_budget,
        device=args.device,
        dtype=args.dtype,
        weights=args.weights,
        cuda_graph=False,
        compile_model=args.compile,
    )
    adapter = TorchMiniLMAdapter(model, batch_budget=args.batch_budget)
    texts = bench_texts(args.texts, args.seq)
    batches = [make_items(texts, args.batch_budget, r) for r in range(args.batches)]
    warm = batches[: args.warmup]

    # Sanity: unit vectors, finite, deterministic in the text.
    ids = token_ids(texts[:8], args.seq)
    first, second = model.embed(ids), model.embed(ids)
    norms = np.linalg.norm(first, axis=1)
    sanity = {
        "finite": bool(np.isfinite(first).all()),
        "norm_min": float(norms.min()),
        "norm_max": float(norms.max()),
        "repeatable_max_abs_diff": float(np.abs(first - second).max()),
    }

    runs: list[dict[str, Any]] = []
    for mode in modes:
        if mode == "graph":
            if not model.is_cuda:
                runs.append({"mode": mode, "skipped": "CUDA graphs need a CUDA device"})
                continue
            if not model.has_graph:
                try:
                    model.capture_graph()
                except Exception as exc:  # report it and keep the eager figures
                    runs.append({"mode": mode, "skipped": f"graph capture failed: {exc!r}"})
                    continue
        model.use_graph = mode == "graph"
        for concurrency in levels:
            await measure(adapter, warm, concurrency)
            elapsed = await measure(adapter, batches, concurrency)
            items = len(batches) * args.batch_budget
            runs.append(
                {
                    "mode": mode,
                    "concurrency": concurrency,
                    "batches": len(batches),
                    "items": items,
                    "elapsed_s": round(elapsed, 4),
                    "items_per_s": round(items / elapsed, 1),
                    "ms_per_batch": round(elapsed * 1e3 / len(batches), 3),
                }
            )
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    measured = [r for r in runs if "items_per_s" in r]
    best = max(measured, key=lambda r: r["items_per_s"]) if measured else None
    return {
        "bench": "backend_alone",
        "model": MODEL_ID,
        "batch": args.batch_budget,
        "seq": args.seq,
        **{f"model_{k}": v for k, v in model.describe().items()},
        "sanity": sanity,
        "runs": runs,
        "best": best,
        "backend_alone_items_per_s": best["items_per_s"] if best else None,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="backend_alone.py", description=__doc__.split("\n\n")[0] if __doc__ else "")
    add_model_arguments(parser)
    parser.add_argument("--batches", type=int, default=200, help="measured batches per run (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured batches before each run (%(default)s)")
    parser.add_argument("--concurrency", default="1,4", help="comma-separated calls in flight (default %(default)s)")
    parser.add_argument("--modes", default="eager,graph", help="comma-separated: eager, graph (default %(default)s)")
    parser.add_argument("--texts", type=int, default=4096, help="distinct texts cycled through (%(default)s)")
    parser.add_argument("--json", default=None, help="also write the result to this file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.batches < 1 or args.warmup < 0 or args.batch_budget < 1:
        raise SystemExit("backend_alone: --batches and --batch-budget must be >= 1, --warmup >= 0")
    result = asyncio.run(run(args))
    line = json.dumps(result)
    print(line, flush=True)
    if args.json:
        Path(args.json).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
