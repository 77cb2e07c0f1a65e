# SPDX-License-Identifier: Apache-2.0
"""The pull loop (`pipeline/feed.py`) takes a batch from its source only when a handling slot is
free: a batch taken and then left waiting for a slot is neither in the consumer's buffer (which a
pause NAKs back) nor with a handler (which progress-ACKs it), so nothing renewed its lease. Found by
the chaos rig's backend_stall: with every handler waiting on a hung backend, the next pulled group
waited out ack_wait in that gap, ran on another pod, and ran again here when the backend woke."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from sie_sidecar.pipeline.feed import feed
from sie_sidecar.pipeline.source import SettleHandle
from sie_sidecar.sched.quantum import LatencyWindow, QuantumController

from .memory import MemoryMessage, MemorySource


def _messages(n: int) -> list[MemoryMessage]:
    return [MemoryMessage(subject=f"s.{i}", data=b"x") for i in range(n)]


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.001)


Handler = Callable[[Sequence[SettleHandle], Callable[[int], None]], Coroutine[Any, Any, None]]


def _start(
    source: MemorySource, handle: Handler, *, inflight: int, stop: asyncio.Event, tasks: set[asyncio.Task[None]]
) -> asyncio.Task[None]:
    """The pull loop, one message a batch, no idle bypass (so only the slots decide)."""
    quantum = QuantumController(LatencyWindow(), min_ms=1, max_ms=2, target_p50_ms=10)
    return asyncio.create_task(
        feed(source, handle, budget=1, inflight=inflight, stop=stop, tasks=tasks, quantum=quantum, idle_bypass=False)
    )


async def test_no_batch_is_taken_while_every_slot_is_busy() -> None:
    source = MemorySource()
    release = asyncio.Event()
    handled: list[list[str]] = []

    async def handle(batch: Sequence[SettleHandle], settled: Callable[[int], None]) -> None:
        handled.append([m.subject for m in batch])
        await release.wait()  # a handler stuck on a hung backend
        settled(len(batch))

    stop, tasks = asyncio.Event(), set[asyncio.Task[None]]()
    loop = _start(source, handle, inflight=2, stop=stop, tasks=tasks)
    source.put(_messages(5))
    await _until(lambda: len(handled) == 2)
    await asyncio.sleep(0.05)  # the loop would have taken the third batch by now
    assert source.unsettled == 2  # only what the two handlers hold was taken
    assert len(source._queue) == 3  # the rest is still the source's (a pause would return it)

    release.set()
    await _until(lambda: len(handled) == 5 and source.unsettled == 0)
    stop.set()
    await asyncio.wait_for(loop, 5)


async def test_stop_while_waiting_for_a_slot_takes_nothing() -> None:
    source = MemorySource()
    stuck = asyncio.Event()

    async def handle(batch: Sequence[SettleHandle], settled: Callable[[int], None]) -> None:
        await stuck.wait()

    stop, tasks = asyncio.Event(), set[asyncio.Task[None]]()
    loop = _start(source, handle, inflight=1, stop=stop, tasks=tasks)
    source.put(_messages(3))
    await _until(lambda: source.unsettled == 1)
    stop.set()
    await asyncio.wait_for(loop, 5)  # the loop ends although its only slot stays busy
    assert source.unsettled == 1 and len(source._queue) == 2
    stuck.set()
    await asyncio.gather(*tasks)
