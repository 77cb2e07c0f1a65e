# SPDX-License-Identifier: Apache-2.0
"""The scheduler's adaptive batch controller (scheduler-and-prep §4): the Rust core, or the
pure-Python twin when `SIE_SIDECAR_NO_EXTENSIONS=1`.

Import the controller from here: both implementations expose the same API and produce the same
outputs bit for bit, and `wire._switch` is where the choice is made once per process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..wire._switch import load, wants_twin
from .controller_params import (
    DT_CAP_S,
    EFFICIENCY_WINDOW,
    ENV_VARS,
    IDLE_DECAY_AFTER_S,
    INFERENCE_MIN_SAMPLES,
    INFERENCE_WINDOW,
    LATENCY_MIN_SAMPLES,
    LATENCY_WINDOW,
    PRODUCTION_INITIAL_WAIT_MS,
    PRODUCTION_MIN_WAIT_MS,
)

IMPLEMENTATION = "py" if wants_twin() else "native"
if TYPE_CHECKING:  # the stubs are the typing source; the twin matches them (parity tests)
    from .._native import AdaptiveController, PercentileWindow, replay_controller
else:
    _impl = load("controller")
    AdaptiveController, PercentileWindow = _impl.AdaptiveController, _impl.PercentileWindow
    replay_controller = _impl.replay_controller

__all__ = [
    "DT_CAP_S",
    "EFFICIENCY_WINDOW",
    "ENV_VARS",
    "IDLE_DECAY_AFTER_S",
    "IMPLEMENTATION",
    "INFERENCE_MIN_SAMPLES",
    "INFERENCE_WINDOW",
    "LATENCY_MIN_SAMPLES",
    "LATENCY_WINDOW",
    "PRODUCTION_INITIAL_WAIT_MS",
    "PRODUCTION_MIN_WAIT_MS",
    "AdaptiveController",
    "PercentileWindow",
    "replay_controller",
]
