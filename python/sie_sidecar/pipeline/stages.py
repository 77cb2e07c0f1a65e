# SPDX-License-Identifier: Apache-2.0
"""What the dispatcher's stages (`sweeps`, `lanes`, `readiness_gate`, `parking`, `preparation`,
`execution`) share: the backend calls they make, the one logger they write under, the NAK reason and
progress interval more than one of them uses, and `Forward`, which lets the dispatcher expose a
stage's attribute as its own. It exists so that no stage imports another only for these."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar, cast, overload

from ..ipc.types import ReadyResponse
from ..logs import Throttled

if TYPE_CHECKING:
    from ..ipc.requests import EncodedBody

T = TypeVar("T")

#: The stages were the dispatcher's methods: they log under its name, so log-level targets
#: (`sie_sidecar::pipeline::dispatcher=debug`) and the `logger` field of their lines stay as they were.
log = logging.getLogger("sie_sidecar.pipeline.dispatcher")
#: Warnings that repeat per batch or per group while a dependency keeps failing, rate-limited.
warn = Throttled(log)

#: A parked or waiting group's items are progress-ACKed at least this often (§4.5), whatever the backend does.
PARKED_PROGRESS_S = 15.0
#: The NATS metric reason of a NAK for a model the backend reports it cannot serve (§13, newer).
MODEL_UNSUPPORTED: Final = "model_unsupported"


class BatchClient(Protocol):
    """The batch calls of the backend child that serves one model."""

    @property
    def runs_batches(self) -> bool:
        """False once the backend answered RunBatch `unknown method`: per-op methods from then on."""

    @property
    def reported_hash(self) -> str | None:
        """The bundle-config hash the child reported in its last Ping (None: unknown)."""

    async def run_batch_with(
        self,
        body: EncodedBody,
        decode: Callable[[memoryview], Any],
        *,
        attest: Callable[[str | None], bool] | None = None,
        timeout_s: float | None = None,
    ) -> Any: ...
    async def process_batch(
        self,
        method: str,
        body: bytes,
        *,
        attest: Callable[[str | None], bool] | None = None,
        timeout_s: float | None = None,
    ) -> Any: ...


class BackendClient(Protocol):
    """The IPC calls the dispatcher makes (`ipc.client.IpcClient`, or `ipc.children.BackendChildren`
    for several backend children, which places each model on one of them)."""

    @property
    def runs_batches(self) -> bool:
        """False once the backend answered RunBatch `unknown method`: per-op methods from then on."""

    async def ensure_model_ready(self, model_id: str) -> ReadyResponse: ...
    async def client_for(self, model_id: str) -> BatchClient: ...


class Forward(Generic[T]):
    """An attribute of the dispatcher that lives on one of its stages (`stage`, the dispatcher's
    attribute holding it): read and set there, so the runtime and tests keep one surface."""

    __slots__ = ("_name", "_stage")

    def __init__(self, stage: str, name: str) -> None:
        self._stage = stage
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Forward[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Forward[T] | T:
        if obj is None:
            return self
        return cast("T", getattr(getattr(obj, self._stage), self._name))

    def __set__(self, obj: object, value: T) -> None:
        setattr(getattr(obj, self._stage), self._name, value)
