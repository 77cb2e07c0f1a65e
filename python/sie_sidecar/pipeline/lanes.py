# SPDX-License-Identifier: Apache-2.0
"""What the pipeline keeps per model: its lane (scheduler and controller loop, `sched.lane`), the last
`ready` answer and its batch budget, and what follows from all models together (the intake limit, the
largest count cap, idleness). The readiness gate, preparation, execution and the debug view all read
it; it runs no stage itself. A lane hands each formed batch to the executor it is bound to."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..ipc.types import ReadyResponse
from ..sched.lane import BatchReport, LaneSettings, ModelLane
from ..sched.scheduler import Formed
from ..telemetry import QUEUE_DEPTH, ModelCatalog, QueueDepth, Registry
from ..telemetry.lane_metrics import LaneMetrics
from .delivery import Delivery
from .stages import BackendClient

if TYPE_CHECKING:
    from .dispatcher import DispatchSettings

#: Runs one formed batch of a model and reports what its lane learns (`execution.Execution`).
ExecuteFormed = Callable[[str, Formed[Delivery]], Awaitable[BatchReport | None]]


@dataclass(slots=True)
class ModelState:
    """What the pipeline keeps per model: its lane (scheduler and controller loop), the last `ready`
    answer (reused for READY_CACHE_S) and its batch budget."""

    lane: ModelLane[Delivery] | None = None
    ready: tuple[float, ReadyResponse] | None = None
    batch_budget: int | None = None


async def _unbound(model: str, formed: Formed[Delivery]) -> BatchReport | None:
    raise RuntimeError("ModelLanes.bind was not called")


class ModelLanes:
    """Every model's state, its lane made on first use and kept."""

    def __init__(
        self,
        settings: DispatchSettings,
        telemetry: Registry,
        backend: BackendClient,
        keepalive: Callable[[list[Delivery]], Awaitable[None]],
    ) -> None:
        self._s = settings
        self._telemetry = telemetry
        self._backend = backend
        self._keepalive = keepalive
        self._execute: ExecuteFormed = _unbound
        #: Everything kept per model, in one object each (its lane, the cached ready answer, ...).
        self.models: dict[str, ModelState] = {}
        self.settings = LaneSettings(
            scheduler=settings.scheduler,
            wave_cadence=settings.wave_cadence,
            controller_env=dict(settings.controller_env) if settings.controller_env is not None else None,
            controller_trace_dir=settings.controller_trace_dir,
            cost_pinned=settings.cost_pinned,
        )
        #: Set when metrics are enabled (the runtime): each model lane then records its §13 queue and
        #: batch instruments with (model, profile) attributes from this catalog.
        self.catalog: ModelCatalog | None = None
        self._queue_depth: QueueDepth | None = None
        #: Called whenever a model's scheduler has nothing pending or running (the pull loop's bypass).
        self.on_idle: Callable[[], None] | None = None
        #: Called with the largest count cap of any model whenever it changes (the runtime derives the
        #: pull-ahead from it, docs/operations.md "derived defaults").
        self.on_count_cap: Callable[[int], None] | None = None
        self._count_cap = 0
        #: The smallest batch budget a backend has reported, else the fetch budget.
        self.intake_limit = settings.fetch_budget

    def bind(self, execute: ExecuteFormed) -> None:
        """Lanes made from now on hand their formed batches to `execute`."""
        self._execute = execute

    def model(self, model: str) -> ModelState:
        state = self.models.get(model)
        if state is None:
            state = self.models[model] = ModelState()
        return state

    def forget_ready(self, model: str) -> None:
        """Ask the backend again next time: an IPC failure, or a `nak_retry` (the model was unloaded?)."""
        state = self.models.get(model)
        if state is not None:
            state.ready = None

    def lane(self, model: str) -> ModelLane[Delivery]:
        state = self.model(model)
        lane = state.lane
        if lane is None:
            execute = self._execute
            lane = state.lane = ModelLane(
                model,
                lambda formed: execute(model, formed),
                self.settings,
                on_idle=lambda: self.on_idle() if self.on_idle is not None else None,
                telemetry=self._telemetry,
                keepalive=self._keepalive,
                metrics=self._lane_metrics(model),
            )
        return lane

    def budget(self, model: str, ready: ReadyResponse) -> int:
        """The model's batch budget from its ready answer (else the fetch budget); a changed one
        moves the intake limit."""
        budget = ready.batch_budget or self._s.fetch_budget
        state = self.model(model)
        if state.batch_budget != budget:
            state.batch_budget = budget
            budgets = [m.batch_budget for m in self.models.values() if m.batch_budget is not None]
            self.intake_limit = max(1, min(self._s.fetch_budget, *budgets))
        return budget

    def describe(self, model: str, ready: ReadyResponse) -> ModelLane[Delivery]:
        """The model's lane, sized from its ready answer (and the pool transport grown to its width)."""
        lane = self.lane(model)
        width = ready.descriptor.max_concurrent_dispatch if ready.descriptor is not None else None
        grow = getattr(self._backend, "grow_for", None)  # the pool transport: wire-protocol §1.2
        if grow is not None and width is not None and width > 1:
            grow(model, width)
        lane.describe(
            max_concurrent_dispatch=width,
            max_batch_tokens=ready.max_batch_tokens,
            # A token budget without a count budget: the fallback count budget is the count cap.
            batch_budget=ready.batch_budget or (self._s.fetch_budget if ready.max_batch_tokens else None),
        )
        self._note_count_cap()
        return lane

    def _note_count_cap(self) -> None:
        """Tell `on_count_cap` when the largest count cap of any model's lane changed."""
        largest = max((m.lane.scheduler.max_requests for m in self.models.values() if m.lane is not None), default=0)
        if largest != self._count_cap:
            self._count_cap = largest
            if self.on_count_cap is not None:
                self.on_count_cap(largest)

    def pressure(self, model: str) -> tuple[int, int]:
        """(pending cost, pending items) of the model's scheduler."""
        state = self.models.get(model)
        if state is None or state.lane is None:
            return 0, 0
        scheduler = state.lane.scheduler
        return scheduler.pending_cost, scheduler.pending

    def idle(self) -> bool:
        """No model has items queued in its scheduler or batches in flight."""
        return all(m.lane.scheduler.idle() for m in self.models.values() if m.lane is not None)

    def record_with(self, catalog: ModelCatalog) -> None:
        """Recording is on: lanes made from now on get their metrics at creation, those made before here."""
        self.catalog = catalog
        for model, state in self.models.items():
            metrics = self._lane_metrics(model) if state.lane is not None and state.lane.metrics is None else None
            if state.lane is not None and metrics is not None:
                state.lane.attach_metrics(metrics)

    def _lane_metrics(self, model: str) -> LaneMetrics | None:
        if self.catalog is None:
            return None
        if self._queue_depth is None:
            self._queue_depth = QueueDepth(self._telemetry, self.catalog, QUEUE_DEPTH)
        return LaneMetrics(self._telemetry, self.catalog, self._queue_depth, model)

    async def close(self, deadline_s: float) -> list[list[Delivery]]:
        """Every lane flushes its queued work (bounded); what each had left."""
        return await asyncio.gather(*(m.lane.close(deadline_s) for m in self.models.values() if m.lane is not None))
