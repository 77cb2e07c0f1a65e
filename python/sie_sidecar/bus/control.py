# SPDX-License-Identifier: Apache-2.0
"""Control subscriptions (sidecar-behaviour §4.3, §7, §14): `work_cancel.>` and `batch_cancel.>` record
tombstones that the pipeline's intake and execute stages consult; `cancel.>` stops a generation and
(newer than v0.7.1) records the request tombstone too. A cancel that carries a reply subject or a
`Nats-` header is not the gateway's and is dropped (§3, newer than v0.7.1)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from .. import wire
from ..logs import Throttled
from .sync import sync_with_server

log = logging.getLogger(__name__)
_warn = Throttled(log)


def foreign_cancel(msg: Msg) -> bool:
    """A cancel with a reply subject or any `Nats-` header (case-insensitive) was not published by a
    gateway as a plain Core message (a request, a JetStream copy): dropped, logged (rate-limited)."""
    headers = msg.headers or {}
    if msg.reply or any(isinstance(name, str) and name.lower().startswith("nats-") for name in headers):
        _warn.warning(
            "cancel message with a reply subject or a Nats- header dropped",
            key=f"foreign-cancel:{msg.subject.split('.', 1)[0]}",
            extra={"subject": msg.subject, "reply": bool(msg.reply)},
        )
        return True
    return False


class TombstoneSink(Protocol):
    """The two tombstone sets the cancel handlers write (the dispatcher owns them)."""

    @property
    def tombstones(self) -> wire.TombstoneSet: ...
    @property
    def batch_tombstones(self) -> wire.BatchTombstones: ...
    async def cancel_generation(self, request_id: str) -> None: ...


def cancel_handlers(
    dispatcher: TombstoneSink, worker_id: str
) -> tuple[Callable[[Msg], Awaitable[None]], Callable[[Msg], Awaitable[None]], Callable[[Msg], Awaitable[None]]]:
    async def on_work_cancel(msg: Msg) -> None:
        parsed = wire.parse_work_cancel(msg.subject)
        if parsed is not None and not foreign_cancel(msg):
            dispatcher.tombstones.record(*parsed)

    async def on_batch_cancel(msg: Msg) -> None:
        request_id = wire.parse_batch_cancel(msg.subject, worker_id)
        if request_id is not None and not foreign_cancel(msg):
            dispatcher.batch_tombstones.record(request_id)

    async def on_generate_cancel(msg: Msg) -> None:
        parsed = wire.parse_generate_cancel(msg.subject)
        if parsed is not None and not foreign_cancel(msg):
            dispatcher.tombstones.record(*parsed)  # newer than v0.7.1: a request tombstone too (§7)
            await dispatcher.cancel_generation(parsed[1])  # SignalGenerateCancel to every child (§14)

    return on_work_cancel, on_batch_cancel, on_generate_cancel


async def subscribe_cancels(
    nc: NatsClient, sink: TombstoneSink, worker_id: str, subs: list[Subscription], *, sync_via: str | None = None
) -> None:
    """Subscribe `work_cancel.>`, `batch_cancel.>` and `cancel.>` (appended to `subs` as they exist) and
    wait until the server has them: a SUB only sits in the client's buffer until written, and the server
    must have the cancel subscriptions before the first pull, or a cancel sent at start-up would go
    unseen (§2.1)."""
    on_work_cancel, on_batch_cancel, on_generate_cancel = cancel_handlers(sink, worker_id)
    subs.append(await nc.subscribe("work_cancel.>", cb=on_work_cancel))
    subs.append(await nc.subscribe("batch_cancel.>", cb=on_batch_cancel))
    subs.append(await nc.subscribe("cancel.>", cb=on_generate_cancel))
    await sync_with_server(nc, via=sync_via)  # not `nc.flush()`: its PING overtakes the queued SUBs (bus/sync.py)


async def unsubscribe_all(subs: list[Subscription]) -> None:
    """Drop the cancel subscriptions; idempotent (the drain and the exit stack both call it)."""
    while subs:
        with contextlib.suppress(Exception):
            await subs.pop().unsubscribe()


__all__ = [
    "Subscription",
    "TombstoneSink",
    "cancel_handlers",
    "foreign_cancel",
    "subscribe_cancels",
    "unsubscribe_all",
]
