# SPDX-License-Identifier: Apache-2.0
"""The sidecar's one NATS connection (sidecar-behaviour §2.1 step 2)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import nats
from nats.aio.client import Client as NatsClient

from ..config import Settings


async def connect(settings: Settings, *, on_reconnected: Callable[[], Awaitable[None]]) -> NatsClient:
    """Connect to `SIE_NATS_URL`; later reconnects retry for ever and call `on_reconnected`."""
    return await nats.connect(
        servers=settings.nats_servers,
        reconnected_cb=on_reconnected,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        name=f"sie-sidecar {settings.worker_id}",
    )


__all__ = ["NatsClient", "connect"]
