# SPDX-License-Identifier: Apache-2.0
"""The pull-loop quantum controller (scheduler-and-prep §4.8)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar.sched.quantum import MIN_SAMPLES, WINDOW, LatencyWindow, QuantumController


def controller(samples: list[float], **kw: Any) -> QuantumController:
    window = LatencyWindow()
    window.extend(samples)
    return QuantumController(window, **kw)


def test_no_figure_yet_gives_the_floor() -> None:
    assert controller([1.0] * (MIN_SAMPLES - 1)).quantum_ms() == 2.0


@pytest.mark.parametrize(("p50", "expected"), [(10.0, 10.0), (50.0, 2.0), (80.0, 2.0), (0.0, 12.0)])
def test_spec_examples(p50: float, expected: float) -> None:
    """p50 = 10 -> 2 + 8 = 10 ms; p50 >= 50 -> 2 ms; p50 -> 0 -> 12 ms (defaults)."""
    assert controller([p50] * MIN_SAMPLES).quantum_ms() == pytest.approx(expected)


def test_the_ceiling_binds_only_with_a_raised_target() -> None:
    assert controller([0.0] * MIN_SAMPLES, target_p50_ms=200.0).quantum_ms() == 15.0


def test_the_window_keeps_the_last_200_samples() -> None:
    window = LatencyWindow()
    window.extend([1000.0] * WINDOW)
    window.extend([10.0] * (WINDOW // 2 + 1))
    assert len(window) == WINDOW
    assert window.p50() == 10.0


def test_observe_sums_inference_and_postprocessing_and_queue_only_when_asked() -> None:
    plain = controller([])
    with_queue = QuantumController(LatencyWindow(), include_queue_ms=True)
    for q in (plain, with_queue):
        for _ in range(MIN_SAMPLES):
            q.observe(4.0, None, 30.0)
    assert plain.window.p50() == 4.0
    assert with_queue.window.p50() == 34.0


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="min_ms"):
        QuantumController(LatencyWindow(), min_ms=5.0, max_ms=4.0)


@given(
    samples=st.lists(st.floats(min_value=0, max_value=1e5), max_size=300),
    floor=st.floats(min_value=0.1, max_value=20),
    extra=st.floats(min_value=0, max_value=50),
    target=st.floats(min_value=0, max_value=1e4),
)
def test_quantum_stays_within_bounds(samples: list[float], floor: float, extra: float, target: float) -> None:
    q = controller(samples, min_ms=floor, max_ms=floor + extra, target_p50_ms=target)
    assert floor <= q.quantum_ms() <= floor + extra
