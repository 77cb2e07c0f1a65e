# SPDX-License-Identifier: Apache-2.0
"""A model's lane: per-model cost budgets (scheduler-and-prep §3.7, newer than v0.7.1) and the one-way
feedback loop (an executed batch's report steps the lane's own controller and formers)."""

from __future__ import annotations

import asyncio
import time

from sie_sidecar.sched.lane import BatchReport, LaneSettings, ModelLane
from sie_sidecar.sched.scheduler import Formed, SchedulerConfig


async def _never(formed: Formed[str]) -> BatchReport | None:
    raise AssertionError("nothing is executed in this test")


async def test_a_reported_budget_rebases_the_controller_and_the_formers() -> None:
    lane: ModelLane[str] = ModelLane("m", _never, LaneSettings())
    assert (lane.budget, lane.cost_cap) == (16384, 16384)
    lane.scheduler.submit("extract", "", ["x"], [1])  # a live former gets the cap too
    lane.describe(max_concurrent_dispatch=None, max_batch_tokens=720_000)
    assert lane.budget == 720_000
    assert lane.cost_cap == 720_000 == lane.controller.current_batch_cost
    snapshot = lane.controller.config
    assert (snapshot["min_batch_cost"], snapshot["max_batch_cost"]) == (180_000, 2_880_000)  # §4.2 table
    former = lane.scheduler._formers[("extract", "")]
    assert former.max_batch_cost == 720_000
    lane.describe(max_concurrent_dispatch=None, max_batch_tokens=720_000)  # the same budget again: no-op
    assert lane.controller.config == snapshot
    await lane.close(0.5)


async def test_a_pinned_cost_ignores_reported_budgets() -> None:
    lane: ModelLane[str] = ModelLane("m", _never, LaneSettings(cost_pinned=True))
    lane.describe(max_concurrent_dispatch=None, max_batch_tokens=720_000)
    assert (lane.budget, lane.cost_cap) == (16384, 16384)
    await lane.close(0.5)


async def test_reports_feed_the_lanes_own_controller() -> None:
    """The executor only reports; calibration samples reach the controller without any call back."""
    executed: list[int] = []

    async def execute(formed: Formed[str]) -> BatchReport | None:
        executed.append(len(formed.items))
        return BatchReport(inference_ms=4.0, elapsed_ms=5.0, finished=time.monotonic(), success_latencies_ms=[6.0])

    config = SchedulerConfig(max_batch_requests=1, max_batch_wait_ms=0.0)
    lane: ModelLane[str] = ModelLane("m", execute, LaneSettings(scheduler=config, wave_cadence=False))
    assert not lane.controller.calibrated
    for i in range(12):
        lane.scheduler.submit("encode", "", [f"x{i}"], [1])
    async with asyncio.timeout(10):
        while sum(executed) < 12 or not lane.scheduler.idle():
            await asyncio.sleep(0.005)
    assert lane.controller.calibrated  # 10 inference samples calibrate it (§4.3)
    assert len(lane.latency) == 12
    await lane.close(0.5)


async def test_an_all_error_batch_feeds_nothing() -> None:
    async def execute(formed: Formed[str]) -> BatchReport | None:
        return BatchReport(inference_ms=4.0, elapsed_ms=5.0, finished=time.monotonic())

    lane: ModelLane[str] = ModelLane("m", execute, LaneSettings(scheduler=SchedulerConfig(max_batch_wait_ms=0.0)))
    lane.scheduler.submit("encode", "", ["a"], [1])
    async with asyncio.timeout(10):
        while not lane.scheduler.idle():
            await asyncio.sleep(0.005)
    assert len(lane.latency) == 0
    await lane.close(0.5)
