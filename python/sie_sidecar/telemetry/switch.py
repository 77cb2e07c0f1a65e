# SPDX-License-Identifier: Apache-2.0
"""When the stages get the registry to record into (sidecar-behaviour §13; issue 32).

Recording costs about 9% of the sidecar's CPU per item (docs/benchmarks.md, "The state endpoint
on by default"). With OTLP metrics on it starts with the process; with only the state endpoint
(`sie-sidecar top`) it starts at the first read of `/debug/state`, so a sidecar nobody watches pays
nothing and `top` (which diffs two reads) still sees every rate; with neither it never starts.
"""

from __future__ import annotations

from collections.abc import Callable


class RecordingSwitch:
    """Holds the attachments (a stage's `telemetry = registry`) until recording is turned on."""

    def __init__(self, *, now: bool) -> None:
        self.on = now
        self._pending: list[Callable[[], None]] = []

    def when_on(self, attach: Callable[[], None]) -> None:
        """Run `attach` now if recording is on, else when `turn_on` is first called."""
        if self.on:
            attach()
        else:
            self._pending.append(attach)

    def turn_on(self) -> None:
        """Start recording (idempotent): every held attachment runs once, in order."""
        if self.on:
            return
        self.on = True
        pending, self._pending = self._pending, []
        for attach in pending:
            attach()


__all__ = ["RecordingSwitch"]
