# SPDX-License-Identifier: Apache-2.0
"""One IPC connection on a bare `asyncio.BufferedProtocol`: the socket is read straight into the
blocks of a native `FrameReader`, and each complete frame is a view of the block it arrived in
(issue 30; the blocks, issue 32).

Why not asyncio streams: a `StreamReader` copies every read into its own buffer, `read()` copies it out
again as `bytes`, and each read is a coroutine wake-up. A 64-item RunBatch response (~120 KB) took four
copies and several wake-ups. Here the kernel writes into the reader's block and nothing copies a body
again (with the pure-Python twin, one copy out of its read buffer), and the waiting request wakes once
per complete frame.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Final

from .. import wire
from ..wire.limits import MAX_FRAME

if TYPE_CHECKING:
    from typing_extensions import Buffer

#: A read block's size: a 64-item response arrives in one or two reads. A connection keeps at most
#: five blocks (its current one and four spares) beyond those its frames still pin.
READ_BUFFER: Final = 256 << 10


class FrameConnection(asyncio.BufferedProtocol):
    """Frames of one Unix-socket connection. `next_frame()` returns them in order; once the
    connection ends, whatever was complete is still returned, then its end is raised: the OSError
    it died of, or `EOFError` for a clean close (`FrameTooLarge` and other wire errors of the
    splitter are raised as they were found)."""

    def __init__(self, max_body: int | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self._reader = wire.FrameReader(MAX_FRAME if max_body is None else max_body, READ_BUFFER)
        self._frames: deque[memoryview] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._end: BaseException | None = None  # why no more frames will come (None: still open)
        self._paused = False
        self._lost = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._closed = asyncio.get_running_loop().create_future()

    # -- asyncio.BufferedProtocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> Buffer:
        return self._reader.read_window()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self._reader.window_filled(nbytes)
        except Exception as exc:  # FrameTooLarge or a malformed header: this stream is out of step
            self._finish(exc)
            if self.transport is not None:
                self.transport.abort()
            return
        if frames:
            self._frames.extend(frames)
            self._wake()

    def eof_received(self) -> bool:
        self._finish(EOFError("backend closed the connection before the response was complete"))
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._finish(exc if exc is not None else EOFError("connection was closed"))
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)  # `drain` re-checks and raises
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- what the clients use ----------------------------------------------------------------

    @property
    def at_eof(self) -> bool:
        """The peer closed, the connection failed or it was closed here: nothing more will arrive."""
        return self._end is not None

    @property
    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def write(self, data: bytes | memoryview) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high-water mark. As a stream writer's
        drain: the OSError the connection failed with, else `ConnectionResetError` once it is lost."""
        while True:
            if isinstance(self._end, OSError):
                raise self._end
            if self._lost:
                raise ConnectionResetError("Connection lost")
            if not self._paused:
                return
            self._drain_waiter = asyncio.get_running_loop().create_future()
            await self._drain_waiter

    async def next_frame(self) -> memoryview:
        """The next complete frame body; its end once the connection has none left (see the class)."""
        while not self._frames:
            if self._end is not None:
                raise self._end
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return self._frames.popleft()

    def close(self) -> None:
        """Close the transport (buffered writes still go out); frames not yet taken are dropped."""
        self._frames.clear()
        if self.transport is not None:
            self.transport.close()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    # -- internals ---------------------------------------------------------------------------

    def _finish(self, end: BaseException) -> None:
        if self._end is None:
            self._end = end
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


async def open_frame_connection(path: str, *, max_body: int | None = None) -> FrameConnection:
    """Connect to the backend's Unix socket; the connection splits frames as bytes arrive."""
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_unix_connection(lambda: FrameConnection(max_body), path)
    return protocol


__all__ = ["READ_BUFFER", "FrameConnection", "open_frame_connection"]
