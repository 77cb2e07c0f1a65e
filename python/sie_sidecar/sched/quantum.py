# SPDX-License-Identifier: Apache-2.0
"""The pull loop's coalescing quantum (scheduler-and-prep §4.8).

After the first message of a batch arrives, the pull loop waits up to one quantum for more. The
quantum is recomputed for every batch from the floor: with no latency figure yet it is the floor;
otherwise `clamp(floor + (target - p50) x 0.2, floor, ceiling)`, so a fast backend coalesces longer
(bigger batches for the same latency) and a slow one shorter. The p50 comes from a 200-sample window
of per-item latencies (`inference_ms + postprocessing_ms`, plus `queue_ms` when configured), fed by
every successfully published `publish_and_ack` item, and is reported once it holds 10 samples.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Final

WINDOW: Final = 200
MIN_SAMPLES: Final = 10
GAIN: Final = 0.2
#: The back-off helper's growth per step (§4.8: x2; not used by the pull loop).
BACK_OFF_GROWTH: Final = 2.0


class LatencyWindow:
    """The last `WINDOW` latency samples in ms; `p50()` once `MIN_SAMPLES` have been seen."""

    def __init__(self, window: int = WINDOW, min_samples: int = MIN_SAMPLES) -> None:
        self._samples: deque[float] = deque(maxlen=window)
        self._min_samples = min_samples

    def __len__(self) -> int:
        return len(self._samples)

    def extend(self, samples: Iterable[float]) -> None:
        self._samples.extend(samples)

    def p50(self) -> float | None:
        """The median (upper middle for an even count), or None before `min_samples`."""
        if len(self._samples) < self._min_samples:
            return None
        ordered = sorted(self._samples)
        return ordered[len(ordered) // 2]


class QuantumController:
    """Computes the coalescing quantum from a shared `LatencyWindow` (one per process)."""

    def __init__(
        self,
        window: LatencyWindow,
        *,
        min_ms: float = 2.0,
        max_ms: float = 15.0,
        target_p50_ms: float = 50.0,
        include_queue_ms: bool = False,
    ) -> None:
        if not 0 < min_ms <= max_ms:
            raise ValueError(f"need 0 < min_ms <= max_ms, got {min_ms} and {max_ms}")
        self.window = window
        self.min_ms = min_ms
        self.max_ms = max_ms
        self.target_p50_ms = target_p50_ms
        self.include_queue_ms = include_queue_ms

    def quantum_ms(self) -> float:
        """The quantum for the next batch: always adjusted from the floor, never accumulated."""
        return self.adjust_ms(self.min_ms, self.window.p50())

    def adjust_ms(self, current_ms: float, p50_ms: float | None) -> float:
        """`current_ms` moved by `(target - p50) x GAIN`, clamped to [floor, ceiling] (§4.8 helper).

        The pull loop only adjusts from the floor; the helper takes any current value (from 5 ms with
        p50 10 it gives 13 ms). An extreme p50, no figure yet, or a NaN target or p50 give the floor;
        an infinite target gives the ceiling."""
        if p50_ms is None:
            return self.min_ms
        moved = current_ms + (self.target_p50_ms - p50_ms) * GAIN
        if math.isnan(moved):
            return self.min_ms
        return min(self.max_ms, max(self.min_ms, moved))  # the floor is > 0: saturating at 0 is implied

    def back_off_ms(self, current_ms: float) -> float:
        """The next quantum of a back-off: twice `current_ms`, within [floor, ceiling] (2, 4, 8, 15 with
        the defaults). The spec keeps this helper though its pull loop never backs off."""
        return min(self.max_ms, max(self.min_ms, current_ms * BACK_OFF_GROWTH))

    def quantum_s(self) -> float:
        return self.quantum_ms() / 1000.0

    def observe_totals(self, totals: Iterable[float]) -> None:
        """Many items' (inference + postprocessing) ms at once; only when `include_queue_ms` is off."""
        self.window.extend(totals)

    def observe(self, inference_ms: float | None, postprocessing_ms: float | None, queue_ms: float | None) -> None:
        """One published `publish_and_ack` item; missing values count as 0."""
        total = (inference_ms or 0.0) + (postprocessing_ms or 0.0)
        if self.include_queue_ms:
            total += queue_ms or 0.0
        self.window.extend((total,))


__all__ = ["BACK_OFF_GROWTH", "GAIN", "MIN_SAMPLES", "WINDOW", "LatencyWindow", "QuantumController"]
