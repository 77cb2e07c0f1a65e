# SPDX-License-Identifier: Apache-2.0
"""Per-model cost budgets (scheduler-and-prep §3.7, newer than v0.7.1): a reported max_batch_tokens
re-bases the model's controller and formers; the same budget again is a no-op."""

from __future__ import annotations

from typing import Any

from sie_sidecar.dispatcher import Dispatcher, DispatchSettings


def dispatcher(**kw: Any) -> Dispatcher:
    # Backend, publisher and settler are never touched by budget adoption.
    return Dispatcher(DispatchSettings(worker_id="w", **kw), None, None, None)  # type: ignore[arg-type]


async def test_a_reported_budget_rebases_the_controller_and_the_formers() -> None:
    d = dispatcher()
    lane = d._lane("m")
    assert (lane.budget, lane.cost_cap) == (16384, 16384)
    lane.scheduler.submit("extract", "", ["x"], [1])  # type: ignore[list-item]  # a live former gets the cap too
    d._adopt_budget("m", lane, 720_000)
    assert lane.budget == 720_000
    assert lane.cost_cap == 720_000 == lane.controller.current_batch_cost
    snapshot = lane.controller.config
    assert (snapshot["min_batch_cost"], snapshot["max_batch_cost"]) == (180_000, 2_880_000)  # §4.2 table
    former = lane.scheduler._formers[("extract", "")]
    assert former.max_batch_cost == 720_000
    await lane.scheduler.close(0.5)
