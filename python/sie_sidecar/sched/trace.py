# SPDX-License-Identifier: Apache-2.0
"""A live, replayable record of one model's adaptive controller (scheduler-and-prep §4.7 format).

With `SIE_SIDECAR_CONTROLLER_TRACE=<dir>` the sidecar writes `<dir>/<model>.jsonl`: a `# config:`
line with the controller's production settings, then the controller's inputs as replay events
(`record_inference`, and `step` with `dt_s`, `observed_p50_ms`, `fill_ratio`, `batch_size`) and,
on each step line, the knob values it produced (`wait_ms`, `batch_cost`, and `t_s` since the first
step). `sie-sidecar replay --config '<config>' <file>` recomputes the same knobs, and `--plot`
draws them, so a production incident can be replayed and plotted offline.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TextIO

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class ControllerTrace:
    """Appends replay events for one model; line-buffered so a crash loses at most one line."""

    def __init__(self, stream: TextIO) -> None:
        self._out = stream
        self._first_s: float | None = None
        self._last_s: float | None = None

    @classmethod
    def open(cls, directory: str, model: str, config: dict[str, Any]) -> ControllerTrace:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        stream = (path / f"{_UNSAFE.sub('_', model)}.jsonl").open("a", buffering=1, encoding="utf-8")
        stream.write(f"# model: {model}\n# config: {json.dumps(config, separators=(',', ':'))}\n")
        return cls(stream)

    def inference(self, inference_ms: float) -> None:
        self._write({"event": "record_inference", "inference_ms": inference_ms})

    def step(
        self,
        now_s: float,
        observed_p50_ms: float | None,
        fill_ratio: float | None,
        batch_size: int,
        *,
        wait_ms: float,
        batch_cost: int,
    ) -> None:
        first = self._first_s = now_s if self._first_s is None else self._first_s
        dt_s = 0.0 if self._last_s is None else now_s - self._last_s
        self._last_s = now_s
        self._write(
            {
                "event": "step",
                "dt_s": dt_s,
                "observed_p50_ms": observed_p50_ms,
                "fill_ratio": fill_ratio,
                "batch_size": batch_size,
                "wait_ms": wait_ms,
                "batch_cost": batch_cost,
                "t_s": round(now_s - first, 6),
            }
        )

    def _write(self, event: dict[str, Any]) -> None:
        self._out.write(json.dumps(event, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._out.close()


__all__ = ["ControllerTrace"]
