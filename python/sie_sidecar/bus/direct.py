# SPDX-License-Identifier: Apache-2.0
"""Direct delivery: a nats-py subscription whose messages are handed to a plain function by nats-py's
reader itself, with no queue hop and no task wake-up per message (the pull consumers' deliveries,
the confirmed-ACK answers)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription


class DirectQueue:
    """Stands in for a subscription's pending `asyncio.Queue`: nats-py's reader calls `put_nowait` for
    every delivery, and this hands the message straight to the consumer, synchronously.

    With a callback subscription each message would cost a queue hop, a wake-up of the
    subscription's task and a coroutine for the callback, several µs a message at 20k+ msg/s. This
    leans on two nats-py internals (`Subscription._pending_queue`, `_pending_size`), checked by
    `direct_delivery_supported()` and by tests/integration/test_pull.py; without them the consumer
    uses a plain callback subscription.
    """

    __slots__ = ("_deliver", "_sub")

    def __init__(self, sub: Subscription, deliver: Callable[[Msg], None]) -> None:
        self._sub = sub
        self._deliver = deliver

    def put_nowait(self, msg: Msg) -> None:
        self._sub._pending_size -= len(msg.data)  # nats-py added it just before; nothing stays queued
        self._deliver(msg)

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def full(self) -> bool:
        return False

    def task_done(self) -> None:
        return None

    async def join(self) -> None:
        return None

    async def get(self) -> Msg:
        raise RuntimeError("direct-delivery subscriptions are never read from a queue")


def direct_delivery_supported(sub: Subscription) -> bool:
    """Whether this nats-py still keeps the internals `DirectQueue` replaces."""
    return isinstance(getattr(sub, "_pending_queue", None), asyncio.Queue) and isinstance(
        getattr(sub, "_pending_size", None), int
    )


def direct(sub: Subscription, deliver: Callable[[Msg], None]) -> bool:
    """Make `sub` (subscribed without a callback, no await since) hand every message to `deliver`;
    False when this nats-py no longer keeps the internals (the caller subscribes with a callback)."""
    if not direct_delivery_supported(sub):
        return False
    sub._pending_queue = DirectQueue(sub, deliver)  # type: ignore[assignment]
    return True


__all__ = ["DirectQueue", "direct", "direct_delivery_supported"]
