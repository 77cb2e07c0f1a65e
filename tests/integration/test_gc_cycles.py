# SPDX-License-Identifier: Apache-2.0
"""Cyclic garbage is collected by time, not left to an allocation count the hot path never reaches.

The soak's Python blocks rose ~3 a second for as long as it ran. A heap census with `DEBUG_SAVEALL`
named the garbage: closed TCP transports of the probe port (asyncio's `_SelectorSocketTransport`
keeps itself alive through its own bound read callback, with its sockets, addresses and extra
dict). With start-up frozen and gen-0 at 10,000 net allocations, the collector that frees them
could be hours away; `PeriodicCollection` runs a full collection every `GC_INTERVAL_S`.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from sie_sidecar.runtime import gc as runtime_gc

from .conftest import NatsServer
from .stack import running_stack

CONNECTIONS = 20


def closed_transports_of(port: int) -> list[asyncio.Transport]:
    """asyncio's socket transports (`_SelectorSocketTransport`) of `port` that are closed and alive."""
    found = []
    for obj in gc.get_objects():
        if isinstance(obj, asyncio.Transport) and obj.is_closing():
            sockname = obj.get_extra_info("sockname")
            if isinstance(sockname, tuple) and sockname[1] == port:
                found.append(obj)
    return found


async def probe(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await reader.read()
    writer.close()
    await writer.wait_closed()


async def test_closed_probe_connections_are_collected_within_the_interval(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime_gc, "GC_INTERVAL_S", 0.2)
    was_enabled = gc.isenabled()
    gc.disable()  # automatic collections as far apart as the sidecar's threshold makes them under load
    try:
        async with running_stack(nats_server, tmp_path, env={"SIE_SIDECAR_DEBUG_ENDPOINT": "1"}) as stack:
            port = stack.settings.worker_probe_port
            for _ in range(CONNECTIONS):
                await probe(port)
            await asyncio.sleep(0.1)  # the server side's connection_lost
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5.0
            while (left := len(closed_transports_of(port))) and loop.time() < deadline:
                await asyncio.sleep(0.1)
            assert left == 0, f"{left} closed probe transports still alive"
    finally:
        if was_enabled:
            gc.enable()


async def test_the_periodic_collection_frees_a_cycle_and_counts_it() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        collection = runtime_gc.PeriodicCollection(interval_s=0.05)
        stop = asyncio.Event()
        background: list[asyncio.Task[object]] = []
        collection.start(stop, background)
        for _ in range(100):
            Node()  # each one garbage at once, alive only through its own cycle
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while collection.freed < 100 and loop.time() < deadline:
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*background)
        snapshot = collection.snapshot()
        assert snapshot["runs"] >= 1 and snapshot["freed"] >= 100
        assert collection.max_ms >= collection.last_ms > 0 and snapshot["interval_s"] == 0.05
        assert not [obj for obj in gc.get_objects() if isinstance(obj, Node)]
    finally:
        if was_enabled:
            gc.enable()
