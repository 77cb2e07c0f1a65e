# SPDX-License-Identifier: Apache-2.0
"""The NATS connection's reads handed to nats-py's read loop as they came off the socket.

CPython 3.11's `asyncio.StreamReader` copies every read three times before nats-py sees it: into its
buffer (`feed_data`), out of it as a bytearray slice, and that slice into `bytes` (`read`). A
64-delivery pull batch is ~56 KB, so that was ~170 KB of copying a batch (docs/benchmarks.md,
issue 32). `ReadsAsTheyCame` keeps each socket read's own `bytes` and returns one per `read()`; the
inbound fast path then scans it where it lies (`bus.inbound`), so a delivery's bytes are never
copied between the kernel and the native delivery that views them.

It relies on `asyncio.StreamReader` internals (`_buffer`, `_eof`, `_exception`, `_limit`,
`_paused`, `_transport`, `_waiter`, `_wait_for_data`, `_wakeup_waiter`), stable since Python 3.8:
`adopt` checks them and leaves a reader alone when any is missing. Only a reader that nothing is
waiting on may be adopted (the inbound parser adopts its client's reader between two reads), and
only `read`, `at_eof`, `feed_data` and `feed_eof` are served: the handshake's `readline` is over
before nats-py starts its read loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterable
from typing import Any, Final, SupportsIndex

log = logging.getLogger(__name__)

_INTERNALS: Final = (
    "_buffer",
    "_eof",
    "_exception",
    "_limit",
    "_paused",
    "_transport",
    "_waiter",
    "_wait_for_data",
    "_wakeup_waiter",
)


class ReadsAsTheyCame(asyncio.StreamReader):
    """A `StreamReader` whose `read()` returns the next socket read whole, the `bytes` object the
    transport delivered (not limited to `n`), with the same flow control: reading pauses above
    twice the limit held and resumes at the limit."""

    _reads: deque[bytes]
    _held: int
    # StreamReader's own state (not in its type stubs).
    _buffer: bytearray
    _eof: bool
    _exception: BaseException | None
    _limit: int
    _paused: bool
    _transport: Any
    _waiter: asyncio.Future[None] | None

    @classmethod
    def adopt(cls, reader: Any) -> bool:
        """Turn a plain `StreamReader` (that nothing is waiting on) into one of these, keeping what
        it holds; False when it is something else or its internals are not the expected ones."""
        if type(reader) is not asyncio.StreamReader:
            return False
        plain: Any = reader
        if not all(hasattr(plain, name) for name in _INTERNALS):
            log.warning("asyncio.StreamReader internals changed; NATS reads are copied as before")
            return False
        if plain._waiter is not None:
            return False  # a read is waiting on it: its StreamReader code would read the old buffer
        held = bytes(plain._buffer)
        plain._buffer.clear()
        plain._reads = deque([held] if held else [])
        plain._held = len(held)
        plain.__class__ = cls
        return True

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        assert not self._eof, "feed_data after feed_eof"
        # A transport that hands out views or bytearrays: keep an immutable copy.
        chunk = data if isinstance(data, bytes) else bytes(data)
        if not chunk:
            return
        self._reads.append(chunk)
        self._held += len(chunk)
        self._wakeup_waiter()  # type: ignore[attr-defined]
        if self._transport is not None and not self._paused and self._held > 2 * self._limit:
            try:
                self._transport.pause_reading()
            except NotImplementedError:
                self._transport = None  # it cannot pause: everything is held, as StreamReader does
            else:
                self._paused = True

    def at_eof(self) -> bool:
        return self._eof and not self._reads and not self._buffer

    def _maybe_resume_transport(self) -> None:
        if self._paused and self._held <= self._limit:
            self._paused = False
            self._transport.resume_reading()

    async def read(self, n: int = -1) -> bytes:
        if self._exception is not None:
            raise self._exception
        if n == 0:
            return b""
        if not self._reads and not self._eof:
            await self._wait_for_data("read")  # type: ignore[attr-defined]
        if not self._reads:
            return b""  # end of stream
        data = self._reads.popleft()
        self._held -= len(data)
        self._maybe_resume_transport()
        return data


__all__ = ["ReadsAsTheyCame"]
