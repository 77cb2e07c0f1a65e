# SPDX-License-Identifier: Apache-2.0
"""A tiny dependency-free progress bar for long-running commands (the load generator).

It writes one self-overwriting line to stderr, only when stderr is a terminal (or when forced),
so piped or captured output stays clean. Redraws are throttled to about ten per second: the
caller may call `update` on every event without paying for terminal I/O each time.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

_MIN_INTERVAL_S = 0.1
_RATE_WINDOW_S = 2.0


class ProgressBar:
    """`[#####.....] 12,345/50,000 items  8,123 items/s  p50 3.1 ms` on one line of stderr.

    The rate is measured over the last couple of seconds, so it follows the current throughput
    rather than the average since the start.
    """

    def __init__(
        self,
        total: int,
        *,
        unit: str = "items",
        width: int = 30,
        stream: TextIO | None = None,
        force: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = max(0, total)
        self.unit = unit
        self.width = max(1, width)
        self._stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self.enabled = force or _isatty(self._stream)
        self._last_draw = -float("inf")
        self._last_len = 0
        self._samples: deque[tuple[float, int]] = deque()
        self._done = 0
        self._p50_ms: float | None = None
        self._closed = False

    def update(self, done: int, p50_ms: float | None = None, *, force: bool = False) -> None:
        """Record progress; redraw only if ~100 ms have passed since the last redraw (or `force`)."""
        if self._closed:
            return
        self._done = done
        if p50_ms is not None:
            self._p50_ms = p50_ms
        if not self.enabled:
            return
        now = self._clock()
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[0][0] > _RATE_WINDOW_S:
            self._samples.popleft()
        if force or now - self._last_draw >= _MIN_INTERVAL_S:
            self._last_draw = now
            self._draw(self.render())

    def render(self) -> str:
        """The current line, without the carriage return; also useful for tests."""
        total = self.total
        fraction = min(1.0, self._done / total) if total > 0 else 1.0
        filled = round(fraction * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        text = f"[{bar}] {self._done:,}/{total:,} {self.unit}  {self.rate():,.0f} {self.unit}/s"
        if self._p50_ms is not None:
            text += f"  p50 {self._p50_ms:.1f} ms"
        return text

    def rate(self) -> float:
        """Items per second over the sample window (0 until two samples a measurable time apart)."""
        if len(self._samples) < 2:
            return 0.0
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0

    def close(self) -> None:
        """Draw the final state and end the line, so later output starts on a fresh line."""
        if self._closed:
            return
        if self.enabled:
            self._samples.append((self._clock(), self._done))
            self._draw(self.render())
            self._stream.write("\n")
            self._stream.flush()
        self._closed = True

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _draw(self, line: str) -> None:
        # Pad over the remains of a longer previous line instead of relying on ANSI erase codes.
        pad = " " * max(0, self._last_len - len(line))
        self._last_len = len(line)
        self._stream.write("\r" + line + pad)
        self._stream.flush()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or exotic streams
        return False


__all__ = ["ProgressBar"]
