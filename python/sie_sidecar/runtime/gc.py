# SPDX-License-Identifier: Apache-2.0
"""The cyclic garbage collector once started, in both ingest modes: the start-up heap frozen, young
collections rarer, and cycles collected by time instead (docs/reliability.md, "Soak")."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from typing import Any

#: Allocations (net) between gen-0 collections once started; CPython's default is 700.
GC_GEN0_THRESHOLD = 10_000


def tune_gc_for_steady_state() -> None:
    """Start-up is done: freeze the heap it built (imports, settings, compiled patterns) and make
    young collections rarer.

    The hot path makes short-lived, acyclic objects by the thousand per second; with CPython's gen-0
    threshold of 700 the collector ran every few batches and walked the whole start-up heap at each
    full collection: ~5% of the sidecar's CPU under load (perf, in-memory pipeline). Reference
    counting frees those objects anyway; the collector is for cycles, rare here. No `gc.collect()`
    first: it costs tens of ms before the first reply, and start-up's cyclic garbage is bounded.
    """
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


#: A full collection at least this often once started (see `PeriodicCollection`).
GC_INTERVAL_S = 60.0


class PeriodicCollection:
    """A full `gc.collect()` every `GC_INTERVAL_S`, timed, so cyclic garbage is bounded by time.

    Why: with start-up frozen and gen-0 at 10,000 net allocations, the hot path (acyclic, freed by
    reference counting) nets about one tracked object a second, so an automatic collection can be
    hours away; meanwhile cycles the standard library makes pile up. Each closed TCP connection's
    asyncio transport keeps itself alive through its own bound read callback, with its sockets,
    addresses and extra dict: ~65 Python blocks per probe or short-lived HTTP connection, which the
    soak measured as a steady +3 blocks/s (docs/reliability.md, "Soak"). The frozen heap is not walked,
    so a full collection costs about a millisecond; `/debug/state` shows `memory.gc.periodic`."""

    def __init__(self, interval_s: float | None = None) -> None:
        self.interval_s = GC_INTERVAL_S if interval_s is None else interval_s
        self.runs = 0
        self.freed = 0
        self.last_ms = 0.0
        self.max_ms = 0.0

    def collect(self) -> int:
        """One full collection now; the objects it freed."""
        started = time.perf_counter()
        freed = gc.collect()
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        self.runs += 1
        self.freed += freed
        self.last_ms = elapsed_ms
        self.max_ms = max(self.max_ms, elapsed_ms)
        return freed

    async def run(self, stop: asyncio.Event) -> None:
        """Collect every `interval_s` until `stop` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
            if not stop.is_set():
                self.collect()

    def start(self, stop: asyncio.Event, background: list[asyncio.Task[Any]]) -> None:
        """Run it as a background task, ended with the others at shutdown."""
        background.append(asyncio.create_task(self.run(stop)))

    def snapshot(self) -> dict[str, float | int]:
        """What `/debug/state` shows under `memory.gc.periodic`."""
        return {
            "interval_s": self.interval_s,
            "runs": self.runs,
            "freed": self.freed,
            "last_ms": round(self.last_ms, 3),
            "max_ms": round(self.max_ms, 3),
        }


__all__ = ["GC_GEN0_THRESHOLD", "GC_INTERVAL_S", "PeriodicCollection", "tune_gc_for_steady_state"]
