# SPDX-License-Identifier: Apache-2.0
"""The readiness wait of one model group (§4.2): the model's cached `ready` answer, or one
EnsureModelReady (progress-ACKing the group while it runs) and its verdict: ready (cached), failed
(published), loading (the group is to be parked, `Loading`), anything else NAKed. Not to be confused
with `readiness`, what the IPC heartbeat learnt about the backend as a whole."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from ..errors import MODEL_LOAD_FAILED
from ..ipc.types import ReadyResponse
from .columns import unsettled
from .delivery import Delivery, Settler
from .lanes import ModelLanes
from .outcomes import Outcomes
from .stages import PARKED_PROGRESS_S, BackendClient, warn
from .sweeps import Sweeper

if TYPE_CHECKING:
    from .dispatcher import DispatchSettings

T = TypeVar("T")

#: How long a `ready` answer is reused for later groups of the same model. Any IPC failure or
#: `nak_retry` outcome forgets it, so a backend that unloaded the model is asked again at once.
READY_CACHE_S = 1.0


@dataclass(frozen=True, slots=True)
class Loading:
    """The model answered loading (`state`: loading_started or loading_in_progress): the group is
    to be parked."""

    state: str


class ReadinessGate:
    """One readiness answer per model group, cached per model for READY_CACHE_S."""

    def __init__(
        self,
        settings: DispatchSettings,
        backend: BackendClient,
        outcomes: Outcomes,
        *,
        settler: Settler,
        sweeper: Sweeper,
        lanes: ModelLanes,
    ) -> None:
        self._s = settings
        self._backend = backend
        self._out = outcomes
        self._settler = settler
        self._sweeper = sweeper
        self._lanes = lanes

    def cached(self, model: str) -> ReadyResponse | None:
        """The model's `ready` answer if it is younger than READY_CACHE_S."""
        cached = self._lanes.model(model).ready
        return cached[1] if cached is not None and time.monotonic() - cached[0] < READY_CACHE_S else None

    async def first_ready(self, model: str, ds: list[Delivery]) -> ReadyResponse | Loading | None:
        """One readiness answer for a group holding a slot (§4.2): ready, or `Loading` (every item
        progress-ACKed; the caller parks the group so that it frees the slot while the model loads:
        the v0.7.1 loop slept here, and 4 loading models stopped every warm one), or None (settled)."""
        ds[:] = await self._sweeper.drop_cancelled(unsettled(ds))
        if not ds:
            return None
        if (cached := self.cached(model)) is not None:
            return cached
        try:
            ready = await self._progressing(self._backend.ensure_model_ready(model), ds)
        except Exception as exc:  # any IPC failure (transport, timeout, server, decode): NAK the group
            warn.warning("EnsureModelReady failed", key=model, extra={"model": model, "error": repr(exc)})
            await self._out.nak_all(ds, self._s.nak_delay_ms)
            return None
        return await self.loading_verdict(model, ds, ready)

    async def _progressing(self, call: Awaitable[T], ds: list[Delivery]) -> T:
        """Await `call`, progress-ACKing `ds` each progress interval while it runs (law 3). A backend
        that hangs instead of dying leaves EnsureModelReady open for up to 900 s: without this, the
        group's leases ran out at ack_wait and its items ran twice, here and on another worker."""
        after = self._lanes.settings.scheduler.progress_after_s
        every = min(PARKED_PROGRESS_S, after) if after > 0 else PARKED_PROGRESS_S
        task = asyncio.ensure_future(call)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=every)
                if done:
                    return task.result()
                await self._sweeper.keepalive(ds)
        except asyncio.CancelledError:
            task.cancel()
            raise

    async def loading_verdict(
        self, model: str, ds: list[Delivery], ready: ReadyResponse
    ) -> ReadyResponse | Loading | None:
        """One EnsureModelReady answer (§4.2): ready (cached), failed (published), loading (every item
        progress-ACKed: `Loading`), anything else NAKed; None when the group was settled here."""
        base = self._s.nak_delay_ms
        if ready.state == "ready":
            self._lanes.model(model).ready = (time.monotonic(), ready)
            return ready
        if ready.state == "failed":
            await self._out.publish_errors(
                ds, MODEL_LOAD_FAILED, f"Model '{model}' failed to load permanently.", nak_on_failure=True
            )
            return None
        if ready.state not in ("loading_started", "loading_in_progress"):
            await self._out.nak_all(ds, base)  # retry_later, or a state this version does not know
            return None
        for d in ds:
            if not await self._settler.progress(d):
                await self._out.nak_all(ds, base)
                return None
        return Loading(ready.state)
