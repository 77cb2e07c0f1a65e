# SPDX-License-Identifier: Apache-2.0
"""A round trip to the NATS server that is ordered after every command the client has queued.

nats-py's `Client.flush()` writes its PING straight to the socket, ahead of the commands still
waiting in the client's pending buffer (a SUB made a moment ago, for one). Its PONG therefore proves
nothing about those commands: the sidecar subscribed to `work_cancel.>`, flushed, started pulling,
and a cancel the gateway published right then was routed by the server before the SUB arrived, so
the cancelled item ran and was answered (tests/integration/test_settlement.py flaked that way, about
one run in ten under CPU load; tests/integration/test_nats_sync.py shows the PING overtaking).

`sync_with_server` publishes to a fresh inbox of its own through the same pending buffer and waits
for the message to come back. A server processes one connection's commands in order, so when it
returns every SUB (and PUB) queued before it has been processed.

Under the documented worker permissions (sidecar-behaviour §2.6) a worker may not publish to its own
`_INBOX_WORKER.>`; the runtime then passes `via`, a JetStream API subject it may call
(`$JS.API.STREAM.INFO.<pool stream>`): any answer, an error included, comes back in the same order.
"""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError

DEFAULT_TIMEOUT_S = 5.0


async def sync_with_server(nc: Client, timeout_s: float = DEFAULT_TIMEOUT_S, *, via: str | None = None) -> None:
    """Return once the server has processed every command queued on `nc` before this call.

    Raises `TimeoutError` when the echo does not come back in `timeout_s`.
    """
    if via is not None:
        # A request's reply is ordered after everything queued before it; its content is not read,
        # and the server's own "no responders" status is such a reply too.
        with contextlib.suppress(NoRespondersError):
            await nc.request(via, b"", timeout=timeout_s)
        return
    loop = asyncio.get_running_loop()
    echoed: asyncio.Future[None] = loop.create_future()

    async def on_echo(_: Msg) -> None:
        if not echoed.done():
            echoed.set_result(None)

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=on_echo, max_msgs=1)
    try:
        await nc.publish(inbox, b"")
        async with asyncio.timeout(timeout_s):
            await echoed
    finally:
        with contextlib.suppress(NatsError):
            await sub.unsubscribe()


__all__ = ["DEFAULT_TIMEOUT_S", "sync_with_server"]
