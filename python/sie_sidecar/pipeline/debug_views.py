# SPDX-License-Identifier: Apache-2.0
"""The dispatcher's read-only views: `GET /debug/state` and the batch-size summary of the shutdown log
and the demo. Snapshots read on the event loop; nothing here is on the batch path."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from ..prep import TokenizerRegistry
from .admission import Admission
from .config_gate import ConfigState
from .lanes import ModelLanes
from .stages import BackendClient


def debug_state(
    *,
    worker_id: str,
    backend: BackendClient,
    config: ConfigState,
    admission: Admission | None,
    lanes: ModelLanes,
    tokenizers: TokenizerRegistry,
    batch_sizes: Counter[int],
) -> dict[str, Any]:
    """What `GET /debug/state` shows (SIE_SIDECAR_DEBUG_ENDPOINT, on by default for loopback
    peers): per model its readiness as last answered, tokenizer mode, batch budget, controller
    knobs, queue depth and batches in flight; and how batches reach the backend."""
    now = time.monotonic()
    models: dict[str, Any] = {}
    for model, state in sorted(lanes.models.items()):
        tokenizer = tokenizers.get(model)
        entry: dict[str, Any] = {
            "ready_state": state.ready[1].state if state.ready is not None else None,
            "ready_age_s": round(now - state.ready[0], 3) if state.ready is not None else None,
            "tokenizer_mode": tokenizer.mode if tokenizer is not None else "none",
            "batch_budget": state.batch_budget,
        }
        lane = state.lane
        if lane is not None:
            sched = lane.scheduler
            entry |= {
                "cost_cap": lane.cost_cap,
                "wait_ms": lane.wait_ms,
                "cost_budget": lane.budget,
                "count_cap": sched.max_requests,
                "queue_depth": sched.pending,
                "in_flight_batches": sched.in_flight,
                "pipeline_depth": sched.depth,
                "flushes": dict(sched.flushes),
                "jit_holds": sched.jit_holds,
                "aged_items": sched.aged_items,
                "progress_acks": sched.progress_acks,
            }
        models[model] = entry
    return {
        "worker_id": worker_id,
        "batch_method": "run_batch" if backend.runs_batches else "per_op",
        "config_hash": config.current,
        "config": config.snapshot(),
        "pool_admission": None if admission is None else admission.snapshot(),
        "batches": batch_summary(batch_sizes),
        "models": models,
    }


def batch_summary(batch_sizes: Counter[int]) -> dict[str, float]:
    """Count, mean, p50 and max of the items per backend batch so far."""
    sizes = sorted(batch_sizes.elements())
    if not sizes:
        return {"batches": 0, "mean": 0.0, "p50": 0.0, "max": 0.0}
    return {
        "batches": len(sizes),
        "mean": round(sum(sizes) / len(sizes), 2),
        "p50": float(sizes[len(sizes) // 2]),
        "max": float(sizes[-1]),
    }
