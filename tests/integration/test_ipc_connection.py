# SPDX-License-Identifier: Apache-2.0
"""`ipc.connection.FrameConnection` (issue 30): the IPC connection on a bare `BufferedProtocol`, over a
real Unix socket. Frames come out whole and in order however the bytes are cut (a byte at a time,
bodies larger than the read buffer, many frames in one read); a frame completed before the peer
closes is still returned, then the end; a stalled reader holds `drain()` until it reads."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from sie_sidecar.errors import FrameTooLarge
from sie_sidecar.ipc.connection import READ_BUFFER, open_frame_connection
from sie_sidecar.wire.limits import MAX_FRAME


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


@contextlib.asynccontextmanager
async def server(
    path: str, serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
) -> AsyncIterator[None]:
    srv = await asyncio.start_unix_server(serve, path=path)
    try:
        yield
    finally:
        srv.close()
        await srv.wait_closed()


@pytest.fixture
def sock_path(tmp_path: Path) -> str:
    return str(tmp_path / "c.sock")


async def test_frames_cut_anywhere_come_out_whole_and_in_order(sock_path: str) -> None:
    rng = random.Random(7)
    bodies = [os.urandom(n) for n in (0, 1, 5, 300, READ_BUFFER - 4, READ_BUFFER + 1, 3 * READ_BUFFER + 17)]
    stream = b"".join(frame(b) for b in bodies)

    async def serve(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        at = 0
        while at < len(stream):  # cuts of 1 byte to 2 read buffers, mid-header and mid-body
            n = rng.choice([1, 2, 3, 4, 5, 1000, READ_BUFFER, 2 * READ_BUFFER])
            writer.write(stream[at : at + n])
            await writer.drain()
            at += n
        writer.close()

    async with server(sock_path, serve):
        conn = await open_frame_connection(sock_path)
        got = [bytes(await conn.next_frame()) for _ in bodies]
        assert got == bodies
        with pytest.raises(EOFError):
            await conn.next_frame()
        assert conn.at_eof
        conn.close()
        await conn.wait_closed()


async def test_a_frame_completed_before_the_close_is_returned_then_the_end(sock_path: str) -> None:
    async def serve(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frame(b"last") + frame(b"cut short")[:6])  # a whole frame, then half of one
        await writer.drain()
        writer.close()

    async with server(sock_path, serve):
        conn = await open_frame_connection(sock_path)
        assert bytes(await conn.next_frame()) == b"last"
        with pytest.raises(EOFError, match="before the response was complete"):
            await conn.next_frame()
        conn.close()
        await conn.wait_closed()


async def test_a_declared_frame_over_the_limit_ends_the_connection(sock_path: str) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write((MAX_FRAME + 1).to_bytes(4, "big"))
        await writer.drain()
        await reader.read()  # until the client drops the connection
        writer.close()

    async with server(sock_path, serve):
        conn = await open_frame_connection(sock_path)
        with pytest.raises(FrameTooLarge):
            await conn.next_frame()
        assert conn.at_eof
        await asyncio.wait_for(conn.wait_closed(), 5)  # aborted: the stream is out of step


async def test_drain_waits_for_a_stalled_reader_and_then_returns(sock_path: str) -> None:
    release = asyncio.Event()
    received = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal received
        await release.wait()  # read nothing until told
        while chunk := await reader.read(1 << 20):
            received += len(chunk)
        writer.close()

    async with server(sock_path, serve):
        conn = await open_frame_connection(sock_path)
        payload = b"x" * (16 << 20)  # far past the socket buffers and the transport's high-water mark
        conn.write(payload)
        drained = asyncio.ensure_future(conn.drain())
        await asyncio.sleep(0.2)
        assert not drained.done()  # paused: the reader took nothing yet
        release.set()
        await asyncio.wait_for(drained, 10)
        conn.close()
        await conn.wait_closed()
    assert received == len(payload)


async def test_drain_after_the_peer_is_gone_raises(sock_path: str) -> None:
    async def serve(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()
        writer.close()

    async with server(sock_path, serve):
        conn = await open_frame_connection(sock_path)
        with contextlib.suppress(EOFError, OSError):
            await asyncio.wait_for(conn.next_frame(), 5)  # the end, whichever way it is reported
        with pytest.raises((ConnectionResetError, OSError)):
            await conn.drain()
        conn.close()
        await conn.wait_closed()
