# SPDX-License-Identifier: Apache-2.0
"""Adaptive batch controller (scheduler-and-prep §4): the spec's worked examples and §10 items
36-49, bounds and native/twin bit-parity properties, a closed-loop plant, and the replay harness."""

from __future__ import annotations

import importlib
import importlib.util
import io
import json
import logging
import math
import os
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie_sidecar.sched import controller as facade
from sie_sidecar.tools import replay as replay_cli

DATA = Path(__file__).resolve().parents[1] / "data"
TRACE = DATA / "controller_trace.jsonl"
EXPECTED = DATA / "controller_trace.expected.jsonl"

fixture_ok = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])

MODULE_DEFAULTS: dict[str, Any] = {
    "target_p50_ms": None,
    "calibration_multiplier": 1.5,
    "min_target_p50_ms": 5.0,
    "max_target_p50_ms": 500.0,
    "min_wait_ms": 1.0,
    "max_wait_ms": 50.0,
    "initial_wait_ms": 10.0,
    "min_batch_cost": 256,
    "max_batch_cost": 65536,
    "initial_batch_cost": 16384,
    "gain": 0.3,
    "integral_gain": 0.05,
    "cost_gain": 0.15,
    "update_interval": 10,
    "fill_ratio_threshold": 0.7,
    "integral_max": 20.0,
    "starvation_recovery_enabled": True,
    "starvation_window": 20,
    "starvation_batch_size": 1,
}


def load(name: str) -> ModuleType:
    return importlib.import_module("sie_sidecar._native" if name == "native" else "sie_sidecar._twins.controller")


@pytest.fixture(params=["native", "py"])
def impl(request: pytest.FixtureRequest) -> ModuleType:
    """The controller implementation under test (Rust core or pure-Python twin)."""
    return load(str(request.param))


NATIVE, TWIN = load("native"), load("py")


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def explicit(impl: ModuleType, target: float = 50.0, **kw: Any) -> Any:
    """Explicit target, every call a PI step: the setup of the §4.3 worked example."""
    return impl.AdaptiveController(target_p50_ms=target, update_interval=kw.pop("update_interval", 1), **kw)


# ------------------------------------------------------------------------------------ §4.1 windows


def test_percentile_examples(impl: ModuleType) -> None:
    w = impl.PercentileWindow(200, 10)
    for v in range(1, 11):
        w.push(float(v))
    assert w.p50() == 5.0
    w5 = impl.PercentileWindow(5, 1)
    for v in range(1, 11):
        w5.push(float(v))
    assert w5.values() == [6.0, 7.0, 8.0, 9.0, 10.0]
    assert w5.p50() == 8.0
    assert (w5.percentile(0), w5.percentile(100), w5.percentile(99)) == (6.0, 10.0, 9.0)


def test_percentile_window_edges(impl: ModuleType) -> None:
    w = impl.PercentileWindow(200, 10)
    for v in range(9):
        w.push(float(v))
    assert w.p50() is None and w.mean() is None and len(w) == 9
    assert w.push(math.nan) is False and len(w) == 9
    with pytest.raises(ValueError):
        w.percentile(100.5)
    with pytest.raises(ValueError):
        impl.PercentileWindow(0)
    eff = impl.PercentileWindow(50)
    assert (eff.capacity, eff.min_samples) == (50, 1)
    for ratio in (0.5, 1.0, 0.75):
        eff.push(ratio)
    assert eff.mean() == 0.75
    for _ in range(50):
        eff.push(0.25)
    assert len(eff) == 50 and eff.mean() == 0.25
    eff.clear()
    assert eff.mean() is None


# ---------------------------------------------------------------------------------- §4.2 parameters


def test_module_defaults(impl: ModuleType) -> None:
    c = impl.AdaptiveController()
    assert c.config == MODULE_DEFAULTS
    assert (c.current_wait_ms, c.current_batch_cost, c.calibrated, c.target_p50_ms) == (10.0, 16384, False, None)


@pytest.mark.parametrize(
    ("budget", "floor", "ceil", "initial"),
    [
        (16384, 4096, 65536, 16384),
        (8192, 2048, 32768, 8192),
        (1024, 256, 4096, 1024),
        (512, 256, 2048, 512),
        (128, 128, 512, 128),
        (720000, 180000, 2880000, 720000),
        (0, 1, 1, 1),
        (2**64 - 1, 2**62 - 1, 2**64 - 1, 2**64 - 1),
    ],
)
def test_production_cost_range(impl: ModuleType, budget: int, floor: int, ceil: int, initial: int) -> None:
    c = impl.AdaptiveController.production(budget)
    cfg = c.config
    assert (cfg["min_batch_cost"], cfg["max_batch_cost"], cfg["initial_batch_cost"]) == (floor, ceil, initial)
    assert c.current_batch_cost == initial


def test_production_derivation(impl: ModuleType) -> None:
    c = impl.AdaptiveController.production(16384, 25.0)
    cfg = c.config
    assert cfg["cost_gain"] == cfg["gain"] * 0.5 == 0.15
    assert (cfg["min_wait_ms"], cfg["max_wait_ms"], cfg["initial_wait_ms"]) == (15.0, 50.0, 25.0)
    assert c.current_wait_ms == 25.0
    assert c.target_p50_ms is None and not c.calibrated
    expected = {**MODULE_DEFAULTS, "min_wait_ms": 15.0, "initial_wait_ms": 15.0, "min_batch_cost": 4096}
    assert impl.AdaptiveController.production(16384).config == expected


@pytest.mark.parametrize(
    ("env", "check"),
    [
        (
            {"SIE_ADAPTIVE_BATCH_MIN_WAIT_MS": "garbage", "SIE_ADAPTIVE_BATCH_MAX_WAIT_MS": "NaN"},
            {"min_wait_ms": 15.0, "max_wait_ms": 50.0},
        ),
        ({"SIE_ADAPTIVE_BATCH_MAX_WAIT_MS": "10"}, {"min_wait_ms": 10.0, "max_wait_ms": 10.0, "wait": 10.0}),
        ({"SIE_ADAPTIVE_BATCH_MAX_WAIT_MS": "5"}, {"wait": 5.0}),
        ({"SIE_ADAPTIVE_BATCH_MIN_WAIT_MS": "5"}, {"min_wait_ms": 5.0}),
        ({"SIE_ADAPTIVE_BATCH_TARGET_P50_MS": " 42.5 "}, {"target_p50_ms": 42.5, "calibrated": True}),
        (
            {"SIE_ADAPTIVE_BATCH_MIN_COST": "100000", "SIE_ADAPTIVE_BATCH_MAX_COST": "1000"},
            {"min_batch_cost": 1000, "max_batch_cost": 1000, "cost": 1000},
        ),
        (
            {"SIE_ADAPTIVE_BATCH_MIN_COST": "-1", "SIE_ADAPTIVE_BATCH_MAX_COST": "16k"},
            {"min_batch_cost": 4096, "max_batch_cost": 65536},
        ),
        (
            {"SIE_ADAPTIVE_BATCH_INITIAL_COST": "20000", "SIE_ADAPTIVE_BATCH_INITIAL_WAIT_MS": "2e1"},
            {"cost": 20000, "wait": 20.0},
        ),
        (
            {"SIE_ADAPTIVE_BATCH_CALIBRATION_MULT": "inf", "SIE_ADAPTIVE_BATCH_MIN_TARGET_P50_MS": "600"},
            {"calibration_multiplier": 1.5, "min_target_p50_ms": 500.0},
        ),
        (
            {"SIE_ADAPTIVE_BATCH_MAX_WAIT_MS": "1_0", "SIE_ADAPTIVE_BATCH_MIN_WAIT_MS": "-3"},
            {"min_wait_ms": 15.0, "max_wait_ms": 50.0},
        ),
    ],
)
def test_env_overrides(impl: ModuleType, env: dict[str, str], check: dict[str, Any]) -> None:
    c = impl.AdaptiveController.production(16384, 15.0, env)
    seen = {
        **c.config,
        "wait": c.current_wait_ms,
        "cost": c.current_batch_cost,
        "calibrated": c.calibrated,
    }
    assert {k: seen[k] for k in check} == check


def test_env_warnings_are_logged(impl: ModuleType, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="sie_sidecar.sched.controller"):
        impl.AdaptiveController.production(16384, env={"SIE_ADAPTIVE_BATCH_MAX_COST": "lots", "OTHER": "x"})
    assert [r.getMessage() for r in caplog.records if "SIE_ADAPTIVE_BATCH_MAX_COST" in r.getMessage()]
    assert len(caplog.records) == 1


@pytest.mark.parametrize(
    "kw",
    [
        {"min_wait_ms": 60.0},
        {"min_batch_cost": 70000},
        {"target_p50_ms": 0.0},
        {"target_p50_ms": math.inf},
        {"gain": math.nan},
        {"gain": 1.5},
        {"integral_gain": -0.1},
        {"update_interval": 0},
        {"starvation_window": 0},
        {"max_target_p50_ms": 1.0},
        {"calibration_multiplier": 0.0},
    ],
)
def test_invalid_configs(impl: ModuleType, kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        impl.AdaptiveController(**kw)


@pytest.mark.parametrize(
    ("kw", "exc"),
    [
        ({"min_batch_cost": -1}, OverflowError),
        ({"min_batch_cost": 2**64}, OverflowError),
        ({"min_batch_cost": 1.5}, TypeError),
        ({"gain": "0.3"}, TypeError),
        ({"starvation_recovery_enabled": 1}, TypeError),
    ],
)
def test_argument_types(impl: ModuleType, kw: dict[str, Any], exc: type[Exception]) -> None:
    with pytest.raises(exc):
        impl.AdaptiveController(**kw)


def test_step_argument_types(impl: ModuleType) -> None:
    c = explicit(impl)
    with pytest.raises(OverflowError):
        c.step(10.0, 1.0, -1, 0.0)
    with pytest.raises(TypeError):
        c.step("10", 1.0, 1, 0.0)
    assert explicit(impl).step(10, 1, 8, 0) == explicit(impl).step(10.0, 1.0, 8, 0.0)  # ints work as floats


# ---------------------------------------------------------------------------------- §4.3 step law


def test_worked_example(impl: ModuleType) -> None:
    c = explicit(impl, 50.0, initial_wait_ms=15.0)
    assert (c.current_wait_ms, c.current_batch_cost) == (15.0, 16384)
    assert c.step(10.0, 0.9, 8, 0.0) == (27.0, 18350)  # 16384 + 16384 x 0.8 x 0.15 = 18350.08
    assert c.snapshot()["integral"] == 0.0


@pytest.mark.parametrize(
    ("cost", "target", "observed", "expected"), [(39000, 10.0, 64.0, 7410), (49750, 10.0, 57.2, 14527)]
)
def test_cost_evaluation_order(impl: ModuleType, cost: int, target: float, observed: float, expected: int) -> None:
    """`cost + cost x frac x gain` left to right: `cost + cost x (frac x gain)` truncates one lower here."""
    c = explicit(impl, target, initial_batch_cost=cost)
    assert c.step(observed, 1.0, None, 0.0)[1] == expected


def clamp(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else hi if x > hi else x


@given(
    initial=st.tuples(st.floats(1.0, 50.0), st.integers(256, 65536)),
    target=st.floats(5.0, 500.0),
    observed=st.tuples(st.floats(0.0, 1000.0), st.floats(0.0, 1000.0)),
    dt=st.floats(0.0, 10.0),
    gains=st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0)),
)
def test_two_steps_match_the_spec_formula(
    initial: tuple[float, int],
    target: float,
    observed: tuple[float, float],
    dt: float,
    gains: tuple[float, float, float],
) -> None:
    """An oracle written from §4.3 alone, bit for bit: first PI step (dt = 0), then one after dt."""
    (wait0, cost0), (kp, ki, kc) = initial, gains
    kw = {"initial_wait_ms": wait0, "initial_batch_cost": cost0, "gain": kp, "integral_gain": ki, "cost_gain": kc}
    wait, cost, integral = wait0, cost0, 0.0
    expected = []
    for obs, step_dt in zip(observed, (0.0, (100.0 + dt) - 100.0), strict=True):  # dt as the clock sees it
        h = target - obs
        d = min(step_dt, 5.0)
        if d > 2.0:
            integral *= 0.5 ** (d - 2.0)
        if not ((wait >= 50.0 and h > 0) or (wait <= 1.0 and h < 0)) and ki > 0:
            integral = clamp(integral + h * d, -20.0, 20.0)
        wait = clamp(wait + h * kp + integral * ki, 1.0, 50.0)
        if not ((cost >= 65536 and h > 0) or (cost <= 256 and h < 0)):
            cost = int(clamp(cost + cost * (h / target) * kc, 256.0, 65536.0))
        expected.append((bits(wait), cost))
    for impl in (NATIVE, TWIN):
        c = explicit(impl, target, **kw)
        got = [c.step(observed[0], 1.0, None, 100.0), c.step(observed[1], 1.0, None, 100.0 + dt)]
        assert [(bits(w), k) for w, k in got] == expected


def test_calibration(impl: ModuleType) -> None:
    c = impl.AdaptiveController(calibration_multiplier=2.0)
    for _ in range(20):
        c.record_inference(10.0)
    for i in range(9):
        assert c.step(1.0, 1.0, 8, float(i)) == (10.0, 16384)
        assert not c.calibrated
    assert c.step(1.0, 1.0, 8, 9.0) == (10.0, 16384)  # knobs held on the calibrating step
    assert c.calibrated and c.target_p50_ms == 20.0
    c.record_inference(1000.0)  # ignored once calibrated
    c.reset()
    assert not c.calibrated and c.target_p50_ms is None

    clamped = impl.AdaptiveController(calibration_multiplier=100.0, max_target_p50_ms=50.0, update_interval=1)
    for _ in range(10):
        clamped.record_inference(5.0)
    clamped.step(None, None, None, 0.0)
    assert clamped.target_p50_ms == 50.0


def test_calibration_needs_ten_of_the_last_fifty(impl: ModuleType) -> None:
    c = impl.AdaptiveController(update_interval=1)
    for _ in range(9):
        c.record_inference(10.0)
    c.step(1.0, None, None, 0.0)
    assert not c.calibrated
    for _ in range(50):
        c.record_inference(100.0)
    c.step(1.0, None, None, 0.0)
    assert c.target_p50_ms == 150.0  # the 9 early samples were evicted


def test_knobs_held_before_calibration(impl: ModuleType) -> None:
    c = impl.AdaptiveController(update_interval=1)
    for i in range(100):
        assert c.step(1e9 if i % 2 else 0.0, 1.0, 1, float(i)) == (10.0, 16384)
    assert c.starvation_resets == 0


def test_headroom_moves_the_wait_within_bounds(impl: ModuleType) -> None:
    fast, slow = explicit(impl), explicit(impl)
    assert fast.step(10.0, None, None, 0.0)[0] > 10.0
    assert slow.step(90.0, None, None, 0.0)[0] < 10.0
    for i in range(1, 200):
        fast.step(10.0, None, None, float(i))
        slow.step(90.0, None, None, float(i))
    assert (fast.current_wait_ms, slow.current_wait_ms) == (50.0, 1.0)


def test_cost_moves_only_when_saturated(impl: ModuleType) -> None:
    c = explicit(impl)
    assert c.step(10.0, 0.69, None, 0.0)[1] == 16384
    assert c.step(10.0, None, None, 0.0)[1] == 16384
    assert c.step(10.0, 0.7, None, 0.0)[1] > 16384
    for i in range(200):
        c.step(10.0, 1.0, None, float(i))
    assert c.current_batch_cost == 65536
    for i in range(200, 600):
        c.step(200.0, 1.0, None, float(i))
    assert c.current_batch_cost == 256


def test_update_interval_gates_the_law(impl: ModuleType) -> None:
    c = explicit(impl, update_interval=5)
    for i in range(4):
        assert c.step(10.0, 1.0, None, float(i)) == (10.0, 16384)
    moved = c.step(10.0, 1.0, None, 4.0)
    assert moved[0] > 10.0 and moved[1] > 16384
    for i in range(5, 9):
        assert c.step(10.0, 1.0, None, float(i)) == moved


def test_anti_windup(impl: ModuleType) -> None:
    c = explicit(impl)
    for i in range(40):
        c.step(10.0, None, None, i * 0.1)
    assert c.current_wait_ms == 50.0
    frozen = c.snapshot()["integral"]
    assert frozen == pytest.approx(12.0)  # 40 ms x 0.1 s on three steps before the wait hit its ceiling
    for i in range(40, 80):
        c.step(10.0, None, None, i * 0.1)
        assert c.snapshot()["integral"] == frozen
    c.step(60.0, None, None, 8.1)  # negative headroom at the ceiling integrates again
    assert c.snapshot()["integral"] < frozen


def test_idle_decay(impl: ModuleType) -> None:
    c = explicit(impl, initial_wait_ms=20.0)
    c.step(49.0, None, None, 0.0)
    c.step(49.0, None, None, 1.0)
    assert c.snapshot()["integral"] == 1.0
    c.step(50.0, None, None, 6.0)  # 5 s gap: x 0.5^3, then + 0 x 5
    assert c.snapshot()["integral"] == 0.125
    c.step(50.0, None, None, 100.0)  # dt capped at 5 s
    assert c.snapshot()["integral"] == 0.015625
    c.step(50.0, None, None, 50.0)  # a clock running backwards counts as dt = 0
    assert c.snapshot()["integral"] == 0.015625


def test_non_finite_signals_count_as_absent(impl: ModuleType) -> None:
    c = explicit(impl)
    assert c.step(math.nan, 1.0, None, 0.0) == (10.0, 16384)
    assert c.step(math.inf, 1.0, None, 0.0) == (10.0, 16384)
    wait, cost = c.step(10.0, math.nan, None, 0.0)
    assert wait > 10.0 and cost == 16384
    assert c.snapshot()["fill_ratio"] is None


# --------------------------------------------------------------------------------- §4.4 starvation


def starvation(impl: ModuleType, **kw: Any) -> Any:
    """The §4.4 example setup, driven to both floors by large batches (no streak)."""
    c = explicit(
        impl,
        10.0,
        **{
            "min_wait_ms": 1.0,
            "initial_wait_ms": 20.0,
            "min_batch_cost": 100,
            "initial_batch_cost": 4000,
            "starvation_window": 5,
            **kw,
        },
    )
    for i in range(200):
        c.step(1000.0, 1.0, 64, float(i))
    assert (c.current_wait_ms, c.current_batch_cost) == (c.config["min_wait_ms"], c.config["min_batch_cost"])
    assert c.snapshot()["starvation_streak"] == 0
    return c


def test_starvation_example(impl: ModuleType) -> None:
    c = starvation(impl)
    for i in range(4):
        c.step(1000.0, 1.0, 1, 300.0 + i)
    assert c.starvation_resets == 0 and c.snapshot()["starvation_streak"] == 4
    assert c.step(1000.0, 1.0, 1, 305.0) == (10.5, 2000)  # max(4000 div 2, 100 x 4)
    snap = c.snapshot()
    assert (snap["starvation_resets"], snap["starvation_streak"], snap["integral"]) == (1, 0, 0.0)
    c.step(5.0, None, None, 1e6)  # the next PI step is a first one again: dt = 0
    assert c.snapshot()["integral"] == 0.0


def test_starvation_with_production_defaults(impl: ModuleType) -> None:
    c = impl.AdaptiveController.production(16384, 15.0, {"SIE_ADAPTIVE_BATCH_TARGET_P50_MS": "10"})
    # production update_interval is 10: drive to the floors, then 20 size-1 batches.
    for i in range(100):
        c.step(1000.0, 1.0, 64, float(i))
    assert (c.current_wait_ms, c.current_batch_cost) == (15.0, 4096)
    last = None
    for i in range(20):
        last = c.step(1000.0, 1.0, 1, 200.0 + i)
    assert last == (15.0, 16384)  # wait (15 + 15) / 2, cost max(8192, 16384)
    assert c.starvation_resets == 1


def test_starvation_streak_rules(impl: ModuleType) -> None:
    c = explicit(impl, 10.0, initial_wait_ms=20.0, starvation_window=5)

    def streak() -> int:
        return int(c.snapshot()["starvation_streak"])

    c.step(10.0, None, 1, 0.0)
    c.step(10.0, None, 1, 0.0)
    assert streak() == 2  # counted off the floors too (Rust semantics)
    c.step(10.0, None, None, 0.0)
    assert streak() == 2  # None leaves it
    c.step(10.0, None, 2, 0.0)
    assert streak() == 0  # a healthy batch resets it
    c.step(10.0, None, 0, 0.0)
    assert streak() == 1
    gated = impl.AdaptiveController(update_interval=10)
    gated.step(None, None, 1, 0.0)
    assert gated.snapshot()["starvation_streak"] == 1  # gated calls count


def test_starvation_disabled_or_off_floor(impl: ModuleType) -> None:
    c = starvation(impl, starvation_recovery_enabled=False)
    for i in range(50):
        c.step(1000.0, 1.0, 1, 300.0 + i)
    assert c.starvation_resets == 0
    equilibrium = explicit(impl, 10.0, initial_wait_ms=20.0, starvation_window=5)
    for i in range(50):
        equilibrium.step(10.0, 1.0, 1, float(i))
    assert equilibrium.starvation_resets == 0
    assert equilibrium.snapshot()["starvation_streak"] == 50


def test_recovers_from_starvation_in_a_trickle(impl: ModuleType) -> None:
    """Low traffic after an overload: single-item batches that still fill the (floor) cap, backend
    slow. Recovery lifts the knobs off their floors whenever a streak of 20 finds them there (the PI
    law pulls the cost back down in between), and never while batches are big."""
    c = impl.AdaptiveController.production(16384, 15.0, {"SIE_ADAPTIVE_BATCH_TARGET_P50_MS": "20"})
    now = 0.0
    for _ in range(200):  # overload with big batches: floors, no recovery
        now += 0.01
        c.step(80.0, 1.0, 48, now)
    assert (c.current_wait_ms, c.current_batch_cost, c.starvation_resets) == (15.0, 4096, 0)
    lifted = []
    for _ in range(200):  # trickle: size-1 batches, still slow
        now += 0.05
        lifted.append(c.step(80.0, 1.0, 1, now))
    # PI steps every 10th call: recovery on call 20 (streak 20), the cost back at its floor by call
    # 50 (x 0.55 per step), recovery again on call 60 (streak 40): calls 20, 60, 100, 140, 180.
    assert c.starvation_resets == 5
    assert [i + 1 for i, knobs in enumerate(lifted) if knobs == (15.0, 16384)][::10] == [20, 60, 100, 140, 180]
    for _ in range(100):  # healthy again: batches grow and headroom is positive
        now += 0.01
        c.step(10.0, 1.0, 32, now)
    assert c.starvation_resets == 5
    assert c.current_wait_ms > 15.0 and c.current_batch_cost > 4096


# ------------------------------------------------------------------------------ §4.5 reset, snapshot


def test_reset(impl: ModuleType) -> None:
    c = starvation(impl)
    for i in range(6):
        c.step(1000.0, 1.0, 1, 300.0 + i)
    assert c.starvation_resets == 1
    c.reset()
    assert (c.current_wait_ms, c.current_batch_cost) == (20.0, 4000)
    assert (c.target_p50_ms, c.calibrated, c.starvation_resets) == (10.0, True, 1)
    snap = c.snapshot()
    assert (snap["starvation_streak"], snap["integral"], snap["observed_p50_ms"]) == (0, 0.0, None)

    auto = impl.AdaptiveController(update_interval=1)
    for _ in range(10):
        auto.record_inference(10.0)
    auto.step(None, None, None, 0.0)
    assert auto.target_p50_ms == 15.0
    auto.reset()
    auto.step(None, None, None, 0.0)
    assert not auto.calibrated  # the inference window was cleared too


def test_snapshot(impl: ModuleType) -> None:
    c = explicit(impl)
    snap = c.snapshot()
    assert list(snap) == [
        "enabled",
        "calibrated",
        "target_p50_ms",
        "current_wait_ms",
        "current_batch_cost",
        "observed_p50_ms",
        "headroom_ms",
        "fill_ratio",
        "integral",
        "starvation_streak",
        "starvation_resets",
    ]
    assert snap["headroom_ms"] is None and snap["enabled"]
    c.step(30.0, 0.5, 3, 0.0)
    snap = c.snapshot()
    assert (snap["observed_p50_ms"], snap["headroom_ms"], snap["fill_ratio"]) == (30.0, 20.0, 0.5)
    assert snap["current_wait_ms"] == c.current_wait_ms == 16.0
    assert "wait_ms=16.0" in repr(c)


# ------------------------------------------------------------------------------ closed loop (plant)


@pytest.mark.parametrize(("wait_weight", "samples_per_wave"), [(0.0, 8), (0.3, 4), (0.0, 1)])
def test_converges_on_a_steady_plant(impl: ModuleType, wait_weight: float, samples_per_wave: int) -> None:
    """Plant: latency = 4 ms + cost_in_force / 1000 (+ weight x wait) with bounded jitter, measured
    through the 200/10 latency window; production cadence (a PI step every 10th wave), saturated."""
    c = impl.AdaptiveController(target_p50_ms=30.0)
    window = impl.PercentileWindow(200, 10)
    now, errors = 0.0, []
    for wave in range(1500):
        cost, wait = c.current_batch_cost, c.current_wait_ms
        for j in range(samples_per_wave):
            jitter = ((wave * 7 + j * 13) % 11 - 5) * 0.2
            window.push(4.0 + cost / 1000.0 + wait_weight * wait + jitter)
        now += 0.02
        p50 = window.p50()
        c.step(p50, 1.0, 16, now)
        if p50 is not None:
            errors.append(abs(p50 - 30.0))
    assert errors[0] > 5.0  # it started far off
    late = errors[-300:]
    assert max(late) < 0.6 and sum(late) / len(late) < 0.2


# ------------------------------------------------------------------------------ properties


events = st.one_of(
    st.tuples(st.just("inference"), st.floats(0.0, 300.0)),
    st.tuples(
        st.just("step"),
        st.floats(0.0, 8.0),
        st.none() | st.floats(0.0, 1000.0),
        st.none() | st.floats(0.0, 1.5),
        st.none() | st.integers(0, 3),
    ),
)

configs = st.fixed_dictionaries(
    {},
    optional={
        "target_p50_ms": st.floats(1.0, 200.0),
        "min_wait_ms": st.floats(0.0, 10.0),
        "initial_wait_ms": st.floats(-10.0, 80.0),
        "min_batch_cost": st.integers(0, 2000),
        "initial_batch_cost": st.integers(0, 200_000),
        "update_interval": st.integers(1, 5),
        "starvation_window": st.integers(1, 8),
        "starvation_batch_size": st.integers(0, 2),
        "gain": st.floats(0.0, 1.0),
        "integral_gain": st.floats(0.0, 1.0),
        "cost_gain": st.floats(0.0, 1.0),
        "fill_ratio_threshold": st.floats(0.0, 1.0),
    },
)


def run_trace(impl: ModuleType, config: dict[str, Any], trace: list[tuple[Any, ...]]) -> list[tuple[bytes, int]]:
    c = impl.AdaptiveController(**config)
    cfg, now, out = c.config, 0.0, []
    for ev in trace:
        if ev[0] == "inference":
            c.record_inference(ev[1])
            continue
        now += ev[1]
        wait, cost = c.step(ev[2], ev[3], ev[4], now)
        assert cfg["min_wait_ms"] <= wait <= cfg["max_wait_ms"]
        assert cfg["min_batch_cost"] <= cost <= cfg["max_batch_cost"]
        assert abs(c.snapshot()["integral"]) <= cfg["integral_max"]
        out.append((bits(wait), cost))
    out.append((repr(c.snapshot()).encode(), c.starvation_resets))
    return out


@fixture_ok
@given(config=configs, trace=st.lists(events, max_size=120))
def test_random_traces_stay_in_bounds(impl: ModuleType, config: dict[str, Any], trace: list[tuple[Any, ...]]) -> None:
    run_trace(impl, config, trace)


@given(config=configs, trace=st.lists(events, max_size=120))
def test_native_and_twin_are_bit_identical(config: dict[str, Any], trace: list[tuple[Any, ...]]) -> None:
    assert run_trace(NATIVE, config, trace) == run_trace(TWIN, config, trace)


def trace_text(trace: list[tuple[Any, ...]]) -> str:
    lines = []
    for ev in trace:
        if ev[0] == "inference":
            lines.append(json.dumps({"event": "record_inference", "inference_ms": ev[1]}))
        else:
            fields = {"event": "step", "dt_s": ev[1], "observed_p50_ms": ev[2], "fill_ratio": ev[3]}
            lines.append(json.dumps({**fields, "batch_size": ev[4]}))
    return "\n".join(lines)


@given(config=configs, trace=st.lists(events, max_size=60))
def test_replay_parity_on_random_traces(config: dict[str, Any], trace: list[tuple[Any, ...]]) -> None:
    text, cfg = trace_text(trace), json.dumps(config)
    a, b = NATIVE.replay_controller(text, cfg), TWIN.replay_controller(text, cfg)
    assert [(bits(s["wait_ms"]), s["batch_cost"], s["starvation_resets"]) for s in a] == [
        (bits(s["wait_ms"]), s["batch_cost"], s["starvation_resets"]) for s in b
    ]
    # Replay equals driving the controller by hand with the virtual clock.
    direct = run_trace(TWIN, config, trace)[:-1]
    assert [(bits(s["wait_ms"]), s["batch_cost"]) for s in a] == direct


json_fragments = st.sampled_from(
    [
        '"dt_s":1',
        '"dt_s":-0',
        '"dt_s":1e400',
        '"dt_s":0.1',
        '"dt_s":"1"',
        '"dt_s":null',
        '"dt_s":true',
        '"observed_p50_ms":1e-320',
        '"observed_p50_ms":12345678901234567890123',
        '"observed_p50_ms":NaN',
        '"observed_p50_ms":Infinity',
        '"observed_p50_ms":5',
        '"fill_ratio":0.99999999999999999',
        '"batch_size":0',
        '"batch_size":-0',
        '"batch_size":1.0',
        '"batch_size":18446744073709551615',
        '"batch_size":18446744073709551616',
        '"batch_size":01',
        '"x":[1,{"y":[]}]',
        '"x":"\\ud800"',
        '"ev\\u0065nt":"step"',
        '"event":"step"',
        '"event":"record_inference"',
        '"event":"nap"',
        '"event":5',
        '"inference_ms":7',
        '"inference_ms":-1e3',
        '"a":1,',
        ",,",
    ]
)


@given(st.lists(st.lists(json_fragments, max_size=5), max_size=6))
def test_replay_parity_on_odd_json(lines: list[list[str]]) -> None:
    """Both implementations accept and reject the same lines, with the same outputs and line."""
    text = "\n".join("{" + ",".join(parts) + "}" for parts in lines)
    results: list[tuple[str, Any]] = []
    for impl in (NATIVE, TWIN):
        try:
            results.append(("ok", [(bits(s["wait_ms"]), s["batch_cost"]) for s in impl.replay_controller(text)]))
        except ValueError as exc:
            results.append(("error", str(exc).split(":")[0]))
    assert results[0] == results[1]


# -------------------------------------------------------------------------------------- replay §4.7


def test_replay_worked_example(impl: ModuleType) -> None:
    config = '{"target_p50_ms": 50, "update_interval": 1, "initial_wait_ms": 15}'
    trace = '# comment\n\n   \n{"event":"step","dt_s":0.0,"observed_p50_ms":10,"fill_ratio":0.9,"batch_size":8}\n'
    assert impl.replay_controller(trace, config) == [{"wait_ms": 27.0, "batch_cost": 18350, "starvation_resets": 0}]


def test_replay_clock_advances_on_gated_steps(impl: ModuleType) -> None:
    """Gated calls still advance the virtual clock: the second PI step sees dt = 1 + 1 = 2 s."""
    config = '{"target_p50_ms": 50, "update_interval": 2, "max_wait_ms": 1000}'
    lines = [json.dumps({"event": "step", "dt_s": dt, "observed_p50_ms": 10}) for dt in (0, 0, 1, 1)]
    out = impl.replay_controller("\r\n".join(lines), config)
    assert [s["wait_ms"] for s in out] == [10.0, 22.0, 22.0, 22.0 + 12.0 + 20.0 * 0.05]


def test_replay_starvation_and_determinism(impl: ModuleType) -> None:
    config = json.dumps(
        {
            "target_p50_ms": 10,
            "update_interval": 1,
            "initial_wait_ms": 20,
            "min_batch_cost": 100,
            "initial_batch_cost": 4000,
            "starvation_window": 5,
        }
    )
    big = '{"event":"step","dt_s":1,"observed_p50_ms":1000,"fill_ratio":1,"batch_size":64}'
    one = big.replace('"batch_size":64', '"batch_size":1')
    trace = "\n".join([big] * 200 + [one] * 5)
    first = impl.replay_controller(trace, config)
    assert first == impl.replay_controller(trace, config)
    assert first[-1] == {"wait_ms": 10.5, "batch_cost": 2000, "starvation_resets": 1}


@pytest.mark.parametrize(
    ("trace", "config", "message"),
    [
        ('{"event":"step"}', None, 'line 1: missing "dt_s"'),
        ('\n{"event":"nap","dt_s":1}', None, 'line 2: unknown event kind "nap"'),
        ('#\n\n{"event":"step","dt_s":1,"batch_size":1.5}', None, "line 3: "),
        ('{"event":"step","dt_s":NaN}', None, "line 1: invalid JSON"),
        ('{"dt_s":1}', None, 'line 1: missing "event"'),
        ('["step"]', None, "line 1: an event must be a JSON object"),
        ('{"event":"record_inference"}', None, 'line 1: missing "inference_ms"'),
        ("", '{"gian": 0.3}', 'config: unknown configuration field "gian"'),
        ("", '{"gain": 3}', "config: gain must be within [0, 1]"),
        ("", "[]", "config: the configuration must be a JSON object"),
        ("", '{"update_interval": 2.0}', 'config: "update_interval" must be an integer'),
    ],
)
def test_replay_errors(impl: ModuleType, trace: str, config: str | None, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("[", r"\[").replace("]", r"\]")):
        impl.replay_controller(trace, config)


def test_replay_json_details(impl: ModuleType) -> None:
    """Later duplicates win, escapes decode, -0 is an integer, 1e1 a float."""
    config = '{"target_p50_ms": null, "gain": "x", "gain": 0.3, "update_\\u0069nterval": 1}'
    trace = (
        '{"ev\\u0065nt":"record_inference","inference_ms":1e1}\n'
        '{"event":"nap","event":"step","dt_s":-0,"batch_size":-0,"other":{"deep":[1,2,{}]}}'
    )
    assert impl.replay_controller(trace, config) == [{"wait_ms": 10.0, "batch_cost": 16384, "starvation_resets": 0}]


# ------------------------------------------------------------------------- the checked-in trace


def expected_steps() -> list[dict[str, Any]]:
    return [json.loads(line) for line in EXPECTED.read_text().splitlines()]


def test_trace_file(impl: ModuleType) -> None:
    out = impl.replay_controller(TRACE.read_text())
    assert out == expected_steps()
    # Hand-checked points. Target: the p50 of the 12 inference samples (sorted index 5 = 7.5) x 1.5.
    target = 7.5 * 1.5
    assert out[9] == {"wait_ms": 10.0, "batch_cost": 16384, "starvation_resets": 0}  # calibrating step
    # First PI step (step 20; observed 6.0 + 2 x 0.25, fill 0.85): dt = 0.
    headroom = target - 6.5
    assert out[19]["wait_ms"] == 10.0 + headroom * 0.3
    assert out[19]["batch_cost"] == int(16384 + 16384 * (headroom / target) * 0.15)
    resets = [s["starvation_resets"] for s in out]
    first = resets.index(1)
    assert out[first - 1]["wait_ms"] == 1.0 and out[first - 1]["batch_cost"] == 256  # both floors
    assert out[first] == {"wait_ms": 5.5, "batch_cost": 8192, "starvation_resets": 1}  # (1+10)/2, max(8192, 1024)
    assert resets[-1] == 1


def test_trace_file_native_equals_twin_bitwise() -> None:
    text = TRACE.read_text()
    a, b = NATIVE.replay_controller(text), TWIN.replay_controller(text)
    assert [bits(s["wait_ms"]) for s in a] == [bits(s["wait_ms"]) for s in b]
    assert a == b


@pytest.mark.parametrize("implementation", ["native", "py", "auto"])
def test_replay_cli_file(implementation: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert replay_cli.main([str(TRACE), "--impl", implementation]) == 0
    assert capsys.readouterr().out == EXPECTED.read_text()


def test_replay_cli_stdin_subprocess() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sie_sidecar.tools.replay"],
        input=TRACE.read_text(),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == EXPECTED.read_text()


def test_replay_cli_config_and_errors(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"event":"step","dt_s":0,"observed_p50_ms":10,"fill_ratio":0.9}\n'))
    assert replay_cli.main(["--config", '{"target_p50_ms":50,"update_interval":1,"initial_wait_ms":15}']) == 0
    assert capsys.readouterr().out == '{"wait_ms":27.0,"batch_cost":18350,"starvation_resets":0}\n'
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"event":"nap"}\n'))
    assert replay_cli.main([]) == 1
    assert "line 1: unknown event kind" in capsys.readouterr().err
    assert replay_cli.main(["/nonexistent/trace.jsonl"]) == 2


def test_replay_cli_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "plot.png"
    code = replay_cli.main([str(TRACE), "--plot", str(png)])
    if importlib.util.find_spec("matplotlib") is None:
        assert code == 2
        assert "matplotlib" in capsys.readouterr().err
        assert not png.exists()
    else:
        assert code == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_facade_exports() -> None:
    assert facade.IMPLEMENTATION in {"native", "py"}
    expected = NATIVE if facade.IMPLEMENTATION == "native" else TWIN
    assert facade.AdaptiveController is expected.AdaptiveController
    assert facade.replay_controller is expected.replay_controller
    assert facade.PercentileWindow is expected.PercentileWindow


def test_facade_honours_no_extensions() -> None:
    code = "from sie_sidecar.sched import controller as c; print(c.IMPLEMENTATION)"
    for env, name in (({"SIE_SIDECAR_NO_EXTENSIONS": "1"}, "py"), ({"SIE_SIDECAR_NO_EXTENSIONS": "0"}, "native")):
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            check=True,
            timeout=60,
        )
        assert done.stdout.strip() == name
