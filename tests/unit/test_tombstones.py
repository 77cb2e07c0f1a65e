# SPDX-License-Identifier: Apache-2.0
"""Cancellation tombstones: the behaviour vectors of test-vectors §9, edge cases and a reference model."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie_sidecar.wire.limits import BATCH_TOMBSTONE_TTL_S, TOMBSTONE_CAPACITY, TOMBSTONE_TTL_S

fixture_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


class FakeClock:
    """Injectable monotonic clock: tests move `now` instead of sleeping."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------------------- §9 behaviour vectors


def _vector_ttl_zero(impl: ModuleType) -> None:
    clock = FakeClock()
    tombs = impl.TombstoneSet(ttl_s=0.0, clock=clock)
    tombs.record("gw", "req-expired")
    assert not tombs.is_cancelled("gw", "req-expired")


def _vector_namespaced_by_router(impl: ModuleType) -> None:
    clock = FakeClock()
    tombs = impl.TombstoneSet(ttl_s=1.0, clock=clock)
    tombs.record("gw-a", "req-1")
    assert tombs.is_cancelled("gw-a", "req-1")
    assert not tombs.is_cancelled("gw-b", "req-1")


def _vector_capacity_evicts_oldest(impl: ModuleType) -> None:
    clock = FakeClock()
    tombs = impl.TombstoneSet(capacity=2, clock=clock)
    for request_id in ("req-1", "req-2", "req-3"):
        clock.now += 0.001
        tombs.record("gw", request_id)
    assert len(tombs) == 2
    assert tombs.is_cancelled("gw", "req-3")
    assert tombs.is_cancelled("gw", "req-2")
    assert not tombs.is_cancelled("gw", "req-1")


def _vector_refresh_moves_to_young_end(impl: ModuleType) -> None:
    clock = FakeClock()
    tombs = impl.TombstoneSet(capacity=2, clock=clock)
    for request_id in ("req-1", "req-2", "req-1", "req-3"):
        clock.now += 0.001
        tombs.record("gw", request_id)
    assert tombs.is_cancelled("gw", "req-1")
    assert tombs.is_cancelled("gw", "req-3")
    assert not tombs.is_cancelled("gw", "req-2")
    assert len(tombs) == 2


def _vector_refresh_stays_bounded(impl: ModuleType) -> None:
    clock = FakeClock()
    tombs = impl.TombstoneSet(capacity=2, clock=clock)
    for _ in range(100):
        clock.now += 0.001
        tombs.record("gw", "req-1")
    assert len(tombs) == 1
    assert tombs.is_cancelled("gw", "req-1")


def _vector_capacity_zero_retains_nothing(impl: ModuleType) -> None:
    clock = FakeClock()
    tombs = impl.TombstoneSet(capacity=0, clock=clock)
    tombs.record("gw", "req-1")
    assert len(tombs) == 0
    assert not tombs.is_cancelled("gw", "req-1")


def _vector_batch_direct(impl: ModuleType) -> None:
    clock = FakeClock()
    batch = impl.BatchTombstones(clock=clock)
    batch.record("req-1")
    assert batch.is_cancelled("req-1")
    assert not batch.is_cancelled("req-2")
    clock.now += 119.999
    assert batch.is_cancelled("req-1")
    clock.now += 0.001
    assert not batch.is_cancelled("req-1")
    assert len(batch) == 0


VECTORS: dict[str, Callable[[ModuleType], None]] = {
    "ttl0-already-expired": _vector_ttl_zero,
    "namespaced-by-router": _vector_namespaced_by_router,
    "capacity2-evicts-oldest": _vector_capacity_evicts_oldest,
    "capacity2-refresh-moves-young": _vector_refresh_moves_to_young_end,
    "capacity2-refresh-100-bounded": _vector_refresh_stays_bounded,
    "capacity0-retains-nothing": _vector_capacity_zero_retains_nothing,
    "batch-direct-120s": _vector_batch_direct,
}


@pytest.mark.parametrize("vector", list(VECTORS))
def test_tombstone_behaviour_vector(impl: ModuleType, vector: str) -> None:
    VECTORS[vector](impl)


# ------------------------------------------------------------------------------------------ edge cases


def test_defaults_match_limits(impl: ModuleType) -> None:
    clock = FakeClock()
    tombs = impl.TombstoneSet(clock=clock)
    tombs.record("gw", "r")
    clock.now += TOMBSTONE_TTL_S - 0.5
    assert tombs.is_cancelled("gw", "r")
    clock.now += 0.5
    assert not tombs.is_cancelled("gw", "r")
    batch = impl.BatchTombstones(clock=clock)
    batch.record("r")
    clock.now += BATCH_TOMBSTONE_TTL_S
    assert not batch.is_cancelled("r")
    assert TOMBSTONE_CAPACITY == 100_000


def test_default_capacity_is_production_capacity(impl: ModuleType) -> None:
    clock = FakeClock()
    tombs = impl.TombstoneSet(clock=clock)
    for i in range(TOMBSTONE_CAPACITY + 5):
        tombs.record("gw", str(i))
    assert len(tombs) == TOMBSTONE_CAPACITY
    assert not tombs.is_cancelled("gw", "4")
    assert tombs.is_cancelled("gw", "5")


def test_expiry_is_exclusive_at_ttl(impl: ModuleType) -> None:
    clock = FakeClock()
    tombs = impl.TombstoneSet(ttl_s=10.0, clock=clock)
    tombs.record("gw", "r")
    clock.now += 9.5
    assert tombs.is_cancelled("gw", "r")
    clock.now += 0.5
    assert not tombs.is_cancelled("gw", "r")


def test_expired_entry_is_dropped_on_lookup(impl: ModuleType) -> None:
    clock = FakeClock()
    tombs = impl.TombstoneSet(ttl_s=10.0, clock=clock)
    tombs.record("gw", "r")
    clock.now += 11.0
    assert len(tombs) == 1  # lazy: still stored
    assert not tombs.is_cancelled("gw", "r")
    assert len(tombs) == 0


def test_record_drops_expired_from_the_old_end(impl: ModuleType) -> None:
    clock = FakeClock()
    tombs = impl.TombstoneSet(ttl_s=10.0, clock=clock)
    tombs.record("gw", "old-1")
    tombs.record("gw", "old-2")
    clock.now += 5.0
    tombs.record("gw", "young")
    clock.now += 6.0
    tombs.record("gw", "new")
    assert len(tombs) == 2
    assert tombs.is_cancelled("gw", "young")
    assert tombs.is_cancelled("gw", "new")


def test_refresh_restamps_expiry(impl: ModuleType) -> None:
    clock = FakeClock()
    tombs = impl.TombstoneSet(ttl_s=10.0, clock=clock)
    tombs.record("gw", "r")
    clock.now += 8.0
    tombs.record("gw", "r")
    clock.now += 8.0
    assert tombs.is_cancelled("gw", "r")


def test_batch_refresh_restamps_and_prunes_each_operation(impl: ModuleType) -> None:
    clock = FakeClock()
    batch = impl.BatchTombstones(ttl_s=10.0, clock=clock)
    batch.record("a")
    batch.record("b")
    clock.now += 8.0
    batch.record("a")
    clock.now += 4.0
    assert len(batch) == 1  # b expired and pruned, a re-stamped
    assert batch.is_cancelled("a")
    assert not batch.is_cancelled("b")


def test_batch_ttl_zero_never_cancels(impl: ModuleType) -> None:
    clock = FakeClock()
    batch = impl.BatchTombstones(ttl_s=0.0, clock=clock)
    batch.record("a")
    assert not batch.is_cancelled("a")


def test_wall_clock_default(impl: ModuleType) -> None:
    tombs = impl.TombstoneSet()
    tombs.record("gw", "r")
    assert tombs.is_cancelled("gw", "r")
    assert not impl.TombstoneSet(ttl_s=0.0).is_cancelled("gw", "r")
    expired = impl.TombstoneSet(ttl_s=0.0)
    expired.record("gw", "r")
    assert not expired.is_cancelled("gw", "r")
    batch = impl.BatchTombstones()
    batch.record("r")
    assert batch.is_cancelled("r")
    assert len(batch) == 1


@pytest.mark.parametrize("kwargs", [{"capacity": -1}, {"ttl_s": -1.0}, {"ttl_s": float("nan")}])
def test_bad_arguments_are_rejected(impl: ModuleType, kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        impl.TombstoneSet(**kwargs)


def test_bad_batch_ttl_is_rejected(impl: ModuleType) -> None:
    with pytest.raises(ValueError):
        impl.BatchTombstones(ttl_s=-0.5)


# ------------------------------------------------------------------------------------- reference model


class ReferenceTombstones:
    """The simplest correct model: an ordered list of (key, expiry), oldest first."""

    def __init__(self, capacity: int, ttl: float) -> None:
        self.capacity = capacity
        self.ttl = ttl
        self.entries: list[tuple[tuple[str, str], float]] = []

    def record(self, key: tuple[str, str], now: float) -> None:
        if self.capacity == 0:
            return
        while self.entries and self.entries[0][1] <= now:
            self.entries.pop(0)
        self.entries = [entry for entry in self.entries if entry[0] != key]
        self.entries.append((key, now + self.ttl))
        del self.entries[: max(0, len(self.entries) - self.capacity)]

    def is_cancelled(self, key: tuple[str, str], now: float) -> bool:
        for index, (stored, expiry) in enumerate(self.entries):
            if stored == key:
                if now < expiry:
                    return True
                del self.entries[index]
                return False
        return False


keys = st.tuples(st.sampled_from(["gw-a", "gw-b"]), st.sampled_from(["r1", "r2", "r3", "r4", "r5", "r.6"]))
operations = st.lists(
    st.one_of(
        st.tuples(st.just("record"), keys),
        st.tuples(st.just("check"), keys),
        st.tuples(st.just("advance"), st.sampled_from([0.0, 0.5, 1.0, 3.0, 7.0])),
    ),
    max_size=60,
)


@fixture_ok
@given(capacity=st.integers(0, 6), ttl=st.sampled_from([0.0, 1.0, 5.0, 10.0]), ops=operations)
def test_tombstone_set_matches_reference_model(
    impl: ModuleType, capacity: int, ttl: float, ops: list[tuple[str, object]]
) -> None:
    clock = FakeClock()
    tombs = impl.TombstoneSet(capacity=capacity, ttl_s=ttl, clock=clock)
    model = ReferenceTombstones(capacity, ttl)
    for op, arg in ops:
        if op == "advance":
            assert isinstance(arg, float)
            clock.now += arg
        elif op == "record":
            assert isinstance(arg, tuple)
            tombs.record(*arg)
            model.record(arg, clock.now)
        else:
            assert isinstance(arg, tuple)
            assert tombs.is_cancelled(*arg) == model.is_cancelled(arg, clock.now)
        assert len(tombs) == len(model.entries) <= capacity


@fixture_ok
@given(
    ttl=st.sampled_from([0.0, 1.0, 5.0]),
    ops=st.lists(
        st.one_of(
            st.tuples(st.sampled_from(["record", "check"]), st.sampled_from(["r1", "r2", "r3"])),
            st.tuples(st.just("advance"), st.sampled_from([0.0, 0.5, 1.0, 3.0])),
        ),
        max_size=40,
    ),
)
def test_batch_tombstones_match_reference_model(impl: ModuleType, ttl: float, ops: list[tuple[str, object]]) -> None:
    clock = FakeClock()
    batch = impl.BatchTombstones(ttl_s=ttl, clock=clock)
    recorded: dict[str, float] = {}
    for op, arg in ops:
        if op == "advance":
            assert isinstance(arg, float)
            clock.now += arg
            continue
        assert isinstance(arg, str)
        if op == "record":
            batch.record(arg)
            recorded[arg] = clock.now + ttl
        else:
            assert batch.is_cancelled(arg) == (clock.now < recorded.get(arg, float("-inf")))
        assert len(batch) == sum(1 for expiry in recorded.values() if clock.now < expiry)
