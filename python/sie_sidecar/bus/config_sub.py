# SPDX-License-Identifier: Apache-2.0
"""The live-config subscription (sidecar-behaviour §2.4, §9.1): `sie.config.models.{bundle}` on NATS
Core, each message handed to `LiveConfig` in arrival order (nats-py awaits one callback before the
next, so notifications apply one at a time, as their epochs require).

A bundle that cannot be a subject token (empty, or with `.`, `*`, `>`) disables the subscription
(§3); a subscribe that fails is retried 250 ms doubling to 5 s until the stop signal (§15.2).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from ..control.live_config import LiveConfig
from .connect import NATS_FAILURES
from .sync import sync_with_server

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.25
RETRY_MAX_S = 5.0


def config_subject(bundle: str) -> str | None:
    """The subject for `bundle`, or None when the bundle cannot be one token."""
    token = bundle.strip()
    if not token or any(c in token for c in ".*>") or any(c.isspace() for c in token):
        return None
    return f"sie.config.models.{token}"


async def subscribe_config(
    nc: NatsClient, live: LiveConfig, subs: list[Subscription], stop: asyncio.Event, *, sync_via: str | None = None
) -> bool:
    """Subscribe (appended to `subs`) and wait until the server has it; False when disabled or stopped."""
    subject = config_subject(live.bundle)
    if subject is None:
        log.warning("config subscription disabled: the bundle is not a subject token", extra={"bundle": live.bundle})
        return False

    async def on_config(msg: Msg) -> None:
        headers = list(msg.headers) if msg.headers else []
        await live.handle_notification(msg.data, reply=msg.reply or "", headers=headers)

    delay = RETRY_FIRST_S
    while not stop.is_set():
        try:
            subs.append(await nc.subscribe(subject, cb=on_config))
            await sync_with_server(nc, via=sync_via)
            return True
        except NATS_FAILURES as exc:
            log.warning("config subscribe failed, retrying", extra={"error": repr(exc), "retry_s": delay})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, RETRY_MAX_S)
    return False


__all__ = ["config_subject", "subscribe_config"]
