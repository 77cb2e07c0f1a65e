# SPDX-License-Identifier: Apache-2.0
"""`sync_with_server` against a real nats-server with protocol tracing: unlike nats-py's `flush()`,
whose PING overtakes commands still in the client's pending buffer, it returns only once the server
has processed every command queued before it (the cause of the flaky cancel test, issue 9)."""

from __future__ import annotations

import asyncio
import re

import nats
import pytest
from nats.aio.msg import Msg

from sie_sidecar.bus.sync import sync_with_server

from .conftest import NatsServer

_LINE = re.compile(r'- "[^"]*:(?P<name>[^":]+)" - (?P<dir><<-|->>) \[(?P<op>\w+) ?(?P<arg>[^\]]*)\]')


def _trace(server: NatsServer, name: str) -> list[tuple[str, str, str]]:
    """(direction, operation, argument) of every traced protocol line of the connection `name`."""
    out = []
    for line in server.log_path.read_text(errors="replace").splitlines():
        m = _LINE.search(line)
        if m is not None and m["name"] == name:
            out.append((m["dir"], m["op"], m["arg"].strip()))
    return out


async def _traced(server: NatsServer, name: str, op: str, subject: str) -> list[tuple[str, str, str]]:
    """The connection's trace once it shows `op subject` (the server logs asynchronously)."""
    for _ in range(250):
        lines = _trace(server, name)
        if any(o == op and a.split(" ")[0] == subject for _, o, a in lines):
            return lines
        await asyncio.sleep(0.02)
    raise AssertionError(f"{op} {subject} never traced")


async def test_nats_py_flush_pings_ahead_of_a_queued_subscription(traced_nats_server: NatsServer) -> None:
    """The defect being worked around: flush()'s PING reaches the server before the SUB made just
    before it, so its PONG does not mean the server has the subscription."""
    nc = await nats.connect(traced_nats_server.url, name="flush-probe")
    try:

        async def ignore(_: Msg) -> None:
            return None

        await nc.subscribe("probe.flush", cb=ignore)
        await nc.flush()
        lines = await _traced(traced_nats_server, "flush-probe", "SUB", "probe.flush")
        received = [(op, arg.split(" ")[0]) for direction, op, arg in lines if direction == "<<-"]
        sub_at = received.index(("SUB", "probe.flush"))
        pings_before = sum(1 for op, _ in received[:sub_at] if op == "PING")
        assert pings_before == 2  # the connect handshake's PING, then flush()'s, both ahead of the SUB
    finally:
        await nc.close()


async def test_sync_with_server_returns_after_queued_subscriptions_are_registered(
    traced_nats_server: NatsServer,
) -> None:
    nc = await nats.connect(traced_nats_server.url, name="sync-probe")
    other = await nats.connect(traced_nats_server.url, name="publisher")
    try:
        got: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_msg(msg: Msg) -> None:
            got.put_nowait(msg.data)

        await nc.subscribe("probe.sync", cb=on_msg)
        await sync_with_server(nc)
        # The server has the subscription now: a message another client publishes from here on reaches it.
        await other.publish("probe.sync", b"after-sync")
        await other.flush()
        assert await asyncio.wait_for(got.get(), 5) == b"after-sync"
        lines = await _traced(traced_nats_server, "sync-probe", "SUB", "probe.sync")
        ops = [(direction, op, arg.split(" ")[0]) for direction, op, arg in lines]
        sub_at = ops.index(("<<-", "SUB", "probe.sync"))
        echo_at = next(i for i, (d, op, _) in enumerate(ops) if d == "->>" and op == "MSG")
        assert sub_at < echo_at  # the echo the call waited for was sent only after the SUB was processed
    finally:
        await other.close()
        await nc.close()


@pytest.mark.parametrize("via", ["$JS.API.STREAM.INFO.NO_SUCH_STREAM", "nobody.listens.here"])
async def test_sync_via_a_request_returns_after_queued_subscriptions(traced_nats_server: NatsServer, via: str) -> None:
    """The permissions-friendly sync (`via`, docs/deploying.md): any answer proves the order, a
    JetStream error answer and the server's "no responders" status included."""
    nc = await nats.connect(traced_nats_server.url, name="sync-via")
    try:
        await nc.subscribe("probe.via")
        await sync_with_server(nc, via=via)
        lines = await _traced(traced_nats_server, "sync-via", "SUB", "probe.via")
        ops = [(direction, op, arg.split(" ")[0]) for direction, op, arg in lines]
        sub_at = ops.index(("<<-", "SUB", "probe.via"))
        pub_at = next(
            i for i, (d, op, subject) in enumerate(ops) if d == "<<-" and op in ("PUB", "HPUB") and subject == via
        )
        assert sub_at < pub_at
    finally:
        await nc.close()
