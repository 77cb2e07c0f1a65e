# SPDX-License-Identifier: Apache-2.0
"""Adaptive batch controller: step cost of the Rust core against the pure-Python twin, side by side.

Each round runs 1,000 steps over precomputed inputs, so the figure per step is the round time / 1000
and includes the Python call (that is how the scheduler pays for it: once per wave)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

STEPS = 1000
TRACE = Path(__file__).resolve().parents[1] / "tests" / "data" / "controller_trace.jsonl"

# Observed p50 around a 30 ms target, fill around saturation, mostly healthy batch sizes.
_INPUTS = [(25.0 + (i * 7 % 11), 0.6 + (i * 3 % 5) * 0.1, 1 + (i * 5 % 16), i * 0.02) for i in range(STEPS)]


@pytest.fixture(params=["native", "py"])
def controller_impl(request: pytest.FixtureRequest) -> ModuleType:
    """The controller under measurement; one run holds both, so ratios are side by side."""
    name = "sie_sidecar._native" if request.param == "native" else "sie_sidecar._twins.controller"
    return importlib.import_module(name)


def _steps(impl: ModuleType, update_interval: int) -> int:
    c = impl.AdaptiveController(target_p50_ms=30.0, update_interval=update_interval)
    step = c.step
    cost = 0
    for observed, fill, size, now in _INPUTS:
        cost = step(observed, fill, size, now)[1]
    return int(cost)


@pytest.mark.benchmark(group="controller: 1,000 PI steps (update_interval 1)")
def test_step_every_call(benchmark: BenchmarkFixture, controller_impl: ModuleType) -> None:
    assert benchmark(_steps, controller_impl, 1) > 0


@pytest.mark.benchmark(group="controller: 1,000 steps at production cadence (update_interval 10)")
def test_step_production_cadence(benchmark: BenchmarkFixture, controller_impl: ModuleType) -> None:
    assert benchmark(_steps, controller_impl, 10) > 0


@pytest.mark.benchmark(group="controller: replay of tests/data/controller_trace.jsonl (290 steps)")
def test_replay_trace(benchmark: BenchmarkFixture, controller_impl: ModuleType) -> None:
    text = TRACE.read_text()
    assert len(benchmark(controller_impl.replay_controller, text)) == 290
