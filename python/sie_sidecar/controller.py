# SPDX-License-Identifier: Apache-2.0
"""The scheduler's adaptive batch controller (scheduler-and-prep §4): the Rust core, or the
pure-Python twin when `SIE_SIDECAR_NO_EXTENSIONS=1`.

Import the controller from here: both implementations expose the same API and produce the same
outputs bit for bit, and this module is where the choice is made once per process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._sched_py.controller import (
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
from ._speedups import _wants_twin

if TYPE_CHECKING or _wants_twin():
    # Type checkers see the twin's signatures; the native stubs declare the same API.
    from ._sched_py.controller import AdaptiveController, PercentileWindow, replay_controller

    IMPLEMENTATION = "py"
else:
    from ._native import AdaptiveController, PercentileWindow, replay_controller

    IMPLEMENTATION = "native"

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
