# SPDX-License-Identifier: Apache-2.0
"""The device-time estimate behind just-in-time dispatch: the service-time line, the overhead, and
when the next batch is released."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.sched.device_clock import (
    DEFAULT_OVERHEAD_S,
    MARGIN_FRACTION,
    MARGIN_S,
    MIN_SERVICE_SAMPLES,
    DeviceClock,
)


def warm(clock: DeviceClock, *, a_ms: float, b_ms: float, overhead_s: float, costs: list[int]) -> float:
    """Feed batches sent one at a time (each alone) with service a + b x cost; returns the clock time."""
    t = 100.0
    for n, cost in enumerate(costs):
        clock.sent(n, t, cost)
        service_s = (a_ms + b_ms * cost) / 1000.0
        t += overhead_s + service_s
        clock.done(n, t, a_ms + b_ms * cost, alone=True)
        t += 1.0
    return t


def test_no_estimate_before_enough_samples() -> None:
    clock = DeviceClock()
    warm(clock, a_ms=10, b_ms=0, overhead_s=0.002, costs=[5] * (MIN_SERVICE_SAMPLES - 1))
    assert clock.service_s(5) is None
    clock.sent(99, 1000.0, 5)
    assert clock.release_at() is None


def test_nothing_in_flight_means_no_hold() -> None:
    clock = DeviceClock()
    warm(clock, a_ms=10, b_ms=0.1, overhead_s=0.002, costs=list(range(1, 20)))
    assert clock.release_at() is None


def test_one_batch_in_flight_is_released_overhead_and_margin_before_it_ends() -> None:
    clock = DeviceClock()
    warm(clock, a_ms=40, b_ms=0, overhead_s=0.002, costs=[8] * 10)
    clock.sent(50, 1000.0, 8)
    service = 0.040
    expected = 1000.0 + 0.002 + service - 0.002 - MARGIN_S - MARGIN_FRACTION * service
    release = clock.release_at()
    assert release is not None
    assert release == pytest.approx(expected, abs=1e-9)


def test_a_batch_queued_behind_another_is_anchored_on_the_last_completion() -> None:
    clock = DeviceClock()
    t = warm(clock, a_ms=40, b_ms=0, overhead_s=0.002, costs=[8] * 10)
    clock.sent(50, t, 8)
    clock.sent(51, t + 0.005, 8)  # queued: the device is busy with 50
    clock.done(50, t + 0.042, 40.0, alone=True)
    release = clock.release_at()
    assert release is not None
    # 51 ends one service time after 50's completion, not 42 ms after it was sent.
    assert release == pytest.approx(t + 0.042 + 0.040 - 0.002 - MARGIN_S - MARGIN_FRACTION * 0.040, abs=1e-6)


def test_overhead_comes_from_batches_sent_alone() -> None:
    clock = DeviceClock()
    assert clock.overhead_s() == DEFAULT_OVERHEAD_S  # no sample yet
    warm(clock, a_ms=10, b_ms=0, overhead_s=0.003, costs=[1] * 3)
    assert clock.overhead_s() == pytest.approx(0.003)


def test_a_batch_that_queued_behind_another_says_nothing_of_the_overhead() -> None:
    clock = DeviceClock()
    t = warm(clock, a_ms=10, b_ms=0, overhead_s=0.003, costs=[1] * 3)
    clock.sent(100, t, 1)
    clock.sent(101, t + 0.001, 1)
    clock.done(100, t + 0.013, 10.0, alone=True)
    clock.done(101, t + 0.023, 10.0, alone=False)  # exactly one service time after 100: it waited in the queue
    assert clock.overhead_s() == pytest.approx(0.003)


def test_a_queued_batch_that_looks_late_does_not_ratchet_the_overhead() -> None:
    """Timer noise makes a queued batch come back a little after the one ahead plus its service time;
    taking its round trip as overhead would count its queue wait and release every batch earlier."""
    clock = DeviceClock()
    t = warm(clock, a_ms=10, b_ms=0, overhead_s=0.001, costs=[1] * 3)
    for n in range(100, 140, 2):
        clock.sent(n, t, 1)
        clock.sent(n + 1, t + 0.002, 1)  # sent early: it queues for ~8 ms
        clock.done(n, t + 0.011, 10.0, alone=True)
        clock.done(n + 1, t + 0.011 + 0.010 + 0.002, 10.0, alone=False)  # 2 ms of noise
        t += 1.0
    assert clock.overhead_s() == pytest.approx(0.001)


@pytest.mark.parametrize("bad", [None, -1.0, math.nan])
def test_a_missing_or_bad_inference_time_teaches_nothing(bad: float | None) -> None:
    clock = DeviceClock()
    for n in range(MIN_SERVICE_SAMPLES + 2):
        clock.sent(n, float(n), 4)
        clock.done(n, n + 0.01, bad, alone=True)
    assert clock.service_s(4) is None
    assert clock.overhead_s() == DEFAULT_OVERHEAD_S


def test_constant_costs_give_the_mean_service_time() -> None:
    clock = DeviceClock()
    warm(clock, a_ms=12, b_ms=0, overhead_s=0.001, costs=[7] * 12)
    assert clock.service_s(7) == pytest.approx(0.012)
    assert clock.service_s(700) == pytest.approx(0.012)  # no slope can be learnt from one cost


@given(
    a_ms=st.floats(0.0, 50.0),
    b_ms=st.floats(0.0, 0.5),
    costs=st.lists(st.integers(1, 5000), min_size=MIN_SERVICE_SAMPLES, max_size=80, unique=True),
)
def test_a_linear_device_is_learnt(a_ms: float, b_ms: float, costs: list[int]) -> None:
    clock = DeviceClock()
    warm(clock, a_ms=a_ms, b_ms=b_ms, overhead_s=0.001, costs=costs)
    for cost in (1, 100, 4000):
        estimate = clock.service_s(cost)
        assert estimate is not None
        assert estimate == pytest.approx((a_ms + b_ms * cost) / 1000.0, rel=1e-6, abs=1e-9)


@given(samples=st.lists(st.tuples(st.integers(0, 10**6), st.floats(0.0, 10_000.0)), min_size=MIN_SERVICE_SAMPLES))
def test_estimates_are_never_negative(samples: list[tuple[int, float]]) -> None:
    clock = DeviceClock()
    for n, (cost, inference_ms) in enumerate(samples):
        clock.sent(n, 0.0, cost)
        clock.done(n, 1.0, inference_ms, alone=True)
    for cost in (0, 1, 10**6):
        estimate = clock.service_s(cost)
        assert estimate is not None
        assert estimate >= 0.0


def test_a_device_faster_than_the_round_trip_is_not_timed() -> None:
    """Service 0.5 ms against 2 ms of IPC: the round trip is mostly overhead, nothing to catch."""
    clock = DeviceClock()
    warm(clock, a_ms=0.5, b_ms=0, overhead_s=0.002, costs=[3] * 10)
    clock.sent(50, 1000.0, 3)
    assert clock.release_at() is None
