# SPDX-License-Identifier: Apache-2.0
"""One model's lane (scheduler-and-prep §4.1, §4.6): its scheduler, its adaptive controller and the
windows that feed it, in one object that the scheduler's side owns.

Feedback flows one way: the pipeline executes a formed batch and reports what happened
(`BatchReport`); the lane steps its controller and pushes the new limits into its own formers. The
pipeline never writes limits back into the scheduler.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ..telemetry import Registry
from ..telemetry.lane_metrics import AdaptiveState, LaneMetrics
from .controller import EFFICIENCY_WINDOW, LATENCY_MIN_SAMPLES, LATENCY_WINDOW, AdaptiveController, PercentileWindow
from .scheduler import Formed, Keepalive, ModelScheduler, SchedulerConfig
from .trace import ControllerTrace

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BatchReport:
    """What executing one formed batch taught: the backend's reported `inference_ms` (first outcome),
    the wall time of the call, and the enqueue-to-finish latency of each request that succeeded."""

    inference_ms: float | None
    elapsed_ms: float
    finished: float
    success_latencies_ms: Sequence[float] = ()

    @property
    def any_success(self) -> bool:
        return bool(self.success_latencies_ms)


@dataclass(frozen=True, slots=True)
class LaneSettings:
    """What every lane is built from (`Settings` → `DispatchSettings.lanes`)."""

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    #: Step the controller once per wave (primary batch) rather than on every batch (§4.6).
    wave_cadence: bool = True
    #: `SIE_ADAPTIVE_BATCH_*` overrides for every model's controller (None: production defaults).
    controller_env: dict[str, str] | None = None
    #: Directory for one replayable controller trace per model (`SIE_SIDECAR_CONTROLLER_TRACE`).
    controller_trace_dir: str | None = None
    #: SIE_BATCHER_MAX_BATCH_COST was set: reported `max_batch_tokens` budgets are ignored (§3.7).
    cost_pinned: bool = False


Execute = Callable[[Formed[T]], Awaitable[BatchReport | None]]


class ModelLane(Generic[T]):
    """A model's scheduler plus the controller loop around it."""

    def __init__(
        self,
        model: str,
        execute: Execute[T],
        settings: LaneSettings,
        *,
        on_idle: Callable[[], None] | None = None,
        telemetry: Registry | None = None,
        keepalive: Keepalive[T] | None = None,
        metrics: LaneMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: the scheduler's monotonic clock (arrival times, triggers); tests inject one."""
        self.model = model
        self.metrics: LaneMetrics | None = None
        self._execute = execute
        self._s = settings
        c = settings.scheduler
        self.scheduler: ModelScheduler[T] = ModelScheduler(
            model,
            self._run,
            c,
            clock=clock,
            on_idle=on_idle,
            telemetry=telemetry,
            keepalive=keepalive,
        )
        self.controller = AdaptiveController.production(
            c.max_batch_cost, c.max_batch_wait_ms, env=settings.controller_env
        )
        self.cost_cap = c.max_batch_cost
        self.wait_ms = c.max_batch_wait_ms
        self.budget = c.max_batch_cost  # the cost budget the controller was built from
        self.latency = PercentileWindow(LATENCY_WINDOW, LATENCY_MIN_SAMPLES)
        self.efficiency = PercentileWindow(EFFICIENCY_WINDOW, 1)
        self.trace: ControllerTrace | None = None
        if settings.controller_trace_dir:
            self.trace = ControllerTrace.open(settings.controller_trace_dir, model, self.controller.config)
        if metrics is not None:
            self.attach_metrics(metrics)

    def attach_metrics(self, metrics: LaneMetrics) -> None:
        """Record into `metrics` from now on (at construction, or for a lane made before recording
        was turned on): the scheduler's depth and this lane's controller are read at snapshot time."""
        if self.metrics is None:
            self.metrics = metrics
            self.scheduler.attach_metrics(metrics)
            metrics.watch_controller(self.adaptive_state)

    def adaptive_state(self) -> AdaptiveState:
        """The controller's current wait (ms), cost cap, observed and target p50 (ms; None: none yet)."""
        return self.wait_ms, self.cost_cap, self.latency.p50(), self.controller.target_p50_ms

    # -- what the backend said about itself ------------------------------------------------------------

    def describe(
        self, *, max_concurrent_dispatch: int | None, max_batch_tokens: int | None, batch_budget: int | None = None
    ) -> None:
        """Take the backend's dispatch width, count budget and cost budget from its descriptor / ready answer."""
        self.scheduler.widen(max_concurrent_dispatch)
        self.scheduler.cap_requests(batch_budget)
        if max_batch_tokens and not self._s.cost_pinned and max_batch_tokens != self.budget:
            self._adopt_budget(max_batch_tokens)

    def _adopt_budget(self, budget: int) -> None:
        """A reported `max_batch_tokens` (newer than v0.7.1, §3.7): re-base the model on it. The
        controller is rebuilt (it re-calibrates), the fill window cleared, and every former gets the
        new cost cap with the initial wait; a later absent budget never undoes this."""
        wait = self._s.scheduler.max_batch_wait_ms
        self.budget = budget
        self.controller = AdaptiveController.production(budget, wait, env=self._s.controller_env)
        self.efficiency = PercentileWindow(EFFICIENCY_WINDOW, 1)
        self.cost_cap, self.wait_ms = self.controller.current_batch_cost, self.controller.current_wait_ms
        self.scheduler.update_limits(self.cost_cap, self.wait_ms)
        log.info("model batch budget adopted", extra={"model": self.model, "max_batch_tokens": budget})

    # -- the feedback loop -------------------------------------------------------------------------------

    async def _run(self, formed: Formed[T]) -> float | None:
        """The scheduler's dispatch: execute, learn, and return the reported inference time (the
        scheduler's device clock learns from it)."""
        report = await self._execute(formed)
        if report is None:
            return None
        if report.any_success:  # an all-error batch feeds nothing and does not step the controller
            self._learn(formed, report)
        return report.inference_ms

    def _learn(self, formed: Formed[T], report: BatchReport) -> None:
        self.latency.extend(report.success_latencies_ms)
        ctl = self.controller
        if not ctl.calibrated:
            inference_ms = report.inference_ms if report.inference_ms is not None else report.elapsed_ms
            ctl.record_inference(inference_ms)
            if self.trace is not None:
                self.trace.inference(inference_ms)
        if self.cost_cap > 0:
            self.efficiency.push(formed.total_cost / self.cost_cap)
        if formed.role == "primary" or not self._s.wave_cadence:
            p50, fill = self.latency.p50(), self.efficiency.mean()
            resets = ctl.starvation_resets
            wait_ms, cost = ctl.step(p50, fill, len(formed.items), report.finished)
            if self.metrics is not None:
                self.metrics.resets += ctl.starvation_resets - resets
            if self.trace is not None:
                self.trace.step(report.finished, p50, fill, len(formed.items), wait_ms=wait_ms, batch_cost=cost)
            if cost != self.cost_cap or wait_ms != self.wait_ms:
                self.cost_cap, self.wait_ms = cost, wait_ms
                self.scheduler.update_limits(cost, wait_ms)

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def close(self, deadline_s: float) -> list[T]:
        """Flush what is queued (bounded); returns the items left unsent. Closes the trace."""
        left = await self.scheduler.close(deadline_s)
        if self.trace is not None:
            self.trace.close()
            self.trace = None
        return left


__all__ = ["BatchReport", "LaneSettings", "ModelLane"]
