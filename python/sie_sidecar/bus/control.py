# SPDX-License-Identifier: Apache-2.0
"""Control subscriptions (sidecar-behaviour §4.3): `work_cancel.>` and `batch_cancel.>` record tombstones
that the pipeline's intake and execute stages consult."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from nats.aio.msg import Msg

from .. import wire


class TombstoneSink(Protocol):
    """The two tombstone sets the cancel handlers write (the dispatcher owns them)."""

    @property
    def tombstones(self) -> wire.TombstoneSet: ...
    @property
    def batch_tombstones(self) -> wire.BatchTombstones: ...


def cancel_handlers(dispatcher: TombstoneSink, worker_id: str) -> tuple[Callable[[Msg], Awaitable[None]], ...]:
    async def on_work_cancel(msg: Msg) -> None:
        parsed = wire.parse_work_cancel(msg.subject)
        if parsed is not None:
            dispatcher.tombstones.record(*parsed)

    async def on_batch_cancel(msg: Msg) -> None:
        request_id = wire.parse_batch_cancel(msg.subject, worker_id)
        if request_id is not None:
            dispatcher.batch_tombstones.record(request_id)

    return on_work_cancel, on_batch_cancel


__all__ = ["TombstoneSink", "cancel_handlers"]
