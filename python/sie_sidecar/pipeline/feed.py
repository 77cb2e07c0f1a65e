# SPDX-License-Identifier: Apache-2.0
"""The pull loop of sidecar-behaviour §5.1, over any `Source`: batches in, one handling task each, bounded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from ..sched.quantum import QuantumController
from .source import SettleHandle, Source


async def feed(
    source: Source,
    handle: Callable[[Sequence[SettleHandle], Callable[[int], None]], Coroutine[Any, Any, None]],
    *,
    budget: int | Callable[[], int],
    inflight: int,
    stop: asyncio.Event,
    tasks: set[asyncio.Task[None]],
    quantum: QuantumController,
    idle_bypass: bool = True,
    on_idle: Callable[[], None] | None = None,
    busy: Callable[[], bool] | None = None,
) -> None:
    """Take coalesced batches from one source and hand each to the dispatcher (§5.1 pull loop).

    The quantum comes from the controller for every batch, and `budget` (a number, or a callable
    read per batch) caps its size. With `idle_bypass`, coalescing ends as
    soon as no batch is being handled (`tasks` is shared by every pull loop) and `busy()` (the
    schedulers have work queued or in flight) is false: waiting for more messages only pays while the
    backend is busy, so an idle worker takes what is there at once.
    """
    slots = asyncio.Semaphore(max(1, inflight))
    size = budget if callable(budget) else (lambda: budget)

    def idle() -> bool:
        return not tasks and (busy is None or not busy())

    stop_early = idle if idle_bypass else None

    def finished(t: asyncio.Task[None]) -> None:
        tasks.discard(t)
        slots.release()
        if not tasks and on_idle is not None:
            on_idle()

    loop = asyncio.get_running_loop()
    stopped = asyncio.ensure_future(stop.wait())  # one waiter for the whole loop, not one per batch
    try:
        while not stopped.done():
            # The slot first, then the batch: a batch taken and left waiting for a slot was neither in
            # the source's buffer (a pause returns that) nor with a handler (which progress-ACKs it),
            # so its leases ran out while every handler waited on a hung backend (law 3).
            quantum_s = quantum.quantum_s()
            if slots.locked():
                waited_from = loop.time()
                if not await _unless_stopped(asyncio.ensure_future(slots.acquire()), stopped):
                    break
                # The wait for the slot was coalescing time already (the buffer kept filling): only
                # the rest of the quantum is spent waiting for more, as when the batch was taken first.
                quantum_s = max(0.0, quantum_s - (loop.time() - waited_from))
            else:
                await slots.acquire()  # free: returns without suspending, no task
            next_batch = asyncio.ensure_future(source.next_batch(max(1, size()), quantum_s, stop_early))
            if not await _unless_stopped(next_batch, stopped):
                slots.release()
                break
            batch = next_batch.result()
            if not batch:
                slots.release()
                continue
            task: asyncio.Task[None] = asyncio.create_task(handle(batch, source.settled))
            tasks.add(task)
            task.add_done_callback(finished)
    finally:
        stopped.cancel()


async def _unless_stopped(call: asyncio.Future[Any], stopped: asyncio.Future[Any]) -> bool:
    """Wait for `call`; False (and `call` cancelled, so it took nothing) when `stopped` came first."""
    await asyncio.wait({call, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if call.done():
        return True
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await call
    return False


__all__ = ["feed"]
