# SPDX-License-Identifier: Apache-2.0
"""The pull quantum's helpers (scheduler-and-prep §4.8, §10 case 57): back-off, adjusting from any
current value, and the floor/ceiling answers for extreme, missing and non-finite inputs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.sched.quantum import MIN_SAMPLES, LatencyWindow, QuantumController


def quantum(target_p50_ms: float = 50.0, samples: list[float] | None = None) -> QuantumController:
    window = LatencyWindow()
    window.extend(samples or [])
    return QuantumController(window, target_p50_ms=target_p50_ms)


def test_back_off_doubles_up_to_the_ceiling() -> None:
    q = quantum()
    steps = [q.min_ms]
    for _ in range(4):
        steps.append(q.back_off_ms(steps[-1]))
    assert steps == [2.0, 4.0, 8.0, 15.0, 15.0]


def test_back_off_never_leaves_the_bounds() -> None:
    q = quantum()
    assert q.back_off_ms(0.0) == 2.0
    assert q.back_off_ms(-3.0) == 2.0
    assert q.back_off_ms(1e300) == 15.0
    assert q.back_off_ms(math.nan) == 2.0


@pytest.mark.parametrize(
    ("current_ms", "p50_ms", "expected"),
    [
        (5.0, 10.0, 13.0),  # 5 + (50 - 10) x 0.2
        (15.0, 100.0, 5.0),  # 15 - (100 - 50) x 0.2
        (15.0, 1e12, 2.0),  # an extreme p50: the floor
        (15.0, math.inf, 2.0),
        (10.0, 0.0, 15.0),  # 10 + 10 would pass the ceiling
        (2.0, 10.0, 10.0),  # from the floor: the loop's own law
    ],
)
def test_adjust_from_a_current_value(current_ms: float, p50_ms: float, expected: float) -> None:
    assert quantum().adjust_ms(current_ms, p50_ms) == pytest.approx(expected)


def test_no_samples_give_the_floor() -> None:
    q = quantum(samples=[1.0] * (MIN_SAMPLES - 1))
    assert q.window.p50() is None
    assert q.adjust_ms(10.0, q.window.p50()) == 2.0
    assert q.quantum_ms() == 2.0


@pytest.mark.parametrize(("target", "expected"), [(math.inf, 15.0), (-math.inf, 2.0), (math.nan, 2.0)])
def test_non_finite_targets(target: float, expected: float) -> None:
    """Newer than v0.7.1: +inf gives the ceiling, -inf and NaN the floor (from the floor and from any
    current value)."""
    q = quantum(target, samples=[10.0] * MIN_SAMPLES)
    assert q.quantum_ms() == expected
    assert q.adjust_ms(8.0, 10.0) == expected


def test_a_nan_p50_gives_the_floor() -> None:
    assert quantum().adjust_ms(8.0, math.nan) == 2.0


def test_the_loop_adjusts_from_the_floor_not_from_its_last_quantum() -> None:
    """The quantum is recomputed from the floor for every batch: it does not accumulate."""
    q = quantum(samples=[10.0] * MIN_SAMPLES)
    assert [q.quantum_ms() for _ in range(3)] == [10.0, 10.0, 10.0]
    assert q.adjust_ms(q.quantum_ms(), 10.0) == 15.0  # what accumulating would have given


@given(
    current=st.floats(allow_nan=True, allow_infinity=True),
    p50=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    target=st.floats(allow_nan=True, allow_infinity=True),
)
def test_adjust_stays_within_bounds(current: float, p50: float | None, target: float) -> None:
    q = quantum(target)
    assert 2.0 <= q.adjust_ms(current, p50) <= 15.0
    assert 2.0 <= q.back_off_ms(current) <= 15.0
