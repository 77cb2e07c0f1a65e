# SPDX-License-Identifier: Apache-2.0
"""The pull gate (issue 9, law 2): a source is pulled from only while the backend can serve.

Every item pulled while the backend is not ready, draining or gone would only be refused and NAKed,
and each NAK spends one of its `max_deliver` deliveries; so the gate pauses every source while
`Readiness.pull_reason()` names a reason and resumes it when the reason clears.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Protocol

from .admission import Admission
from .readiness import Readiness

log = logging.getLogger(__name__)


class PausableSource(Protocol):
    """A source that can stop asking for work (`bus.pull.PullConsumer`)."""

    def pause(self, reason: str, *, return_delay_s: float = 0.0) -> None: ...
    def resume(self) -> None: ...


async def gate_pulls(
    readiness: Readiness,
    sources: Sequence[PausableSource],
    stop: asyncio.Event,
    *,
    return_delay_s: float,
    poll_s: float,
    admission: Admission | None = None,
    admission_pause_s: float | None = None,
) -> None:
    """Pause every source while `readiness.pull_reason()` says why not (handshake pending, heartbeat
    stale, backend draining), or the pool admission gate does (§8: not admitted, or the first gateway
    poll not answered yet; then both the pool and the worker-direct consumer stop), and resume when it
    clears. Sources start paused, so nothing is pulled before the first good handshake (and the first
    poll). One log line per change of state (or of the kind of reason). Checked after every heartbeat
    round and admission change, every `poll_s` (staleness comes with time alone), and every
    `admission_pause_s` while not admitted (the §5.1 pause)."""
    logged: str | None = ""  # the kind of reason last logged; None: pulling; "": nothing logged yet
    while not stop.is_set():
        reason = readiness.pull_reason()
        admission_reason = admission.pull_reason() if admission is not None and reason is None else None
        reason = reason or admission_reason
        kind = None if reason is None else reason.split(" (")[0]
        if reason is None:
            for source in sources:
                source.resume()
        else:
            for source in sources:
                source.pause(reason, return_delay_s=return_delay_s)
        if kind != logged:
            if reason is None:
                log.info("pulling: the backend is ready" + ("" if admission is None else " and the pool admitted"))
            else:  # at start-up (before the first heartbeat) this is expected: info, not a warning
                level = logging.INFO if logged == "" else logging.WARNING
                what = "the pool is not admitted" if admission_reason else "the backend cannot serve"
                log.log(level, f"not pulling: {what}", extra={"reason": reason})
            logged = kind
        readiness.changed.clear()
        wait_s = poll_s if admission_reason is None or admission_pause_s is None else min(poll_s, admission_pause_s)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await readiness.changed.wait()


__all__ = ["PausableSource", "gate_pulls"]
