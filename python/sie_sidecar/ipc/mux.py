# SPDX-License-Identifier: Apache-2.0
"""The multiplexed IPC transport (`SIE_IPC_MUX`, wire-protocol §1.2): one connection per backend
child carrying pipelined requests, each response routed to its caller by `request_id`.

The pooled transport holds one request per connection, so concurrency costs connections (and the
backend a reader per connection); here one reader task splits every frame off the socket and hands
it to the request waiting for that id. Frames of different requests may interleave (response chunks
too); frames of one request arrive in order; a frame whose id is not in flight (a request that timed
out) is dropped. At most 1,024 requests are in flight. A lost connection fails every request on it
with a transport error, which gets the one retry of §1.2 (same bytes, same id) on a new connection;
reconnecting waits 100 ms after a failed attempt. A timeout does not close the connection: the
stream stays in step, and the late frames are dropped by id.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, TypeVar

from .. import wire
from ..errors import ConfigNotAttested, IpcTimeout, IpcTransportError, ProtocolError
from .client import Attest, IpcClient, record_assembled
from .transport import READ_LIMIT, READ_SIZE, TransportFailure, is_retryable

if TYPE_CHECKING:
    from .requests import EncodedBody

T = TypeVar("T")


MAX_IN_FLIGHT: Final = 1024
RECONNECT_BACKOFF_S: Final = 0.1

Frame = wire.ResponseEnvelope | wire.IpcResponseChunk


class _Connection:
    """One socket and its reader task; `inflight` maps request ids to their frame queues."""

    __slots__ = ("dead", "inflight", "reader_task", "writer")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.inflight: dict[str, asyncio.Queue[Frame | BaseException]] = {}
        self.reader_task: asyncio.Task[None] | None = None
        self.dead = False

    def fail(self, exc: BaseException) -> None:
        """The connection is gone: every request on it gets `exc`."""
        self.dead = True
        for queue in self.inflight.values():
            queue.put_nowait(exc)
        with contextlib.suppress(Exception):
            self.writer.close()


class MuxIpcClient(IpcClient):
    """`IpcClient`'s calls over one multiplexed connection."""

    transport = "mux"

    def grow_for(self, model_id: str, width: int | None) -> int:
        """One multiplexed connection carries up to its in-flight cap whatever the width: no pool
        to grow (wire-protocol §1.2)."""
        return self.capacity

    def __init__(
        self,
        socket_path: str,
        *,
        request_timeout_s: float = 60.0,
        model_ready_timeout_s: float = 900.0,
        budget: wire.ResponseBudget | None = None,
    ) -> None:
        super().__init__(
            socket_path,
            pool_size=1,
            request_timeout_s=request_timeout_s,
            model_ready_timeout_s=model_ready_timeout_s,
            budget=budget,
        )
        self._conn: _Connection | None = None
        self._connecting = asyncio.Lock()
        self._in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._last_failed_connect = float("-inf")
        self.connects = 0

    @property
    def open_connections(self) -> int:
        return 0 if self._conn is None or self._conn.dead else 1

    @property
    def in_flight(self) -> int:
        return 0 if self._conn is None else len(self._conn.inflight)

    @property
    def capacity(self) -> int:
        return MAX_IN_FLIGHT

    @property
    def busy(self) -> int:
        return self.in_flight

    async def close(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.fail(EOFError("the IPC client was closed"))
            if conn.reader_task is not None:
                conn.reader_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await conn.reader_task

    # -- the connection -----------------------------------------------------------------------

    async def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and not conn.dead:
            return conn
        async with self._connecting:
            conn = self._conn
            if conn is not None and not conn.dead:
                return conn
            if self._closed:
                raise IpcTransportError(f"IPC client for {self._path} is closed", transient=False)
            wait = self._last_failed_connect + RECONNECT_BACKOFF_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                reader, writer = await asyncio.open_unix_connection(self._path, limit=READ_LIMIT)
            except OSError:
                self._last_failed_connect = time.monotonic()
                raise
            if self._conn is not None:  # a lost connection: the process behind the new one may be new
                self.reported_hash = None
            conn = _Connection(writer)
            conn.reader_task = asyncio.create_task(self._read_loop(reader, conn))
            self._conn = conn
            self.connects += 1
            return conn

    async def _read_loop(self, reader: asyncio.StreamReader, conn: _Connection) -> None:
        """Split frames off the socket and route each by its request id until the socket ends."""
        splitter = wire.FrameSplitter()
        failure: BaseException = EOFError("backend closed the connection")
        try:
            while data := await reader.read(READ_SIZE):
                for raw in splitter.feed(data):
                    frame = wire.decode_response(raw)
                    queue = conn.inflight.get(frame.request_id)
                    if queue is not None:
                        queue.put_nowait(frame)
        except (OSError, ProtocolError) as exc:  # a frame we cannot route desynchronises the stream
            failure = exc if isinstance(exc, OSError) else EOFError(f"undecodable frame: {exc}")
        finally:
            conn.fail(failure)
            self._last_failed_connect = time.monotonic()

    # -- requests -----------------------------------------------------------------------------

    async def _exchange_once(
        self, method: str, body: EncodedBody, timeout_s: float, decode: Callable[[memoryview], T], attest: Attest | None
    ) -> T:
        """One request on the shared connection, with the §1.2 transport retry on a new one."""
        request_id = f"w-{next(self._ids)}"
        frame = wire.encode_request(method, request_id, body, True)  # FrameTooLarge: nothing written
        if self._closed:
            raise IpcTransportError(f"IPC client for {self._path} is closed", transient=False)
        async with self._in_flight:
            try:
                return await self._exchange(frame, request_id, timeout_s, decode, attest)
            except TransportFailure as first:
                self._retry_or_raise(method, request_id, first)
            try:
                return await self._exchange(frame, request_id, timeout_s, decode, attest)
            except TransportFailure as second:
                raise self._retry_failed(method, request_id, second) from second.cause

    async def _exchange(
        self,
        frame: bytes | memoryview,
        request_id: str,
        timeout_s: float,
        decode: Callable[[memoryview], T],
        attest: Attest | None,
    ) -> T:
        assembler = wire.IpcChunkAssembler(request_id, self._budget)
        queue: asyncio.Queue[Frame | BaseException] = asyncio.Queue()
        conn: _Connection | None = None
        done = False
        frames = 0
        try:
            try:
                async with asyncio.timeout(timeout_s):
                    conn = await self._connection()
                    if attest is not None and not attest(self.reported_hash):
                        raise ConfigNotAttested(f"backend at {self._path} does not attest the config")
                    conn.inflight[request_id] = queue
                    conn.writer.write(frame)
                    await conn.writer.drain()
                    while True:
                        item = await queue.get()
                        if isinstance(item, BaseException):
                            raise item
                        frames += 1
                        assembled = assembler.feed(item)
                        if assembled is not None:
                            break
                if frames > 1 and self.telemetry is not None:
                    record_assembled(self.telemetry, frames, assembled.nbytes)
            except TimeoutError:
                raise IpcTimeout(f"IPC request {request_id} timed out after {timeout_s:g} s") from None
            except (OSError, EOFError) as exc:
                self.reported_hash = None  # the process that answers next may be another one
                raise TransportFailure(exc, retryable=is_retryable(exc)) from exc
            finally:
                if conn is not None:
                    conn.inflight.pop(request_id, None)
            try:
                env = assembled.decode()
                result = decode(wire.response_body(env, request_id))  # a server error keeps the stream
                done = True
                return result
            finally:
                assembled.release()  # only after the typed decode: the reservation covers the bytes
        finally:
            if not done:
                assembler.abort()


__all__ = ["MAX_IN_FLIGHT", "RECONNECT_BACKOFF_S", "MuxIpcClient"]
