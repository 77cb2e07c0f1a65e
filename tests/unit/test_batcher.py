# SPDX-License-Identifier: Apache-2.0
"""The batch former (scheduler-and-prep §3): triggers, packing, caps and timing, native and twin."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar import _native as native_mod
from sie_sidecar._twins import batcher as _batcher_py

IMPLS = {"native": native_mod, "py": _batcher_py}


@pytest.fixture(params=sorted(IMPLS))
def mod(request: pytest.FixtureRequest) -> ModuleType:
    return IMPLS[str(request.param)]


def test_v071_defaults(mod: ModuleType) -> None:
    b = mod.Batcher()
    assert (b.max_batch_cost, b.max_batch_requests, b.max_batch_wait_ms, b.effective_coalesce_ms) == (
        16384,
        12,
        15.0,
        5.0,
    )


def test_triggers_in_evaluation_order(mod: ModuleType) -> None:
    b = mod.Batcher()
    assert b.flush_reason(0.0, True) is None
    assert b.submit_many([1], [100], 0.0) is True  # the first item wakes the consumer
    assert b.flush_reason(0.0, False) is None
    assert b.flush_reason(0.0, True) == "idle_bypass"
    assert b.flush_reason(0.005, False) == "coalesce"
    b.submit_many([2], [100], 0.004)
    assert b.time_until_next_trigger_ms(0.004) == pytest.approx(5.0)
    assert b.flush_reason(0.015, False) == "timeout"
    assert b.submit_many(list(range(3, 13)), [1] * 10, 0.009) is True
    assert b.flush_reason(0.009, False) == "count_cap"
    b.submit_many([13], [20_000], 0.009)
    assert b.flush_reason(0.009, False) == "cost_cap"


def test_a_lone_oversize_item_is_flushed_alone(mod: ModuleType) -> None:
    b = mod.Batcher()
    b.submit_many([7], [50_000], 0.0)
    batch = b.try_get_batch(0.0, False)
    assert (batch.ids, batch.total_cost, batch.reason) == ([7], 50_000, "single_oversize")
    assert len(b) == 0 and b.total_cost == 0 and b.head_arrival is None


def test_packing_is_cost_sorted_fifo_among_equals(mod: ModuleType) -> None:
    b = mod.Batcher(max_batch_cost=10)
    b.submit_many([1, 2, 3, 4], [6, 3, 3, 20], 0.0)
    assert b.try_get_batch(0.0, False).ids == [2, 3]
    assert b.try_drain_up_to(9).ids == [1]
    drained = b.try_drain_up_to(9)
    assert (drained.ids, drained.reason) == ([4], "drain")
    assert b.try_drain_up_to(9) is None


def test_hard_caps_lower_the_whole_queue(mod: ModuleType) -> None:
    b = mod.Batcher()
    b.submit_many([1, 2], [100, 100], 0.0, [150, None])
    assert b.flush_reason(0.0, False) == "cost_cap"
    assert b.try_get_batch(0.0, False).ids == [1]


def test_update_limits_wakes_when_the_queue_becomes_flushable(mod: ModuleType) -> None:
    b = mod.Batcher()
    b.submit_many([1, 2], [300, 300], 0.0)
    assert b.update_limits(500, 15.0, 0.0) is True
    assert b.update_limits(5000, 15.0, 0.0) is False


def test_bad_settings_are_refused(mod: ModuleType) -> None:
    with pytest.raises(ValueError, match="max_batch_requests"):
        mod.Batcher(max_batch_requests=0)
    with pytest.raises(ValueError, match="finite"):
        mod.Batcher(max_batch_wait_ms=float("nan"))
    with pytest.raises(ValueError, match="same length"):
        mod.Batcher().submit_many([1, 2], [1], 0.0)


# -- properties: a simulated consumer over random arrivals --------------------------------------------------

QUANTUM_S = 0.001

configs = st.fixed_dictionaries(
    {
        "max_batch_cost": st.integers(1, 5000),
        "max_batch_requests": st.integers(1, 20),
        "max_batch_wait_ms": st.floats(0.0, 30.0),
        "coalesce_ms": st.floats(0.0, 10.0),
        "coalesce_ratio": st.floats(0.0, 1.0),
    }
)
arrivals = st.lists(
    st.tuples(st.integers(0, 30), st.integers(0, 3000)), max_size=60
)  # (ms after the previous arrival, cost)


def simulate(mod: ModuleType, config: dict[str, Any], events: list[tuple[int, int]], immediate: bool) -> Any:
    """Submit on schedule; poll every quantum like the drain loop; return batches with their flush times."""
    b = mod.Batcher(**config)
    arrival_at: dict[int, float] = {}
    cost_of: dict[int, int] = {}
    t, schedule = 0.0, []
    for i, (gap, cost) in enumerate(events):
        t += gap / 1000.0
        schedule.append((t, i, cost))
    out: list[tuple[float, Any]] = []
    now, k = 0.0, 0
    while k < len(schedule) or len(b):
        while k < len(schedule) and schedule[k][0] <= now:
            _, i, cost = schedule[k]
            b.submit_many([i], [cost], now)
            arrival_at[i], cost_of[i] = now, cost
            k += 1
        batch = b.try_get_batch(now, immediate)
        while batch is not None:
            out.append((now, batch))
            batch = b.try_get_batch(now, False)
        now += QUANTUM_S
    return out, arrival_at, cost_of


@given(config=configs, events=arrivals, immediate=st.booleans())
def test_formed_batches_respect_caps_wait_and_order(
    config: dict[str, Any], events: list[tuple[int, int]], immediate: bool
) -> None:
    out, arrival_at, cost_of = simulate(_batcher_py, config, events, immediate)
    seen: list[int] = []
    for flushed_at, batch in out:
        assert 1 <= len(batch.ids) <= config["max_batch_requests"]
        assert batch.total_cost == sum(cost_of[i] for i in batch.ids)
        if len(batch.ids) > 1:
            assert batch.total_cost <= config["max_batch_cost"]  # over the cap only as a lone item
        costs = [cost_of[i] for i in batch.ids]
        assert costs == sorted(costs)
        for a, c in zip(batch.ids, batch.ids[1:], strict=False):  # FIFO among equal costs
            if cost_of[a] == cost_of[c]:
                assert arrival_at[a] <= arrival_at[c]
        for i in batch.ids:  # nobody waits longer than max wait plus one quantum
            assert (flushed_at - arrival_at[i]) * 1000.0 <= config["max_batch_wait_ms"] + QUANTUM_S * 1000 + 1e-6
        seen += batch.ids
    assert sorted(seen) == list(range(len(events)))  # every item exactly once


@given(config=configs, events=arrivals, immediate=st.booleans())
def test_native_and_twin_form_the_same_batches(
    config: dict[str, Any], events: list[tuple[int, int]], immediate: bool
) -> None:
    native_out = simulate(native_mod, config, events, immediate)[0]
    twin_out = simulate(_batcher_py, config, events, immediate)[0]
    assert [(t, b.ids, b.total_cost, b.reason) for t, b in native_out] == [
        (t, b.ids, b.total_cost, b.reason) for t, b in twin_out
    ]


# -- runs-alone items (scheduler-and-prep §3.5, newer than v0.7.1) ------------------------------------


def test_vector_20_a_long_item_never_shares(mod: ModuleType) -> None:
    """Clip 5 s (t0), long 240 s (t1), clip 8 s (t2) give [clips 5, 8], then [long]."""
    b = mod.Batcher(max_batch_cost=720_000)
    b.submit_many([0], [5_000], 0.0, [720_000], [False])
    b.submit_many([1], [240_000], 0.001, [720_000], [True])
    b.submit_many([2], [8_000], 0.002, [720_000], [False])
    assert b.try_get_batch(1.0, False).ids == [0, 2]
    assert b.try_get_batch(1.0, False).ids == [1]
    assert len(b) == 0


def test_vector_21_alone_items_in_arrival_order_whatever_their_size(mod: ModuleType) -> None:
    b = mod.Batcher()
    b.submit_many([10, 11], [900, 100], 0.0, None, [True, True])
    b.submit_many([12], [50], 0.001, None, [True])
    assert [b.try_get_batch(1.0, False).ids for _ in range(3)] == [[10], [11], [12]]


def simulate_lanes(mod: ModuleType, config: dict[str, Any], events: list[tuple[int, int, bool]]) -> Any:
    b = mod.Batcher(**config)
    out = []
    now = 0.0
    for i, (gap, cost, alone) in enumerate(events):
        now += gap / 1000.0
        b.submit_many([i], [cost], now, None, [alone])
        batch = b.try_get_batch(now, False)
        while batch is not None:
            out.append(batch)
            batch = b.try_get_batch(now, False)
    while len(b):
        out.append(b.try_drain_up_to(1000))
    return out


lane_events = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 3000), st.booleans()), max_size=40)


@given(config=configs, events=lane_events)
def test_runs_alone_items_go_by_themselves_in_arrival_order(
    config: dict[str, Any], events: list[tuple[int, int, bool]]
) -> None:
    """Twin and native form the same batches; an alone item is always a batch of one; alone items
    leave in arrival order; every item leaves exactly once."""
    native_out = simulate_lanes(native_mod, config, events)
    twin_out = simulate_lanes(_batcher_py, config, events)
    assert [(b.ids, b.total_cost, b.reason) for b in native_out] == [(b.ids, b.total_cost, b.reason) for b in twin_out]
    alone = {i for i, (_, _, a) in enumerate(events) if a}
    order = []
    for b in twin_out:
        if alone & set(b.ids):
            assert len(b.ids) == 1
            order.append(b.ids[0])
    assert order == sorted(order)
    assert sorted(i for b in twin_out for i in b.ids) == list(range(len(events)))


def test_the_lanes_take_turns_and_the_oldest_items_lane_goes_first(mod: ModuleType) -> None:
    """§3.5 `order_for_lanes`: with both lanes pending, the first batch comes from the lane of the
    oldest item, then the lanes alternate (batchable by cost, runs-alone by arrival)."""
    b = mod.Batcher()
    b.submit_many([10], [900], 0.0, None, [True])
    b.submit_many([11], [100], 0.001, None, [True])
    b.submit_many([12, 13], [7, 5], 0.002, None, [False, False])
    assert [b.try_get_batch(1.0, False).ids for _ in range(3)] == [[10], [13, 12], [11]]
    b.submit_many([20, 21], [3, 4], 2.0, None, [False, False])
    b.submit_many([22], [1], 2.001, None, [True])
    assert [b.try_get_batch(3.0, False).ids for _ in range(2)] == [[20, 21], [22]]  # batchable is older
