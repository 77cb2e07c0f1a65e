# SPDX-License-Identifier: Apache-2.0
"""The config gate (sidecar-behaviour §5.5, §9.4): an item carrying a bundle-config hash runs only
while that hash is the worker's advertised one, checked at the group pre-check and again right before
execution, under the execution barrier that every config mutation takes exclusively.

The advertised state is one (epoch, hash, unsupported models) triple. A live apply or an export
commits it as a whole; the backend's Ping hash is adopted only while nothing was ever committed and
the hash is empty, so a backend that drifted from the control plane can never silently move it
(quarantine: work pinned to the new hash is NAKed until reconciliation succeeds).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..logs import Throttled
from ..telemetry import ModelCatalog

if TYPE_CHECKING:
    from ..wire.workitem import WorkItem

_warn = Throttled(logging.getLogger(__name__))


class ExecutionBarrier:
    """A writer-preferring shared/exclusive lock (§5.5): executions share it, config mutation takes it
    alone, and a waiting writer stops new executions from entering, so a config change waits only for
    the batches already at the backend, never for a stream of later ones.

    Uncontended, entering the shared side is two attribute reads and an increment (once per batch)."""

    def __init__(self) -> None:
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def executions(self) -> int:
        """Executions holding the shared side now."""
        return self._readers

    @property
    def writing(self) -> bool:
        """Whether a config mutation holds the barrier (or waits for it)."""
        return self._writing or self._writers_waiting > 0

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _wait(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        """One execution: from just before the hash check until the backend call returns."""
        while self._writing or self._writers_waiting:
            await self._wait()
        self._readers += 1
        try:
            yield
        finally:
            self._readers -= 1
            if not self._readers:
                self._wake()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """One config mutation: no execution runs while it is held."""
        self._writers_waiting += 1
        try:
            while self._writing or self._readers:
                await self._wait()
        except BaseException:
            self._writers_waiting -= 1
            self._wake()  # executions held back for this writer may go
            raise
        self._writers_waiting -= 1
        self._writing = True
        try:
            yield
        finally:
            self._writing = False
            self._wake()


class ConfigState:
    """The worker's advertised bundle-config state; `current` is None while no hash is advertised.

    `on_refused` is called (no arguments) when the gate refuses an item's hash: the reconciler uses
    it to look for drift at once rather than at its next poll, so quarantined work waits less."""

    def __init__(self, initial: str = "") -> None:
        self._hash = initial
        self.epoch = 0
        self.committed = False
        self._unsupported: frozenset[str] = frozenset()
        self.unsupported_models: tuple[str, ...] = ()
        self.barrier = ExecutionBarrier()
        self.on_refused: Callable[[], None] | None = None
        #: Called when a backend child does not attest the advertised config (`executes_on`).
        self.on_diverged: Callable[[], None] | None = None
        #: The telemetry (model, profile) catalog (§13): extended by trusted commits (§9.2 step
        #: 12), replaced by full exports; the runtime seeds it from SIE_METRIC_MODEL_ALLOWLIST.
        self.catalog = ModelCatalog()

    @property
    def current(self) -> str | None:
        """The advertised hash, or None while there is none (then only legacy items pass)."""
        return self._hash or None

    def accepts_all(self, items: Iterable[WorkItem | None]) -> bool:
        """The group pre-check: every non-empty (pinned) hash is the advertised one, as `gate` says;
        `on_refused` is called when one is not. Empty (legacy) hashes always pass."""
        return self.gate(items) is not None

    def gate(self, items: Iterable[WorkItem | None]) -> bool | None:
        """The check right before execution: None when some item's hash is refused (`on_refused` is
        called), else whether any item is pinned to the advertised hash (legacy-only: False)."""
        hashes: list[str] = []
        for item in items:
            if item is not None and item.bundle_config_hash and item.bundle_config_hash not in hashes:
                hashes.append(item.bundle_config_hash)
        return self.gate_hashes(hashes)

    def accepts_hashes(self, hashes: Sequence[Any]) -> bool:
        """`accepts_all` over a batch's distinct hashes (`columns.config_hashes`: one native pass)."""
        return self.gate_hashes(hashes) is not None

    def gate_hashes(self, hashes: Sequence[Any]) -> bool | None:
        """`gate` over a batch's distinct non-empty hashes (`columns.config_hashes`)."""
        current = self._hash
        for h in hashes:
            if h != current:
                if self.on_refused is not None:
                    self.on_refused()
                return None
        return bool(hashes)

    def executes_on(self, reported: str | None) -> bool:
        """Whether a backend child that reported `reported` in its last Ping may run pinned work: it
        must attest the advertised hash. A child that attests nothing ("") is trusted only while no
        config was committed (a legacy backend); once the control plane wrote one, "" is a child that
        lost it (restarted). Unknown (None: no Ping since a transport failure) is refused. A refusal
        calls `on_diverged`, so the reconciler rewrites the backend's config from an export."""
        if reported is not None and (reported == self._hash or (not reported and not self.committed)):
            return True
        _warn.warning(
            "a backend child does not attest the advertised config; its hash-pinned work is NAKed",
            key="diverged",
            extra={"advertised": self._hash, "reported": reported},
        )
        if self.on_diverged is not None:
            self.on_diverged()
        return False

    def supports(self, model_id: str) -> bool:
        """False for a model the backend reported it cannot serve (case-insensitive; newer than v0.7.1)."""
        return not self._unsupported or model_id.lower() not in self._unsupported

    def adopt(self, backend_hash: str) -> None:
        """Take the backend's Ping hash while nothing is committed and none is advertised (§9.4)."""
        if not self.committed and not self._hash and backend_hash:
            self._hash = backend_hash

    def commit(self, epoch: int, bundle_hash: str, unsupported: Iterable[str] = (), *, force: bool = False) -> bool:
        """§9.2 step 12: with epoch 0 set the hash and leave the epoch; otherwise raise the epoch and set
        the hash together, or change nothing when the epoch is not greater (`force`: an export that
        rewinds or re-asserts the epoch). Returns whether the advertised state changed."""
        models = tuple(sorted({m.strip() for m in unsupported if m.strip()}))
        if epoch != 0 and not force and epoch <= self.epoch:
            return False
        before = (self.epoch, self._hash, self.unsupported_models, self.committed)
        if epoch != 0 or force:
            self.epoch = epoch
        self._hash = bundle_hash
        self.unsupported_models = models
        self._unsupported = frozenset(m.lower() for m in models)
        self.committed = True
        return before != (self.epoch, self._hash, self.unsupported_models, self.committed)

    def raise_epoch(self, epoch: int) -> bool:
        """An epoch bump (§9.2 step 6): the hash stays; returns whether the epoch rose."""
        if epoch <= self.epoch:
            return False
        self.epoch = epoch
        return True

    def is_stale(self, epoch: int) -> bool:
        """§9.2 step 5: older than ours, or the same non-zero epoch."""
        return epoch < self.epoch or (epoch == self.epoch and epoch != 0)

    def snapshot(self) -> dict[str, object]:
        """For /debug/state."""
        return {
            "epoch": self.epoch,
            "bundle_config_hash": self._hash,
            "committed": self.committed,
            "unsupported_models": list(self.unsupported_models),
            "config_writer_waiting": self.barrier.writing,
            "executions": self.barrier.executions,
        }


__all__ = ["ConfigState", "ExecutionBarrier"]
