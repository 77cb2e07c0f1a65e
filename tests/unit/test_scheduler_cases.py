# SPDX-License-Identifier: Apache-2.0
"""Scheduler test cases of scheduler-and-prep §10 (cases 2, 13, 16, 17, 22-24, 26, 27, 33, 55) and the
§3.7 registry example, on the native former and its pure-Python twin, and on the scheduler and lane
built on them. Times are injected: nothing here depends on how fast the host runs."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sie_sidecar import _native as native_mod
from sie_sidecar._twins import batcher as _batcher_py
from sie_sidecar.pipeline.dispatcher import Dispatcher, DispatchSettings
from sie_sidecar.sched.lane import BatchReport, LaneSettings, ModelLane
from sie_sidecar.sched.scheduler import Formed, ModelScheduler, SchedulerConfig

IMPLS = {"native": native_mod, "py": _batcher_py}
BOTH = [native_mod, _batcher_py]
AUDIO_HARD_CAP = 720_000  # ms: prepared-audio extract items (§2.3)


@pytest.fixture(params=sorted(IMPLS))
def mod(request: pytest.FixtureRequest) -> ModuleType:
    return IMPLS[str(request.param)]


def ticking_clock(step_s: float = 0.001) -> Callable[[], float]:
    """A monotonic clock that advances `step_s` per reading: every submit gets its own arrival time."""
    ticks = itertools.count()
    return lambda: next(ticks) * step_s


# -- case 2: effective coalesce ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("coalesce_ms", "wait_ms", "ratio", "expected"),
    [(15.0, 10.0, 0.5, 5.0), (2.0, 100.0, 0.5, 2.0), (15.0, 4.0, 0.5, 2.0)],
)
def test_case_2_effective_coalesce_both_directions(
    mod: ModuleType, coalesce_ms: float, wait_ms: float, ratio: float, expected: float
) -> None:
    """`min(ceiling, wait x ratio)`: the ratio binds (5, 2) or the ceiling does (2); the coalesce
    trigger fires at that window and not before."""
    b = mod.Batcher(max_batch_wait_ms=wait_ms, coalesce_ms=coalesce_ms, coalesce_ratio=ratio)
    assert b.effective_coalesce_ms == expected
    b.submit_many([1], [1], 0.0)
    assert b.time_until_next_trigger_ms(0.0) == expected
    assert b.flush_reason((expected - 0.5) / 1000.0, False) is None
    assert b.flush_reason(expected / 1000.0, False) == "coalesce"


def test_case_2_the_window_follows_the_adaptive_wait(mod: ModuleType) -> None:
    """The controller moves the wait; the coalesce window is derived from it, not stored."""
    b = mod.Batcher(max_batch_wait_ms=15.0, coalesce_ms=5.0, coalesce_ratio=0.5)
    b.update_limits(16384, 4.0, 0.0)
    assert b.effective_coalesce_ms == 2.0
    b.update_limits(16384, 40.0, 0.0)
    assert b.effective_coalesce_ms == 5.0


# -- case 13: a wait too large for a duration -----------------------------------------------------------

HUGE_MS = 1e300


def test_case_13_a_1e300_ms_window_never_fires(mod: ModuleType) -> None:
    """Rust saturates such a wait to "forever" (None); here waits are float ms, so the former reports
    the (finite) remaining time, which no clock reaches: nothing fires without a cap or the bypass."""
    b = mod.Batcher(max_batch_wait_ms=HUGE_MS, coalesce_ms=HUGE_MS, coalesce_ratio=1.0)
    b.submit_many([1], [1], 0.0)
    for now in (0.0, 3600.0, 1e9):
        remaining = b.time_until_next_trigger_ms(now)
        assert remaining is not None and remaining >= HUGE_MS * 0.999
        assert not math.isinf(remaining)
        assert b.flush_reason(now, False) is None
    assert b.flush_reason(1e9, True) == "idle_bypass"
    assert b.update_limits(1, HUGE_MS, 1e9) is True  # a cap still fires at once


async def test_case_13_the_scheduler_waits_on_a_1e300_ms_window_until_news() -> None:
    """The drain loop turns the remaining time into a timer of ~1e297 s: it neither raises nor fires,
    and the loop wakes only for news (here the cost cap)."""
    batches: list[Formed[str]] = []

    async def dispatch(formed: Formed[str]) -> float | None:
        batches.append(formed)
        return None

    config = SchedulerConfig(
        idle_bypass=False, max_batch_wait_ms=HUGE_MS, coalesce_ms=HUGE_MS, coalesce_ratio=1.0, max_batch_cost=10
    )
    scheduler: ModelScheduler[str] = ModelScheduler("m", dispatch, config)
    scheduler.submit("encode", "", ["a"], [1])
    for _ in range(20):
        await asyncio.sleep(0)
    assert batches == [] and scheduler._loop_task is not None and not scheduler._loop_task.done()
    scheduler.submit("encode", "", ["b"], [9])
    async with asyncio.timeout(5):
        while not batches:
            await asyncio.sleep(0.001)
    assert [(b.items, b.reason) for b in batches] == [(["a", "b"], "cost_cap")]
    await scheduler.close(0.5)


# -- cases 16, 17: bounded drains ---------------------------------------------------------------------------


def test_case_16_bounded_drain(mod: ModuleType) -> None:
    b = mod.Batcher()
    assert b.try_drain_up_to(0) is None and b.try_drain_up_to(3) is None  # empty
    b.submit_many([0, 1, 2, 3, 4], [1] * 5, 0.0)
    assert b.try_drain_up_to(0) is None
    assert len(b) == 5
    first, second = b.try_drain_up_to(2), b.try_drain_up_to(2)
    assert (first.ids, first.total_cost, first.reason) == ([0, 1], 2, "drain")
    assert (second.ids, second.total_cost, second.reason) == ([2, 3], 2, "drain")
    assert (len(b), b.total_cost) == (1, 1)


def test_case_17_bounded_drain_counts_items_not_cohorts(mod: ModuleType) -> None:
    """A drain of one takes the cheap later item before the expensive older one (cost order), and
    one item out of a cohort submitted together; the older item stays the FCFS head."""
    b = mod.Batcher()
    b.submit_many([1], [900], 0.0)  # expensive, older
    b.submit_many([2, 3, 4], [5, 6, 7], 0.001)  # one cohort
    drained = b.try_drain_up_to(1)
    assert (drained.ids, drained.total_cost) == ([2], 5)
    assert b.head_arrival == 0.0  # still visible to FCFS
    assert b.try_drain_up_to(2).ids == [3, 4]
    assert b.head_arrival == 0.0
    assert b.try_drain_up_to(5).ids == [1]
    assert b.head_arrival is None


# -- cases 22-24, 27: runs-alone lanes (newer than v0.7.1) ----------------------------------------------------


def submit(b: Any, item: int, cost: int, at: float, *, alone: bool) -> None:
    b.submit_many([item], [cost], at, [AUDIO_HARD_CAP], [alone])


@pytest.mark.parametrize("long_first", [True, False])
def test_case_22_the_first_batch_comes_from_the_lane_of_the_oldest_request(mod: ModuleType, long_first: bool) -> None:
    b = mod.Batcher(max_batch_cost=AUDIO_HARD_CAP)
    clips_at, long_at = (0.002, 0.001) if long_first else (0.001, 0.002)
    submit(b, 1, 240_000, long_at, alone=True)
    submit(b, 2, 5_000, clips_at, alone=False)
    submit(b, 3, 8_000, clips_at, alone=False)
    batches = [b.try_get_batch(1.0, False).ids for _ in range(2)]
    assert batches == ([[1], [2, 3]] if long_first else [[2, 3], [1]])


def test_case_23_the_lanes_alternate_while_both_are_pending(mod: ModuleType) -> None:
    b = mod.Batcher(max_batch_cost=AUDIO_HARD_CAP, max_batch_requests=2)
    for i in range(6):
        submit(b, i, 5_000 + i, 0.0, alone=False)
    submit(b, 10, 300_000, 0.001, alone=True)
    submit(b, 11, 250_000, 0.002, alone=True)
    formed = [b.try_drain_up_to(100).ids for _ in range(5)]
    assert formed == [[0, 1], [10], [2, 3], [11], [4, 5]]
    assert len(b) == 0 and b.total_cost == 0


@dataclass
class LaneRun:
    """A stream of steps; each submits clips (and maybe a long item) and then forms one batch."""

    steps: list[tuple[list[int], bool]]  # (clip costs, a long item arrives)
    served: list[list[int]] = field(default_factory=list)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.lists(st.integers(1_000, 15_000), min_size=1, max_size=4), st.booleans()),
        min_size=1,
        max_size=40,
    ),
    requests=st.integers(1, 12),
)
def test_case_24_a_long_item_waits_at_most_one_clip_batch_per_flagged_item_ahead(
    steps: list[tuple[list[int], bool]], requests: int
) -> None:
    """Continuous clip traffic (new clips before every batch): a long item sees at most k + 1 clip
    batches before its own, k being the long items pending ahead of it when it arrived (the lanes
    take turns, so each of those and the long item itself follows at most one clip batch)."""
    for impl in BOTH:
        b = impl.Batcher(max_batch_cost=AUDIO_HARD_CAP, max_batch_requests=requests)
        ids = itertools.count()
        longs: set[int] = set()
        ahead: dict[int, int] = {}  # long item -> long items pending when it arrived
        clip_batches_seen: dict[int, int] = {}
        pending_longs: list[int] = []
        for n, (clips, long_arrives) in enumerate(steps):
            at = n * 0.001
            for cost in clips:
                submit(b, next(ids), cost, at, alone=False)
            if long_arrives:
                long_id = next(ids)
                longs.add(long_id)
                ahead[long_id] = len(pending_longs)
                clip_batches_seen[long_id] = 0
                pending_longs.append(long_id)
                submit(b, long_id, 600_000, at, alone=True)
            batch = b.try_drain_up_to(1000).ids
            if longs & set(batch):
                assert batch == [pending_longs.pop(0)]  # alone, and in arrival order
            else:
                for waiting in pending_longs:
                    clip_batches_seen[waiting] += 1
        while pending_longs:  # traffic stops: what is left still alternates
            batch = b.try_drain_up_to(1000).ids
            if longs & set(batch):
                assert batch == [pending_longs.pop(0)]
            else:
                for waiting in pending_longs:
                    clip_batches_seen[waiting] += 1
        for long_id, seen in clip_batches_seen.items():
            assert seen <= ahead[long_id] + 1, (impl.__name__, long_id, seen, ahead[long_id])


def test_case_24_the_bound_is_reached(mod: ModuleType) -> None:
    """The bound is tight: behind one flagged item, a long item sees two clip batches (the clips'
    lane had the first turn, and takes one more between the two long items)."""
    b = mod.Batcher(max_batch_cost=AUDIO_HARD_CAP, max_batch_requests=1)
    submit(b, 0, 5_000, 0.0, alone=False)  # clips are older: their lane goes first
    submit(b, 1, 600_000, 0.001, alone=True)
    submit(b, 2, 600_000, 0.001, alone=True)
    order = []
    for n in range(5):
        submit(b, 100 + n, 5_000, 0.002 + n * 0.001, alone=False)  # continuous clip traffic
        order.append(b.try_drain_up_to(100).ids)
    assert order == [[0], [1], [100], [2], [101]]


def test_case_27_a_runs_alone_batch_keeps_its_reason_and_reanchors_the_timers(mod: ModuleType) -> None:
    """The long item (t0) and a clip (t0 + 10 ms) trip the cost cap; the long item goes alone under
    `cost_cap`; the clip's timers restart from its own arrival, so it waits its full window."""
    b = mod.Batcher(max_batch_wait_ms=15.0, coalesce_ms=15.0, coalesce_ratio=1.0)  # cost cap 16384
    submit(b, 1, 240_000, 0.000, alone=True)
    submit(b, 2, 5_000, 0.010, alone=False)
    batch = b.try_get_batch(0.010, False)
    assert (batch.ids, batch.reason) == ([1], "cost_cap")
    assert b.head_arrival == 0.010
    assert b.time_until_next_trigger_ms(0.010) == 15.0  # 5 ms if anchored to the long item
    assert b.flush_reason(0.016, False) is None  # 16 ms after the long item: would be a timeout
    assert b.flush_reason(0.02499, False) is None
    assert b.flush_reason(0.0251, False) == "timeout"


# -- case 26: with nothing flagged, the plain algorithm -------------------------------------------------------


class PlainPacker:
    """§3.5 packing without lanes, written from the spec: stable cost sort, then the longest prefix
    within the effective cost cap (the batch cap and every pending item's hard cap), the count cap
    and `max_items`; at least one item."""

    def __init__(self, max_batch_cost: int, max_batch_requests: int) -> None:
        self.max_batch_cost = max_batch_cost
        self.max_batch_requests = max_batch_requests
        self.pending: list[tuple[int, int, int | None]] = []  # (id, cost, hard cap)

    def submit(self, ids: list[int], costs: list[int], caps: list[int | None]) -> None:
        self.pending += zip(ids, costs, caps, strict=True)

    def extract(self, max_items: int | None) -> tuple[list[int], int] | None:
        if not self.pending or max_items == 0:
            return None
        self.pending.sort(key=lambda p: p[1])
        cap = min([self.max_batch_cost, *(p[2] for p in self.pending if p[2] is not None)])
        taken: list[tuple[int, int, int | None]] = []
        for p in self.pending:
            if max_items is not None and len(taken) >= max_items:
                break
            if taken and sum(t[1] for t in taken) + p[1] > cap:
                break
            taken.append(p)
            if len(taken) >= self.max_batch_requests:
                break
        del self.pending[: len(taken)]
        return [t[0] for t in taken], sum(t[1] for t in taken)


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.lists(st.tuples(st.integers(1, 3000), st.one_of(st.none(), st.integers(50, 6000))), min_size=1),
        ),
        st.tuples(st.just("get"), st.none()),
        st.tuples(st.just("drain"), st.integers(0, 15)),
    ),
    max_size=50,
)


@settings(max_examples=150, deadline=None)
@given(cost_cap=st.integers(1, 8000), requests=st.integers(1, 16), steps=ops)
def test_case_26_with_nothing_flagged_packing_is_the_plain_algorithm(
    cost_cap: int, requests: int, steps: list[tuple[str, Any]]
) -> None:
    """Random caps (hard caps included), bounded drains and flushes; items explicitly flagged
    `alone=False`: every batch, its cost and what stays pending match the reference packer."""
    for impl in BOTH:
        b = impl.Batcher(max_batch_cost=cost_cap, max_batch_requests=requests)
        plain = PlainPacker(cost_cap, requests)
        ids = itertools.count()
        for n, (op, arg) in enumerate(steps):
            now = n * 0.001
            if op == "submit":
                new = [next(ids) for _ in arg]
                costs, caps = [c for c, _ in arg], [h for _, h in arg]
                b.submit_many(new, costs, now, caps, [False] * len(new))
                plain.submit(new, costs, caps)
                continue
            got = b.try_get_batch(now, True) if op == "get" else b.try_drain_up_to(arg)
            expected = plain.extract(None if op == "get" else arg)
            assert (None if got is None else (got.ids, got.total_cost)) == expected, impl.__name__
            assert (len(b), b.total_cost) == (len(plain.pending), sum(p[1] for p in plain.pending))


def test_case_26_after_the_last_flagged_item_packing_is_plain_again(mod: ModuleType) -> None:
    """Lane turn-taking leaves no trace once no flagged item is pending."""
    b = mod.Batcher(max_batch_cost=100, max_batch_requests=3)
    b.submit_many([1], [500], 0.0, None, [True])
    b.submit_many([2, 3], [40, 30], 0.001, None, [False, False])
    assert b.try_drain_up_to(10).ids == [1]
    b.submit_many([4, 5, 6, 7], [10, 30, 10, 80], 0.002, None, [False] * 4)
    plain = PlainPacker(100, 3)
    plain.submit([2, 3, 4, 5, 6, 7], [40, 30, 10, 30, 10, 80], [None] * 6)
    while len(b):
        got = b.try_drain_up_to(10)
        assert (got.ids, got.total_cost) == plain.extract(10)


# -- case 33: a bounded same-key drain, then FCFS --------------------------------------------------------------


async def test_case_33_bounded_same_key_drain_then_fcfs() -> None:
    """The wave drains only what was pending for its key when its first continuation slot opened: a
    base item arriving during the wave waits, and the sibling LoRA item that arrived before it goes
    first (FCFS by head arrival, the base head re-anchored to the newer item)."""
    started: list[list[str]] = []
    gate = asyncio.Event()

    async def dispatch(formed: Formed[str]) -> float | None:
        started.append(formed.items)
        await gate.wait()
        return None

    config = SchedulerConfig(pipeline_depth=2, max_batch_requests=1, jit_dispatch=False)
    scheduler: ModelScheduler[str] = ModelScheduler("m", dispatch, config, clock=ticking_clock())
    scheduler.submit("encode", "", ["b0", "b1", "b2"], [1, 1, 1])
    scheduler.submit("encode", "lora-a", ["a0"], [1])
    async with asyncio.timeout(5):
        while len(started) < 2:  # the primary and the first drain hold both slots
            await asyncio.sleep(0)
        scheduler.submit("encode", "", ["late"], [1])  # after the wave was sized (2 drains)
        gate.set()
        while scheduler.pending or scheduler.in_flight:
            await asyncio.sleep(0)
    assert started == [["b0"], ["b1"], ["b2"], ["a0"], ["late"]]
    await scheduler.close(0.5)


# -- §3.7 registry example and case 55 ------------------------------------------------------------------------


def clip_costs() -> list[int]:
    """16 clips of 6.0-7.9 s: any two fit the default 16,384 ms cap, no three do."""
    return [6_000 + 125 * i for i in range(16)]


async def serve_recordings_and_clips(budget: int | None) -> list[list[str]]:
    """Long recording, 16 clips, long recording (in that order) through a lane; the batches in order."""
    started: list[list[str]] = []

    async def execute(formed: Formed[str]) -> BatchReport | None:
        started.append(formed.items)
        return None  # no feedback: the caps stay where the budget put them

    settings_ = LaneSettings(scheduler=SchedulerConfig(jit_dispatch=False))
    lane: ModelLane[str] = ModelLane("whisper", execute, settings_, clock=ticking_clock())
    if budget is not None:
        lane.describe(max_concurrent_dispatch=None, max_batch_tokens=budget)
    submit_ = lane.scheduler.submit
    submit_("extract", "", ["long-1"], [240_000], [AUDIO_HARD_CAP], alone=[True])
    clips = [f"clip-{i}" for i in range(16)]
    submit_("extract", "", clips, clip_costs(), [AUDIO_HARD_CAP] * 16, alone=[False] * 16)
    submit_("extract", "", ["long-2"], [300_000], [AUDIO_HARD_CAP], alone=[True])
    async with asyncio.timeout(5):
        while lane.scheduler.pending or lane.scheduler.in_flight:
            await asyncio.sleep(0)
    await lane.close(0.5)
    return started


async def test_registry_example_the_default_budget_takes_two_clips_a_turn() -> None:
    batches = await serve_recordings_and_clips(None)
    assert batches[0] == ["long-1"] and batches[2] == ["long-2"]
    clip_turns = [b for b in batches if b[0].startswith("clip")]
    assert [len(b) for b in clip_turns] == [2] * 8
    assert batches[1] == ["clip-0", "clip-1"]  # cost order


async def test_registry_example_a_720000_ms_budget_serves_the_clips_in_two_turns() -> None:
    """The model's budget lifts the cost cap to 720,000 ms: the first clip turn stops at the count
    cap (12), the second takes the other four."""
    batches = await serve_recordings_and_clips(720_000)
    assert batches == [["long-1"], [f"clip-{i}" for i in range(12)], ["long-2"], [f"clip-{i}" for i in range(12, 16)]]


class _Unused:
    """Stands in for the backend, publisher and settler: lanes are created without touching them."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"{name} was used")


async def test_case_55_the_registry_returns_the_same_lane_created_once() -> None:
    """One lane (scheduler, controller, drain loop) per model, created on first use and then reused;
    a model never seen has none."""
    unused: Any = _Unused()
    dispatcher = Dispatcher(DispatchSettings(worker_id="w"), unused, unused, unused)
    first = dispatcher._lane("model-a")
    assert dispatcher._lane("model-a") is first
    assert first.scheduler is dispatcher._lane("model-a").scheduler
    other = dispatcher._lane("model-b")
    assert other is not first and other.scheduler is not first.scheduler
    assert dispatcher.model_pressure("never-seen") == (0, 0)
    assert "never-seen" not in dispatcher._models
    first.scheduler.submit("encode", "", [], [])
    assert first.scheduler._loop_task is None  # the drain loop starts with the first item, once
    gate = asyncio.Event()

    async def execute(formed: Formed[Any]) -> BatchReport | None:
        await gate.wait()
        return None

    first._execute = execute
    scheduler: Any = first.scheduler  # its items are deliveries; strings stand in for them here
    scheduler.submit("encode", "", ["x"], [1])
    loop_task = scheduler._loop_task
    assert loop_task is not None
    scheduler.submit("encode", "", ["y"], [1])
    assert scheduler._loop_task is loop_task
    gate.set()
    await first.close(0.5)
    await other.close(0.5)


async def test_a_former_created_after_new_limits_starts_with_them() -> None:
    """§4.6: new batchers copy the caps in force. A (op, LoRA) first seen after the controller (or a
    budget) moved the caps gets the moved caps, not the configured initial ones."""

    async def dispatch(formed: Formed[str]) -> float | None:
        return None

    scheduler: ModelScheduler[str] = ModelScheduler("m", dispatch, SchedulerConfig(idle_bypass=False))
    scheduler.update_limits(720_000, 30.0)
    scheduler.submit("extract", "lora-a", ["x"], [1])
    former = scheduler._formers[("extract", "lora-a")]
    assert (former.max_batch_cost, former.max_batch_wait_ms) == (720_000, 30.0)
    await scheduler.close(0.5)
