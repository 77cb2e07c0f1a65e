# SPDX-License-Identifier: Apache-2.0
"""The dispatcher's share of the settings, as the values the pipeline and the schedulers take.

`DispatchSettings` (the dispatcher), `SchedulerConfig` (each model's scheduler) and `DeadlineRules`
(§15.3) are plain frozen values. They live here, below `sched/` and `pipeline/`, so that the env
reader builds them once (`Settings.dispatch`) instead of the runtime mapping the settings into them
field by field; `sched.scheduler`, `pipeline.deadlines` and `pipeline.dispatcher` re-export them
under their old names. This module imports nothing of the package.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

#: The longest any item waits for a batch by default; the lifecycle lowers it to a quarter of ack_wait.
MAX_ITEM_WAIT_S: Final = 5.0
#: The pool consumer's ack_wait (`bus.topology.POOL_ACK_WAIT_S`, kept equal by a unit test): what
#: `Settings.dispatch` is derived for; `DispatchSettings.for_ack_wait` gives it for another consumer.
DEFAULT_ACK_WAIT_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """`SIE_BATCHER_*`, `SIE_RUST_PIPELINE_DEPTH` and friends (sidecar-behaviour §1.2)."""

    max_batch_cost: int = 16384
    max_batch_requests: int = 12
    #: The count cap follows the backend's `batch_budget` (raised or lowered to it) instead of only
    #: being lowered to it; `max_batch_requests` applies while the backend reports none. The settings set
    #: this unless SIE_BATCHER_MAX_BATCH_REQUESTS was given (docs/operations.md, "derived defaults").
    requests_from_budget: bool = False
    max_batch_wait_ms: float = 15.0
    coalesce_ms: float = 5.0
    coalesce_ratio: float = 0.5
    pipeline_depth: int = 2
    idle_bypass: bool = True
    jit_dispatch: bool = True
    drain_deadline_s: float = 10.0
    #: An item pending this long goes into the next batch whatever its cost (0: never forced).
    max_item_wait_s: float = MAX_ITEM_WAIT_S
    #: Progress-ACK items held this long (half the consumer's ack_wait; 0: never). Needs `keepalive`.
    progress_after_s: float = 15.0


@dataclass(frozen=True, slots=True)
class DeadlineRules:
    """The §15.3 settings: `enforce` (SIE_WORK_DEADLINE_ENFORCE), the clock skew tolerated, the
    longest deadline budget taken as real, and the tombstone horizon no lease outlives."""

    enforce: bool = False
    skew_s: float = 5.0
    max_budget_s: float = 180.0
    horizon_s: float = 1800.0
    #: Whether deadlines are judged at all: §15.3 and §4.1 row 10 are for NATS work; local ingest
    #: (no broker, no redelivery, no lease to hold) runs what its caller sent.
    judge: bool = True

    def run_batch_timeout_s(self, ipc_timeout_s: float, latest_deadline: float | None, now: float) -> float:
        """wire-protocol RunBatch timeout (newer than v0.7.1): max(the IPC request timeout, the time
        until the latest live deadline in the batch, capped at the max budget)."""
        if latest_deadline is None:
            return ipc_timeout_s
        return max(ipc_timeout_s, min(latest_deadline - now, self.max_budget_s))


@dataclass(frozen=True, slots=True)
class DispatchSettings:
    """What the dispatcher reads from `Settings` (`Settings.dispatch`)."""

    worker_id: str
    nak_delay_ms: int = 5000
    fetch_budget: int = 64
    max_concurrent_batches: int = 4
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    #: Step the controller once per wave (primary batch) rather than on every batch (§4.6).
    wave_cadence: bool = True
    #: Each ProcessGenerate frame must arrive within this (SIE_GENERATE_IPC_FRAME_TIMEOUT_S, §15.1).
    generate_frame_timeout_s: float = 300.0
    #: `SIE_ADAPTIVE_BATCH_*` overrides for every model's controller (None: production defaults).
    controller_env: Mapping[str, str] | None = None
    #: Directory for one replayable controller trace per model (`SIE_SIDECAR_CONTROLLER_TRACE`).
    controller_trace_dir: str | None = None
    #: SIE_BATCHER_MAX_BATCH_COST was set: reported `max_batch_tokens` budgets are ignored (§3.7).
    cost_pinned: bool = False
    #: How long a group parked while its model loads may wait before it is handed back: the
    #: redelivery envelope, 30 s times max_deliver (§2.3).
    parked_deadline_s: float = 600.0
    #: Work deadlines (§15.3): enforcement, skew, max budget, tombstone horizon.
    deadlines: DeadlineRules = field(default_factory=DeadlineRules)
    #: The ordinary IPC request timeout: a RunBatch waits this long, or until its latest deadline.
    ipc_request_timeout_s: float = 60.0

    def for_ack_wait(self, ack_wait_s: float) -> DispatchSettings:
        """These settings for a consumer whose ack_wait is `ack_wait_s`: the schedulers bound any
        item's wait by a quarter of it (at most `MAX_ITEM_WAIT_S`) and progress-ACK at half of it."""
        scheduler = dataclasses.replace(
            self.scheduler, max_item_wait_s=min(MAX_ITEM_WAIT_S, ack_wait_s / 4), progress_after_s=ack_wait_s / 2
        )
        return dataclasses.replace(self, scheduler=scheduler)
