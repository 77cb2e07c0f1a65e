# SPDX-License-Identifier: Apache-2.0
"""Several backend children behind one client (`SIE_IPC_SOCKET_PATHS`, sidecar-behaviour §9.5, §10).

A pod may run one backend process per GPU. Each child gets its own `IpcClient`; a model is *placed*
on the child that answered its `EnsureModelReady` and its batches go there. A new placement takes the
child minimising (unready while some child is ready, models placed, pending cost, pending items,
batches in flight, index), as scheduler-and-prep §5 says; pending work is what the schedulers of
the models placed on a child hold (`pressure`). One deliberate difference: a ready child that
already lists the model as loaded (last Ping round) is taken first, so the same weights are not
loaded a second time. A child that fails at the transport level loses its placements, so the next
group of that model is placed again (on a live child) instead of NAKing until the dead one returns.

Config writes fan out to every child in turn (§9.5). For their duration the pool is *quarantined*:
every model call fails at once with the §9.5 server error (work is NAKed with the base delay) and
the heartbeat counts no child ready. A fan-out that every child applied, with agreeing hashes (and,
for a replace, the same applied models), lifts the quarantine; anything else keeps it until a later
fan-out succeeds. A child that restarts comes back without the pool's config and no fan-out follows
by itself: hash-pinned work is sent only to a child whose last Ping attests the advertised hash
(`attest`, checked by its client on the connection the batch goes to), and the reconciler resyncs it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ..errors import IpcServerError, IpcTransportError
from .client import Attest, IpcClient
from .types import READY, ConfigResponse, GenerateEvent, PingResponse, ReadyResponse

if TYPE_CHECKING:
    from .requests import EncodedBody

T = TypeVar("T")

QUARANTINED: Final = "adapter worker pool config fanout incomplete; pool quarantined"


class BackendChildren:
    """One `IpcClient` per child socket, with model placement and the config fan-out."""

    def __init__(self, clients: Sequence[IpcClient]) -> None:
        if not clients:
            raise ValueError("at least one backend child is needed")
        self.clients = list(clients)
        self._placed: dict[str, int] = {}
        #: Models each child listed as loaded in its last Ping (for placement).
        self._loaded: list[frozenset[str]] = [frozenset() for _ in self.clients]
        self._ready: list[bool] = [True for _ in self.clients]
        #: Batch calls in flight per child.
        self._inflight: list[int] = [0 for _ in self.clients]
        #: model -> (pending cost, pending items) of its scheduler (the dispatcher sets it).
        self.pressure: Callable[[str], tuple[int, int]] = lambda model: (0, 0)
        self.quarantined = False
        self.fanouts = 0

    @property
    def socket_paths(self) -> list[str]:
        return [c.socket_path for c in self.clients]

    @property
    def runs_batches(self) -> bool:
        return all(c.runs_batches for c in self.clients)

    def placement(self) -> dict[str, int]:
        """Model → child index, for /debug/state."""
        return dict(self._placed)

    # -- the heartbeat's view -----------------------------------------------------------------

    def observe(self, index: int, pong: PingResponse | BaseException) -> None:
        """Record one child's Ping answer (its health and loaded models) for placement; a child that
        cannot be reached loses its placements (a slow one, a timeout, keeps them)."""
        if isinstance(pong, BaseException):
            self._ready[index] = False
            if isinstance(pong, IpcTransportError):
                self._unplace(index)
            return
        self._ready[index] = pong.ready
        self._loaded[index] = frozenset(pong.loaded_models)

    def pingers(self) -> list[_ChildPinger]:
        """One ping target per child for the heartbeat: each records its answer here, and answers
        not ready while the pool is quarantined (§10)."""
        return [_ChildPinger(self, i) for i in range(len(self.clients))]

    # -- model calls --------------------------------------------------------------------------

    def _check(self) -> None:
        if self.quarantined:
            raise IpcServerError(QUARANTINED)

    def _unplace(self, index: int) -> None:
        for model in [m for m, i in self._placed.items() if i == index]:
            del self._placed[model]

    def _choose(self, model_id: str) -> int:
        placed = self._placed.get(model_id)
        if placed is not None:
            return placed
        any_ready = any(self._ready)
        holding = [i for i, ready in enumerate(self._ready) if (ready or not any_ready) and model_id in self._loaded[i]]
        if holding:
            return holding[0]
        load = Counter(self._placed.values())
        cost = [0] * len(self.clients)
        items = [0] * len(self.clients)
        for model, index in self._placed.items():
            c, n = self.pressure(model)
            cost[index] += c
            items[index] += n
        return min(
            range(len(self.clients)),
            key=lambda i: (any_ready and not self._ready[i], load[i], cost[i], items[i], self._inflight[i], i),
        )

    async def _on(self, index: int, call: Callable[[IpcClient], Any]) -> Any:
        try:
            return await call(self.clients[index])
        except IpcTransportError:  # gone (killed, restarting): its models go elsewhere next time
            self._ready[index] = False
            self._unplace(index)
            raise

    def grow_for(self, model_id: str, width: int | None) -> int:
        """`IpcClient.grow_for` on the child the model is placed on (none placed: nothing grows)."""
        index = self._placed.get(model_id)
        if index is None:
            return 0
        return self.clients[index].grow_for(model_id, width)

    async def ensure_model_ready(self, model_id: str) -> ReadyResponse:
        """EnsureModelReady on the model's child (placing it first); `failed` unplaces it."""
        self._check()
        index = self._choose(model_id)
        self._placed[model_id] = index
        answer: ReadyResponse = await self._on(index, lambda c: c.ensure_model_ready(model_id))
        if answer.state != READY and answer.state not in ("loading_started", "loading_in_progress"):
            self._placed.pop(model_id, None)
        return answer

    async def client_for(self, model_id: str) -> _PlacedClient:
        """The batch client of the model's child (quarantine checked at each call). A model whose
        child was lost since its readiness was checked is made ready on its new child first: a batch
        never goes to a child that has not answered `ready` for its model."""
        self._check()
        index = self._placed.get(model_id)
        if index is None:
            answer = await self.ensure_model_ready(model_id)
            index = self._placed.get(model_id)
            if answer.state != READY or index is None:
                raise IpcServerError(f"model {model_id} is not ready on its new backend child ({answer.state})")
        return _PlacedClient(self, index)

    async def signal_generate_cancel(self, request_id: str) -> bool:
        """Sent to every child (§9.5): matched if any child had the generation; a child that cannot
        be reached does not stop the others."""
        answers = await asyncio.gather(
            *(c.signal_generate_cancel(request_id) for c in self.clients), return_exceptions=True
        )
        return any(a is True for a in answers)

    async def drain(self, deadline_ms: int = 15000) -> bool:
        """Drain every child (§15.4 step 7); True when every one acknowledged."""
        answers = await asyncio.gather(*(c.drain(deadline_ms) for c in self.clients), return_exceptions=True)
        return all(a is True for a in answers)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.clients))

    # -- the config fan-out (§9.5) ------------------------------------------------------------

    async def apply_model_config(self, body: dict[str, Any]) -> ConfigResponse:
        return await self._fan_out(lambda c: c.apply_model_config(body), replace=False)

    async def replace_model_configs(self, body: dict[str, Any]) -> ConfigResponse:
        return await self._fan_out(lambda c: c.replace_model_configs(body), replace=True)

    async def _fan_out(self, call: Callable[[IpcClient], Any], *, replace: bool) -> ConfigResponse:
        """Every child in turn, quarantined throughout; the quarantine lifts only on a clean merge.
        An IPC failure raises (the caller retries transient ones) with the pool still quarantined."""
        self.quarantined = True
        self.fanouts += 1
        answers: list[ConfigResponse] = [await call(client) for client in self.clients]
        merged = merge(answers, replace=replace)
        if merged.applied:
            self.quarantined = False
        return merged


class _PlacedClient:
    """The batch calls of one child, failing at once while the pool is quarantined."""

    __slots__ = ("_children", "_index")

    def __init__(self, children: BackendChildren, index: int) -> None:
        self._children = children
        self._index = index

    @property
    def runs_batches(self) -> bool:
        return self._children.clients[self._index].runs_batches

    @property
    def reported_hash(self) -> str | None:
        return self._children.clients[self._index].reported_hash

    async def run_batch_with(
        self,
        body: EncodedBody,
        decode: Callable[[memoryview], T],
        *,
        attest: Attest | None = None,
        timeout_s: float | None = None,
    ) -> T:
        children = self._children
        children._check()
        children._inflight[self._index] += 1
        try:
            result: T = await children._on(
                self._index, lambda c: c.run_batch_with(body, decode, attest=attest, timeout_s=timeout_s)
            )
        finally:
            children._inflight[self._index] -= 1
        return result

    def generate(
        self, model_id: str, work_item_msgpack: bytes, *, frame_timeout_s: float = 300.0
    ) -> AsyncIterator[GenerateEvent]:
        """ProcessGenerate on a fresh connection to this child (quarantine checked first)."""
        self._children._check()
        return self._children.clients[self._index].generate(
            model_id, work_item_msgpack, frame_timeout_s=frame_timeout_s
        )

    async def process_batch(
        self, method: str, body: bytes, *, attest: Attest | None = None, timeout_s: float | None = None
    ) -> Any:
        children = self._children
        children._check()
        children._inflight[self._index] += 1
        try:
            return await children._on(
                self._index, lambda c: c.process_batch(method, body, attest=attest, timeout_s=timeout_s)
            )
        finally:
            children._inflight[self._index] -= 1


class _ChildPinger:
    """What the heartbeat pings for one child."""

    __slots__ = ("_children", "_index")

    def __init__(self, children: BackendChildren, index: int) -> None:
        self._children = children
        self._index = index

    async def ping(self) -> PingResponse:
        client = self._children.clients[self._index]
        try:
            pong = await client.ping()
        except Exception as exc:
            self._children.observe(self._index, exc)
            raise
        self._children.observe(self._index, pong)
        if self._children.quarantined and pong.ready:
            return PingResponse(
                timestamp_ms=pong.timestamp_ms,
                worker_id=pong.worker_id,
                ready=False,
                bundle_config_hash=pong.bundle_config_hash,
                loaded_models=pong.loaded_models,
                loading_models=pong.loading_models,
            )
        return pong

    async def probe_draining(self, model_id: str = "") -> bool:
        return await self._children.clients[self._index].probe_draining(model_id)


def merge(answers: Sequence[ConfigResponse], *, replace: bool) -> ConfigResponse:
    """§9.5: applied only if every child applied and the non-empty hashes agree (and, for a replace,
    every child applied the same models); `config_version` is the maximum."""
    hashes = {a.bundle_config_hash for a in answers if a.bundle_config_hash}
    applied = all(a.applied for a in answers) and len(hashes) <= 1
    if replace and len({frozenset(a.applied_models) for a in answers}) > 1:
        applied = False
    first = answers[0]
    unsupported = sorted({m for a in answers for m in a.unsupported_models})
    return ConfigResponse(
        applied=applied,
        bundle_config_hash=next(iter(hashes)) if len(hashes) == 1 else first.bundle_config_hash,
        config_version=max(a.config_version for a in answers),
        applied_models=first.applied_models,
        applied_profiles=tuple(sorted({p for a in answers for p in a.applied_profiles})),
        unsupported_models=tuple(unsupported),
    )


__all__ = ["QUARANTINED", "BackendChildren", "merge"]
