# SPDX-License-Identifier: Apache-2.0
"""A NATS server that stops answering without closing the socket is left within the ping window
(`SIE_NATS_PING_INTERVAL_S` * (`SIE_NATS_MAX_OUTSTANDING_PINGS` + 1)), and the sidecar's connection
moves to another URL of `SIE_NATS_URL`. With nats-py's defaults (120 s, 2 pings) a frozen node left
the sidecars connected to it idle for minutes (docs/reliability.md, `sigstop_leader`)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from nats.aio.client import Client as NatsClient

from sie_sidecar.bus.connect import NatsEvents, close, connect
from sie_sidecar.bus.topology import POOL_ACK_WAIT_S
from sie_sidecar.config import Settings

from .conftest import NatsServerFactory

BASE = {"SIE_POOL": "default", "SIE_BUNDLE": "default", "SIE_MACHINE_PROFILE": "cpu", "HOSTNAME": "pod-0"}


def test_the_defaults_leave_a_frozen_server_inside_ack_wait() -> None:
    settings = Settings.from_env({**BASE, "SIE_NATS_URL": "nats://127.0.0.1:4222"})
    window_s = settings.nats_ping_interval_s * (settings.nats_max_outstanding_pings + 1)
    assert window_s <= POOL_ACK_WAIT_S / 1.5  # noticed with a third of ack_wait left to settle


# nats-py shuffles the URLs; when its reconnect tries the frozen server first, that attempt times out
# waiting for INFO (2 s) and nats-py leaves its socket to the garbage collector, which warns.
@pytest.mark.filterwarnings("ignore:unclosed <StreamWriter:ResourceWarning")
async def test_a_frozen_server_is_left_for_another_url(
    nats_server_factory: NatsServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    servers = [await nats_server_factory(jetstream=False), await nats_server_factory(jetstream=False)]
    settings = Settings.from_env(
        {
            **BASE,
            "SIE_NATS_URL": ",".join(s.url for s in servers),
            "SIE_NATS_PING_INTERVAL_S": "0.3",
            "SIE_NATS_MAX_OUTSTANDING_PINGS": "2",
        }
    )
    caplog.set_level(logging.INFO, logger="sie_sidecar.bus.connect")
    nc = NatsClient()
    events = NatsEvents(lambda text: text)
    reconnected = asyncio.Event()
    events.on_reconnected.append(reconnected.set)
    await connect(nc, settings, events)
    url = nc.connected_url
    assert url is not None
    frozen = next(s for s in servers if s.port == url.port)
    other = next(s for s in servers if s is not frozen)
    await frozen.freeze()
    try:
        loop = asyncio.get_running_loop()
        began = loop.time()
        # Stale after 3 unanswered ticks (0.9-1.2 s), then one reconnect attempt to the other URL.
        await asyncio.wait_for(reconnected.wait(), timeout=5.0)
        left_after_s = loop.time() - began
        assert nc.connected_url is not None and nc.connected_url.port == other.port
        assert 0.6 <= left_after_s < 5.0
        await nc.flush(timeout=2)  # the new connection serves
        lines = [r for r in caplog.records if r.getMessage().startswith("NATS reconnected")]
        assert [getattr(r, "server", None) for r in lines] == [other.url]  # the line names the new server
    finally:
        frozen.thaw()
        await close(nc, events)
