# SPDX-License-Identifier: Apache-2.0
"""Pure-Python twins of the scheduler's native parts: the same API as their `sie_sidecar._native`
counterparts, for parity tests, debugging and benchmark baselines (`SIE_SIDECAR_NO_EXTENSIONS=1`)."""

from __future__ import annotations

from .controller import AdaptiveController, PercentileWindow, replay_controller

IMPLEMENTATION = "py"

__all__ = ["IMPLEMENTATION", "AdaptiveController", "PercentileWindow", "replay_controller"]
