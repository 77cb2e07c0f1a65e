# SPDX-License-Identifier: Apache-2.0
"""Parked groups (§5.3, newer than v0.7.1): a group whose model answered loading leaves its group slot
and its pull permits for a task of its own, bounded by the parked-item capacity (the fetch budget).
The task re-probes the model, progress-ACKing the items, and hands the group back to the dispatcher's
group runner once the model is ready; at its deadline, at shutdown or on failure it NAKs the group."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ..ipc.types import ReadyResponse
from .config_gate import ConfigState
from .delivery import Delivery
from .outcomes import Outcomes
from .readiness_gate import Loading, ReadinessGate
from .stages import MODEL_UNSUPPORTED, PARKED_PROGRESS_S, BackendClient, log, warn
from .sweeps import Sweeper

if TYPE_CHECKING:
    from .dispatcher import DispatchSettings

LOADING_RECHECK_CAP_MS = 15_000

#: The dispatcher's group runner: (model, deliveries, plain op, the ready answer waited for).
RunGroup = Callable[[str, list[Delivery], str | None, ReadyResponse | None], Awaitable[None]]


class Parking:
    """The parked groups: their tasks and the parked-item capacity they share."""

    def __init__(
        self,
        settings: DispatchSettings,
        backend: BackendClient,
        outcomes: Outcomes,
        *,
        sweeper: Sweeper,
        gate: ReadinessGate,
        config: ConfigState,
        shutdown: asyncio.Event,
        run_group: RunGroup,
        shutdown_nak_ms: Callable[[], int],
    ) -> None:
        self._s = settings
        self._backend = backend
        self._out = outcomes
        self._sweeper = sweeper
        self._gate = gate
        self._config = config
        self._shutdown = shutdown
        self._run_group = run_group
        #: Items of groups parked while their model loads (§5.3, newer than v0.7.1): they hold no
        #: group slot and no pull permit, but one of these (capacity: the fetch budget).
        self._parked_free = max(1, settings.fetch_budget)
        self._parked: set[asyncio.Task[None]] = set()
        #: The NAK delay for work handed back at shutdown (the runtime makes it outlast its pull requests).
        self.shutdown_nak_ms = shutdown_nak_ms

    def park(self, model: str, ds: list[Delivery], plain_op: str | None, state: str) -> None:
        """Move a loading model's group to its own task, off the group slot, so warm models keep
        flowing. Each item gives its pull permit back for a parked one; those beyond the parked
        capacity are NAKed with the base delay (§4.2, "parked-item capacity exhausted")."""
        live = [d for d in ds if not d.settled]
        take = min(len(live), self._parked_free)
        kept, over = live[:take], live[take:]
        if over:
            # One key for every model: the capacity is shared, and 10,000 cold models (a hostile subject
            # stream) made 10,000 lines at once (tests/pipeline/test_hostile_items.py).
            warn.warning(
                "parked-item capacity exhausted; NAKing",
                key="parked-capacity",
                extra={"model": model, "items": len(over)},
            )
            task = asyncio.create_task(self._out.nak_all(over, self._s.nak_delay_ms))
            self._parked.add(task)
            task.add_done_callback(self._parked.discard)
        if not kept:
            return
        self._parked_free -= len(kept)
        for d in kept:
            if d.release is not None:
                d.release(1)  # the pull loop may take more work meanwhile
            d.release = self._unpark
        task = asyncio.create_task(self._parked_group(model, kept, plain_op, state), name=f"parked:{model}")
        self._parked.add(task)
        task.add_done_callback(self._parked.discard)

    def _unpark(self, n: int) -> None:
        """A parked item was settled: its parked permit comes back."""
        self._parked_free += n

    async def _parked_group(self, model: str, ds: list[Delivery], plain_op: str | None, state: str) -> None:
        """Wait for the model without a group slot, progress-ACKing every PARKED_PROGRESS_S and
        after each loading answer; hand the group back at the deadline or at shutdown; once
        ready, refresh the progress once more and run it as any other group."""
        base = self._s.nak_delay_ms
        deadline = time.monotonic() + self._s.parked_deadline_s
        try:
            ready = await self._wait_parked(model, ds, deadline, state)
            if ready is None:
                return
            if self._shutdown.is_set():  # ready just as the process stops: hand the group back
                await self._out.nak_all(ds, self.shutdown_nak_ms())
                return
            await self._sweeper.keepalive(ds)  # refreshed once more before taking a group slot
            await self._run_group(model, ds, plain_op, ready)
        except Exception:
            log.exception("parked model group failed; NAKing what is left", extra={"model": model})
            await self._out.nak_all([d for d in ds if not d.settled], base)

    async def _wait_parked(self, model: str, ds: list[Delivery], deadline: float, state: str) -> ReadyResponse | None:
        """Re-probe a parked group's model after each pause (as v0.7.1 slept: the base delay after
        `loading_started`, twice it after `loading_in_progress`, at most 15 s), `state` being the
        last answer's. Each call races shutdown, the deadline and the PARKED_PROGRESS_S tick."""
        base = self._s.nak_delay_ms
        while True:
            wait_s = min(base if state == "loading_started" else 2 * base, LOADING_RECHECK_CAP_MS) / 1000.0
            try:
                await asyncio.wait_for(self._shutdown.wait(), max(0.0, min(wait_s, deadline - time.monotonic())))
            except TimeoutError:
                pass
            else:
                await self._out.nak_all(ds, self.shutdown_nak_ms())
                return None
            ds[:] = await self._sweeper.drop_cancelled([d for d in ds if not d.settled])
            if not ds:
                return None
            if not self._config.supports(model):  # §4.2: re-checked right before each readiness probe
                await self._out.nak_all(ds, base, MODEL_UNSUPPORTED)
                return None
            if (cached := self._gate.cached(model)) is not None:
                return cached
            ready = await self._parked_probe(model, ds, deadline)
            if ready is None:
                return None
            verdict = await self._gate.loading_verdict(model, ds, ready)
            if not isinstance(verdict, Loading):
                return verdict
            state = ready.state

    async def _parked_probe(self, model: str, ds: list[Delivery], deadline: float) -> ReadyResponse | None:
        """One EnsureModelReady for a parked group, progress-ACKing every PARKED_PROGRESS_S while it
        runs; the group is NAKed (and None returned) at the deadline, at shutdown or on failure."""
        base = self._s.nak_delay_ms
        call = asyncio.ensure_future(self._backend.ensure_model_ready(model))
        try:
            while not call.done():
                left = deadline - time.monotonic()
                if left <= 0 or self._shutdown.is_set():
                    call.cancel()
                    if left <= 0:
                        warn.warning(
                            "parked group waited past the redelivery envelope", key=model, extra={"model": model}
                        )
                    await self._out.nak_all(ds, base if left <= 0 else self.shutdown_nak_ms())
                    return None
                stop = asyncio.ensure_future(self._shutdown.wait())
                done, _ = await asyncio.wait(
                    {call, stop}, timeout=min(PARKED_PROGRESS_S, left), return_when=asyncio.FIRST_COMPLETED
                )
                stop.cancel()
                if not done:
                    await self._sweeper.keepalive(ds)
            return call.result()
        except asyncio.CancelledError:
            call.cancel()
            raise
        except Exception as exc:
            warn.warning("EnsureModelReady failed", key=model, extra={"model": model, "error": repr(exc)})
            await self._out.nak_all(ds, base)
            return None

    async def join(self, timeout_s: float) -> None:
        """Shutdown (§15.4 step 4): parked groups see the stop and NAK; wait for them, bounded;
        the unfinished are cancelled, and JetStream redelivers their items after ack_wait."""
        if not self._parked:
            return
        _, pending = await asyncio.wait(set(self._parked), timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("parked groups cancelled at shutdown", extra={"groups": len(pending)})
