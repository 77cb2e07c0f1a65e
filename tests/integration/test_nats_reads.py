# SPDX-License-Identifier: Apache-2.0
"""NATS reads handed to nats-py as they came off the socket (`bus.reads`, issue 32): the client's
stream reader is adopted between two reads, again after a reconnect, and keeps StreamReader's
flow control; everything arrives, in order, on a real nats-server and a real socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from sie_sidecar.bus.inbound import FastInbound
from sie_sidecar.bus.reads import ReadsAsTheyCame

from .conftest import NatsServer


@pytest.fixture
async def client(nats_server: NatsServer) -> AsyncIterator[Client]:
    reconnected = asyncio.Event()

    async def on_reconnect() -> None:
        reconnected.set()

    nc = await nats.connect(servers=[nats_server.url], reconnected_cb=on_reconnect, reconnect_time_wait=0.05)
    nc._test_reconnected = reconnected  # type: ignore[attr-defined]
    try:
        yield nc
    finally:
        await nc.close()


async def _round_trip(nc: Client, n: int) -> list[bytes]:
    got: list[bytes] = []
    done = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        got.append(msg.data)
        if len(got) == n:
            done.set()

    sub = await nc.subscribe("reads.test", cb=on_msg)
    for i in range(n):
        await nc.publish("reads.test", b"%d:" % i + bytes(i % 2000))
    await asyncio.wait_for(done.wait(), 10)
    await sub.unsubscribe()
    return got


async def test_the_clients_reader_is_adopted_after_a_read_and_after_a_reconnect(client: Client) -> None:
    assert FastInbound.install(client) is not None
    await client.flush()  # a PONG: one read through the fast parser
    first = client._transport._io_reader  # type: ignore[union-attr]
    assert type(first) is ReadsAsTheyCame
    assert await _round_trip(client, 500) == [b"%d:" % i + bytes(i % 2000) for i in range(500)]

    client._transport._io_writer.transport.abort()  # type: ignore[union-attr]  # the server is gone, for the client
    await asyncio.wait_for(client._test_reconnected.wait(), 10)  # type: ignore[attr-defined]
    await client.flush()
    second = client._transport._io_reader  # type: ignore[union-attr]
    assert second is not first and type(second) is ReadsAsTheyCame
    assert await _round_trip(client, 50) == [b"%d:" % i + bytes(i % 2000) for i in range(50)]


async def test_reads_come_whole_in_order_and_reading_pauses_and_resumes() -> None:
    """A plain reader adopted on a real socket: `read()` returns the transport's own `bytes`, every
    byte arrives in order, and reading pauses above twice the limit held, as StreamReader does."""
    payload = bytes(range(256)) * 8192  # 2 MiB

    async def serve(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(payload)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=32768)
    try:
        assert ReadsAsTheyCame.adopt(reader) and type(reader) is ReadsAsTheyCame
        assert not ReadsAsTheyCame.adopt(reader)  # adopted once
        for _ in range(200):  # let the socket fill the reader without reading it
            if reader._paused:
                break
            await asyncio.sleep(0.005)
        assert reader._paused and reader._held > 2 * 32768
        chunks = []
        while chunk := await reader.read(32768):
            assert type(chunk) is bytes
            chunks.append(chunk)
        assert b"".join(chunks) == payload
        assert not reader._paused and reader.at_eof()
        assert await reader.read(10) == b""
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


async def test_a_reader_someone_waits_on_is_left_alone() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    waiting = asyncio.ensure_future(reader.read(10))
    await asyncio.sleep(0)
    assert not ReadsAsTheyCame.adopt(reader) and type(reader) is asyncio.StreamReader
    reader.feed_data(b"abc")
    assert await waiting == b"abc"
    reader.feed_data(b"held")
    assert ReadsAsTheyCame.adopt(reader)
    reader.feed_data(b" then")
    reader.feed_eof()
    assert [await reader.read(1), await reader.read(1), await reader.read(1)] == [b"held", b" then", b""]


async def test_no_reader_is_adopted_before_its_handshake_is_over(client: Client) -> None:
    """A reconnect reads its handshake lines through StreamReader's own buffer: a read parsed while
    the client is not connected (the old read loop, racing) leaves the new reader as it is."""
    assert FastInbound.install(client) is not None
    client._status = Client.RECONNECTING
    try:
        await client._ps.parse(b"PONG\r\n")
        assert type(client._transport._io_reader) is asyncio.StreamReader  # type: ignore[union-attr]
    finally:
        client._status = Client.CONNECTED
    await client.flush()
    assert type(client._transport._io_reader) is ReadsAsTheyCame  # type: ignore[union-attr]
