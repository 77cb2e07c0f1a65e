# SPDX-License-Identifier: Apache-2.0
"""A lane's controller loop (scheduler-and-prep §4.6, §3.7, §10 cases 51, 52, 54) and the adaptive
metrics it records (`sie.worker.scheduler.adaptive.p50`, `...starvation.resets`), driven through the
lane's own scheduler: formed batches are executed, their reports step the controller.

Waves are made deterministic with a count cap of 1 and items submitted before the drain loop runs:
three items form one primary batch and two drains; one item at a time forms a wave of one primary.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sie_sidecar.sched.lane import BatchReport, LaneSettings, ModelLane
from sie_sidecar.sched.scheduler import Formed, SchedulerConfig
from sie_sidecar.telemetry import Registry
from sie_sidecar.telemetry.catalog import ModelCatalog, QueueDepth
from sie_sidecar.telemetry.lane_metrics import LaneMetrics
from sie_sidecar.telemetry.names import ADAPTIVE_COST, ADAPTIVE_P50, ADAPTIVE_WAIT, QUEUE_DEPTH, STARVATION_RESETS

TARGET_ENV = {"SIE_ADAPTIVE_BATCH_TARGET_P50_MS": "50"}  # explicit target: no calibration phase
MODEL_ATTRS = (("model", "m"), ("profile", "default"))


class Executor:
    """Executes formed batches: every request succeeds with `latency_ms`; finish times advance 10 ms."""

    def __init__(self, latency_ms: float = 10.0) -> None:
        self.latency_ms = latency_ms
        self.roles: list[str] = []
        self._finish = itertools.count(1)

    async def __call__(self, formed: Formed[str]) -> BatchReport | None:
        self.roles.append(formed.role)
        return BatchReport(
            inference_ms=4.0,
            elapsed_ms=5.0,
            finished=next(self._finish) * 0.01,
            success_latencies_ms=[self.latency_ms] * len(formed.items),
        )


def lane_for(
    executor: Executor,
    *,
    wave_cadence: bool = True,
    env: dict[str, str] | None = None,
    trace_dir: Path | None = None,
    max_batch_cost: int = 16384,
    metrics: Callable[[], LaneMetrics] | None = None,
) -> ModelLane[str]:
    config = SchedulerConfig(max_batch_requests=1, pipeline_depth=2, jit_dispatch=False, max_batch_cost=max_batch_cost)
    settings = LaneSettings(
        scheduler=config,
        wave_cadence=wave_cadence,
        controller_env=env,
        controller_trace_dir=None if trace_dir is None else str(trace_dir),
    )
    ticks = itertools.count()
    return ModelLane(
        "m", executor, settings, clock=lambda: next(ticks) * 1e-4, metrics=None if metrics is None else metrics()
    )


async def run_wave(lane: ModelLane[str], n: int, cost: int = 1) -> None:
    """Submit `n` items at once and wait until every batch has been executed and learned from."""
    lane.scheduler.submit("encode", "", [f"x{i}" for i in range(n)], [cost] * n)
    async with asyncio.timeout(5):
        while not lane.scheduler.idle():
            await asyncio.sleep(0)


def trace_events(trace_dir: Path) -> list[str]:
    lines = (trace_dir / "m.jsonl").read_text().splitlines()
    return [json.loads(line)["event"] for line in lines if not line.startswith("#")]


# -- §4.6 cadence, case 52 ---------------------------------------------------------------------------------


async def test_drain_batches_feed_samples_but_step_only_without_wave_cadence(tmp_path: Path) -> None:
    """One wave (a primary and two drains of one item each): every batch feeds its latency and
    inference samples, the controller is stepped once, on the primary; a second wave steps it once
    more. With `SIE_RUST_WAVE_CADENCE` off every batch steps it."""
    executor = Executor()
    lane = lane_for(executor, trace_dir=tmp_path / "wave")
    try:
        await run_wave(lane, 3)
        assert executor.roles == ["primary", "drain", "drain"]
        assert len(lane.latency) == 3
        one_wave = ["record_inference", "step", "record_inference", "record_inference"]  # executed in that order
        assert trace_events(tmp_path / "wave") == one_wave
        assert lane.controller.snapshot()["starvation_streak"] == 1  # size-1 batches count when stepped
        await run_wave(lane, 3)
        assert executor.roles == ["primary", "drain", "drain"] * 2
        assert trace_events(tmp_path / "wave") == one_wave * 2
        assert lane.controller.snapshot()["starvation_streak"] == 2
    finally:
        await lane.close(0.5)

    every = Executor()
    per_batch = lane_for(every, wave_cadence=False, trace_dir=tmp_path / "batch")
    try:
        await run_wave(per_batch, 3)
        assert every.roles == ["primary", "drain", "drain"]
        assert trace_events(tmp_path / "batch") == ["record_inference", "step"] * 3
        assert per_batch.controller.snapshot()["starvation_streak"] == 3
    finally:
        await per_batch.close(0.5)


# -- case 51: the fill ratio feeds the cost knob ------------------------------------------------------------


async def serve_one_at_a_time(lane: ModelLane[str], cost: int, n: int) -> None:
    for _ in range(n):
        await run_wave(lane, 1, cost)


async def test_fill_from_completions_grows_the_cost_cap() -> None:
    """Completions of cost 800 under a cap of 1000 (fill 0.8, over the 0.7 threshold) with latency
    under target grow the cap, which reaches the formers; at fill 0.1 the cap does not move."""
    full = lane_for(Executor(), env=TARGET_ENV, max_batch_cost=1000)
    await serve_one_at_a_time(full, 800, 30)
    assert full.cost_cap > 1000
    assert full.cost_cap == full.controller.current_batch_cost
    assert full.scheduler._formers[("encode", "")].max_batch_cost == full.cost_cap
    assert full.controller.snapshot()["fill_ratio"] >= 0.7
    await full.close(0.5)

    sparse = lane_for(Executor(), env=TARGET_ENV, max_batch_cost=1000)
    await serve_one_at_a_time(sparse, 100, 30)
    assert sparse.controller.current_wait_ms > 15.0  # the law ran (the wait grew) ...
    assert sparse.cost_cap == 1000  # ... but the cost knob is gated on saturation
    await sparse.close(0.5)


# -- case 54: budget re-base --------------------------------------------------------------------------------


async def test_a_budget_rebase_resets_the_streak_and_the_fill_window() -> None:
    lane = lane_for(Executor())
    await serve_one_at_a_time(lane, 1, 3)
    assert lane.controller.snapshot()["starvation_streak"] == 3
    assert len(lane.efficiency) == 3
    lane.describe(max_concurrent_dispatch=None, max_batch_tokens=720_000)
    snapshot = lane.controller.snapshot()
    assert snapshot["starvation_streak"] == 0
    assert (snapshot["current_batch_cost"], snapshot["current_wait_ms"]) == (720_000, 15.0)
    assert (lane.controller.config["min_batch_cost"], lane.controller.config["max_batch_cost"]) == (180_000, 2_880_000)
    assert len(lane.efficiency) == 0
    assert lane.scheduler._formers[("encode", "")].max_batch_cost == 720_000

    adopted = lane.controller
    await serve_one_at_a_time(lane, 1, 2)
    for later in (None, 0):  # a later absent budget never undoes the adopted one
        lane.describe(max_concurrent_dispatch=None, max_batch_tokens=later)
        assert lane.controller is adopted
        assert (lane.budget, lane.cost_cap) == (720_000, 720_000)
        assert lane.controller.snapshot()["starvation_streak"] == 2
    await lane.close(0.5)


async def test_reporting_the_default_budget_is_the_same_as_reporting_none() -> None:
    """16384 reported for a model already at 16384 keeps the controller, its streak and the window."""
    lanes = [lane_for(Executor()), lane_for(Executor())]
    for lane in lanes:
        await serve_one_at_a_time(lane, 1, 2)
    controllers = [lane.controller for lane in lanes]
    lanes[0].describe(max_concurrent_dispatch=None, max_batch_tokens=16384)
    lanes[1].describe(max_concurrent_dispatch=None, max_batch_tokens=None)
    states: list[tuple[Any, ...]] = []
    for lane, controller in zip(lanes, controllers, strict=True):
        assert lane.controller is controller
        states.append((lane.budget, lane.cost_cap, lane.wait_ms, len(lane.efficiency), controller.snapshot()))
    assert states[0] == states[1]
    assert states[0][4]["starvation_streak"] == 2
    for lane in lanes:
        await lane.close(0.5)


# -- metrics: adaptive p50 and starvation resets ------------------------------------------------------------


def metrics_in(registry: Registry) -> Callable[[], LaneMetrics]:
    catalog = ModelCatalog(["m"])
    return lambda: LaneMetrics(registry, catalog, QueueDepth(registry, catalog, QUEUE_DEPTH), "m")


async def test_the_adaptive_p50_gauges_record_observed_and_target() -> None:
    """The controller's state is read when a snapshot is taken (what every exporter and `top` do)."""
    registry = Registry()
    lane = lane_for(Executor(latency_ms=20.0), env=TARGET_ENV, metrics=metrics_in(registry))
    observed, target = (*MODEL_ATTRS, ("kind", "observed")), (*MODEL_ATTRS, ("kind", "target"))
    await serve_one_at_a_time(lane, 1, 9)
    registry.snapshot()
    assert registry.value(ADAPTIVE_P50, target) == 0.05  # seconds
    assert (ADAPTIVE_P50, observed) not in {(i.name, i.attrs) for i in registry}  # no p50 before 10 samples
    assert registry.value(ADAPTIVE_WAIT, MODEL_ATTRS) == lane.wait_ms / 1000.0
    assert registry.value(ADAPTIVE_COST, MODEL_ATTRS) == lane.cost_cap
    await serve_one_at_a_time(lane, 1, 1)
    assert registry.value(ADAPTIVE_P50, observed) == 0  # not read yet
    registry.snapshot()
    assert registry.value(ADAPTIVE_P50, observed) == 0.02
    await lane.close(0.5)


async def test_a_starvation_reset_through_a_lane_is_counted() -> None:
    """Both knobs at their floors (min cost raised to the initial 16384; min wait 15 = initial) and
    single-item batches slower than target: the 20th primary recovers (wait 15, cost 4 x 16384),
    the recovery reaches the formers and `starvation.resets` counts it."""
    registry = Registry()
    env = {**TARGET_ENV, "SIE_ADAPTIVE_BATCH_MIN_COST": "16384"}
    lane = lane_for(Executor(latency_ms=100.0), env=env, metrics=metrics_in(registry))
    await serve_one_at_a_time(lane, 1, 19)
    registry.snapshot()
    assert registry.value(STARVATION_RESETS, MODEL_ATTRS) == 0
    assert lane.cost_cap == 16384
    await serve_one_at_a_time(lane, 1, 1)
    assert lane.controller.starvation_resets == 1
    registry.snapshot()
    assert registry.value(STARVATION_RESETS, MODEL_ATTRS) == 1
    registry.snapshot()  # counted once, however often it is read
    assert registry.value(STARVATION_RESETS, MODEL_ATTRS) == 1
    assert (lane.cost_cap, lane.wait_ms) == (65_536, 15.0)
    assert lane.scheduler._formers[("encode", "")].max_batch_cost == 65_536
    await lane.close(0.5)
