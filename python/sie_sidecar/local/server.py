# SPDX-License-Identifier: Apache-2.0
"""The local-ingest listener (sidecar-behaviour §11): an owner-only Unix socket, one reader per
connection, and the per-connection budgets that keep one client from starving the others or the
sidecar's memory.

Per connection: one frame decoded at a time; request bytes are acquired from the declared length
before the body is read (64 MiB for data ops plus a 1 KiB reserve so a `cancel` still gets through);
80 data ops and 1 control op in flight; 64 generation streams; a bounded writer (80 frames,
64 MiB + 4 bytes) whose every write must drain within 5 s, else the connection is closed. An
undecodable frame or envelope, or a duplicate active envelope id, closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ..errors import (
    BAD_OPERATION_STREAM,
    CAPACITY_EXHAUSTED,
    DECODE_ERROR,
    DISCONNECTED,
    DUPLICATE_REQUEST,
    INVALID_TRANSPORT_BINDING,
    POOL_ADMISSION_REJECTED,
    TIMEOUT,
    CapacityExhausted,
    LocalFrameError,
    WorkItemError,
)
from ..logs import Throttled
from ..wire.workitem import decode_work_item
from . import frames
from .ingest import LocalPipeline
from .limits import (
    CANCEL_S,
    CONTROL_OPS,
    CONTROL_RESERVE,
    DATA_OPS,
    DRAIN_S,
    REQUEST_BYTES,
    STREAMS,
    WRITE_BYTES,
    WRITE_DEADLINE_S,
    WRITE_FRAMES,
)
from .request import Body, check_items
from .source import LocalWork
from .streams import LOCAL_REPLY_PREFIX, LocalStream

log = logging.getLogger(__name__)
_warn = Throttled(log)

DATA_OP_NAMES: Final = frozenset({"publish_work", "publish_generate_stream"})


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class _Closed(Exception):
    """The connection is gone (or being closed): nothing more is written."""


class _Writer:
    """The connection's one writer: a bounded queue of frames and a task that writes and drains them,
    each drain within the write deadline."""

    def __init__(self, writer: asyncio.StreamWriter, on_stall: Any) -> None:
        self._w = writer
        self._queue: deque[bytes] = deque()
        self._bytes = 0
        self._room = asyncio.Event()
        self._data = asyncio.Event()
        self._closed = False
        self._on_stall = on_stall
        self._task = asyncio.create_task(self._run(), name="local-writer")

    async def send(self, frame: bytes) -> None:
        """Queue one frame; waits (at most the write deadline) while the queue is full."""
        try:
            async with asyncio.timeout(WRITE_DEADLINE_S):
                while not self.try_send(frame):  # `_Closed` once the writer closes
                    self._room.clear()
                    await self._room.wait()
        except TimeoutError:
            self._on_stall("write queue stayed full past the write deadline")
            raise _Closed from None

    def try_send(self, frame: bytes) -> bool:
        """Queue one frame now if there is room (no await); False when the caller must wait (`send`)."""
        if self._closed:
            raise _Closed
        if self._queue and (len(self._queue) >= WRITE_FRAMES or self._bytes + len(frame) > WRITE_BYTES):
            return False
        self._queue.append(frame)
        self._bytes += len(frame)
        self._data.set()
        return True

    async def _run(self) -> None:
        try:
            while True:
                while not self._queue:
                    if self._closed:
                        return
                    self._data.clear()
                    await self._data.wait()
                batch = list(self._queue)  # everything queued goes out in one write
                self._queue.clear()
                size = sum(len(f) for f in batch)
                self._w.write(b"".join(batch) if len(batch) > 1 else batch[0])
                try:
                    async with asyncio.timeout(WRITE_DEADLINE_S):
                        await self._w.drain()
                except TimeoutError:
                    self._on_stall("a write did not drain within the write deadline")
                    return
                finally:
                    self._bytes -= size
                    self._room.set()
        except (ConnectionError, OSError):
            self._on_stall(None)

    async def close(self) -> None:
        """Stop taking frames, write what is queued (bounded by the deadline), then close."""
        self._closed = True
        self._data.set()
        self._room.set()
        try:
            with contextlib.suppress(TimeoutError, Exception):
                async with asyncio.timeout(WRITE_DEADLINE_S):
                    await self._task
        finally:  # also when the close itself is cancelled (shutdown): the transport never leaks
            self._task.cancel()
            self._w.close()
        with contextlib.suppress(Exception):
            await self._w.wait_closed()


class _ByteBudget:
    """Retained request bytes: the data pool and the control reserve, acquired before a body is read."""

    def __init__(self) -> None:
        self.free = REQUEST_BYTES
        self.reserve_free = True
        self._changed = asyncio.Event()

    async def acquire(self, n: int) -> bool:
        """Take `n` bytes; True when they came from the control reserve."""
        while True:
            if self.free >= n:
                self.free -= n
                return False
            if n <= CONTROL_RESERVE and self.reserve_free:
                self.reserve_free = False
                return True
            self._changed.clear()
            await self._changed.wait()

    def release(self, n: int, reserve: bool) -> None:
        if reserve:
            self.reserve_free = True
        else:
            self.free += n
        self._changed.set()


@dataclass(slots=True)
class _PendingWork:
    """A `publish_work` in the pipeline: answered from its LocalWork's done callback or its timer,
    with no task of its own (one request is a few callbacks, not a coroutine)."""

    op_id: int
    work: LocalWork
    lane: str
    timeout_ms: int
    length: int
    reserve: bool
    timer: asyncio.TimerHandle | None = None


class _Connection:
    """One client connection: its reader loop, its ops and its budgets."""

    def __init__(self, ingest: LocalIngest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._ingest = ingest
        self._reader = reader
        self._writer = _Writer(writer, self._stalled)
        self._budget = _ByteBudget()
        self._active: set[int] = set()
        self._ops: set[asyncio.Task[None]] = set()
        self._data_ops = 0
        self._control_ops = 0
        self._pending: dict[int, _PendingWork] = {}
        self.streams: dict[str, LocalStream] = {}
        self._closing = False
        self.task: asyncio.Task[None] | None = None

    def _stalled(self, why: str | None) -> None:
        if why is not None:
            _warn.warning("local client does not read its responses; closing it", key="local-stall", extra={"why": why})
        if self.task is not None and not self._closing:
            self.task.cancel()

    async def serve(self) -> None:
        try:
            await self._read_loop()
        except asyncio.CancelledError:
            pass
        except LocalFrameError as exc:
            _warn.warning(
                "bad local-ingest frame; closing the connection", key="local-frame", extra={"error": str(exc)}
            )
        except (ConnectionError, OSError):
            pass
        finally:
            await self._close()

    async def _read_loop(self) -> None:
        reader = self._reader
        while True:
            try:
                header = await reader.readexactly(frames.HEADER_SIZE)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise LocalFrameError("header is truncated") from None
                return  # client EOF
            length = frames.declared_length(header)
            reserve = await self._budget.acquire(length)
            try:
                payload = await reader.readexactly(length)
                request = frames.decode_request(payload)
            except asyncio.IncompleteReadError:
                self._budget.release(length, reserve)
                raise LocalFrameError("frame body is truncated") from None
            except BaseException:
                self._budget.release(length, reserve)
                raise
            del payload
            if request.id in self._active:
                self._budget.release(length, reserve)
                raise LocalFrameError(f"duplicate active envelope id {request.id}")
            self._start(request, length, reserve)

    def _start(self, request: frames.Request, length: int, reserve: bool) -> None:
        """Run the op in its own task, or refuse it when its budget is used up (its bytes go back)."""
        op = request.op
        data = op in DATA_OP_NAMES
        refusal: CapacityExhausted | None = None
        if data and reserve:
            refusal = CapacityExhausted(f"{REQUEST_BYTES} retained request bytes in use on this connection")
        elif data and self._data_ops >= DATA_OPS:
            refusal = CapacityExhausted(f"{DATA_OPS} data operations in flight on this connection")
        elif op == "cancel" and self._control_ops >= CONTROL_OPS:
            refusal = CapacityExhausted("a cancel is already in flight on this connection")
        if refusal is not None:
            self._budget.release(length, reserve)
            self._spawn(request, self._refuse(request, refusal), None, 0, False)
            return
        kind = "data" if data else "control" if op == "cancel" else None
        if kind == "data":
            self._data_ops += 1
        elif kind == "control":
            self._control_ops += 1
        if op == "publish_work":
            self._publish_work(request, length, reserve)
            return
        self._spawn(request, self._run_op(request), kind, length, reserve)

    def _end_op(self, op_id: int, kind: str | None, length: int, reserve: bool) -> None:
        """An op ended: its id, its bytes and its op count come back."""
        self._active.discard(op_id)
        if length or reserve:
            self._budget.release(length, reserve)
        if kind == "data":
            self._data_ops -= 1
        elif kind == "control":
            self._control_ops -= 1

    def _send_now(self, frame: bytes) -> None:
        """Queue a response without awaiting; when the write queue is full, a task waits for room."""
        try:
            if self._writer.try_send(frame):
                return
        except _Closed:
            return
        task = asyncio.create_task(self._send_later(frame), name="local-respond")
        self._ops.add(task)
        task.add_done_callback(self._ops.discard)

    async def _send_later(self, frame: bytes) -> None:
        with contextlib.suppress(_Closed):
            await self._writer.send(frame)

    def _spawn(self, request: frames.Request, coro: Any, kind: str | None, length: int, reserve: bool) -> None:
        """Track the op; when it ends, its id, its bytes and its op count come back."""
        self._active.add(request.id)
        task = asyncio.create_task(coro, name=f"local-{request.op}")
        self._ops.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._ops.discard(t)
            self._end_op(request.id, kind, length, reserve)

        task.add_done_callback(done)

    async def _respond(self, op_id: int, ok: bool, error: str | None, body: dict[str, Any]) -> None:
        with contextlib.suppress(_Closed):
            await self._writer.send(frames.encode_response(op_id, ok, error, body))

    async def _refuse(self, request: frames.Request, exc: BaseException) -> None:
        await self._respond(request.id, False, _error_text(exc), {})

    async def _run_op(self, request: frames.Request) -> None:
        op = request.op
        try:
            if op == "ping":
                await self._respond(request.id, True, None, {})
            elif op == "publish_generate_stream":
                await self._generate(request.id, request.body)
            elif op == "cancel":
                await self._cancel(request.body)
                await self._respond(request.id, True, None, {})
            else:
                await self._respond(request.id, False, f'ValueError: unknown op: "{op}"', {})
        except asyncio.CancelledError:
            if self._ingest.shutting_down:  # answered before the writer closes (§15.4)
                await self._respond(request.id, False, "cancelled", {})
            raise
        except Exception as exc:
            await self._respond(request.id, False, _error_text(exc), {})

    # -- publish_work -----------------------------------------------------------------------------

    def _publish_work(self, request: frames.Request, length: int, reserve: bool) -> None:
        """Check and queue the request now; it is answered when its last slot has a result, or when
        its timeout fires first (`TimeoutError: publish_work timed out after Nms (lane 'L')`)."""
        self._active.add(request.id)
        try:
            body = Body.decode(request.body)
            body.check_binding()
            timeout_ms = body.publish_timeout_ms()
            work = self._ingest.pipeline.submit_work(body)
        except Exception as exc:
            self._end_op(request.id, "data", length, reserve)
            self._send_now(frames.encode_response(request.id, False, _error_text(exc), {}))
            return
        pending = _PendingWork(request.id, work, body.lane, timeout_ms, length, reserve)
        self._pending[request.id] = pending
        pending.timer = asyncio.get_running_loop().call_later(timeout_ms / 1000.0, self._expire, pending)
        work.done.add_done_callback(lambda _: self._work_done(pending))

    def _settle_pending(self, pending: _PendingWork) -> bool:
        """Take `pending` off the books (once): its timer, its op and its budget."""
        if self._pending.pop(pending.op_id, None) is None:
            return False
        if pending.timer is not None:
            pending.timer.cancel()
        self._end_op(pending.op_id, "data", pending.length, pending.reserve)
        return True

    def _work_done(self, pending: _PendingWork) -> None:
        if self._settle_pending(pending):
            body = {"results": pending.work.encoded_results()}
            try:
                frame = frames.encode_response(pending.op_id, True, None, body)
            except LocalFrameError as exc:  # the results do not fit one 64 MiB frame
                frame = frames.encode_response(pending.op_id, False, _error_text(exc), {})
            self._send_now(frame)

    def _expire(self, pending: _PendingWork) -> None:
        if self._settle_pending(pending):
            self._ingest.pipeline.forget(pending.work)
            error = f"TimeoutError: publish_work timed out after {pending.timeout_ms}ms (lane '{pending.lane}')"
            self._send_now(frames.encode_response(pending.op_id, False, error, {}))

    def _abandon_pending(self, answer: str | None) -> None:
        """Every waiting request given up (closing or shutting down), answered `answer` when given."""
        for pending in list(self._pending.values()):
            if self._settle_pending(pending):
                self._ingest.pipeline.forget(pending.work)
                if answer is not None:
                    self._send_now(frames.encode_response(pending.op_id, False, answer, {}))

    # -- generation streams -----------------------------------------------------------------------

    async def _generate(self, op_id: int, raw: dict[Any, Any]) -> None:
        body = Body.decode(raw)
        body.check_binding()
        fail = self._fail_stream
        if body.endpoint != "generate":
            return await fail(op_id, BAD_OPERATION_STREAM, "publish_generate_stream serves the generate endpoint only")
        try:
            slots = check_items(body, LOCAL_REPLY_PREFIX + body.request_id, numbered=False)
        except ValueError as exc:
            return await fail(op_id, DECODE_ERROR, str(exc))
        if len(slots) != 1:
            return await fail(op_id, BAD_OPERATION_STREAM, "a generation stream carries exactly one item")
        request_id = body.request_id
        if request_id in self.streams:
            return await fail(op_id, DUPLICATE_REQUEST, f"request {request_id} is already streaming here")
        if len(self.streams) >= STREAMS:
            return await fail(op_id, CAPACITY_EXHAUSTED, f"{STREAMS} generation streams on this connection")
        if not self._ingest.claim(request_id, self):
            return await fail(op_id, INVALID_TRANSPORT_BINDING, f"request {request_id} streams on another connection")
        try:
            if not slots.admitted[0]:
                return await fail(op_id, POOL_ADMISSION_REJECTED, "admission pool does not match the lane")
            await self._stream(op_id, body, slots.datas[0])
        finally:
            self._ingest.release(request_id, self)

    async def _fail_stream(self, op_id: int, code: str, message: str) -> None:
        await self._respond(op_id, False, f"{code}: {message}", {})

    async def _stream(self, op_id: int, body: Body, data: bytes) -> None:
        request_id = body.request_id

        async def send_chunk(chunk: bytes, seq: int) -> None:
            await self._writer.send(frames.encode_response(op_id, True, None, {"chunk": chunk, "seq": seq}))

        stream = LocalStream(request_id, data, send_chunk)
        try:
            work_item = decode_work_item(data)
        except WorkItemError as exc:
            return await self._fail_stream(op_id, DECODE_ERROR, str(exc))
        self.streams[request_id] = stream
        task = self._ingest.pipeline.start_stream(stream, work_item)
        try:
            timeout_s = body.timeout_ms / 1000.0 if body.timeout_ms > 0 else None
            try:
                async with asyncio.timeout(timeout_s):
                    outcome, value = await asyncio.shield(stream.ended)
            except TimeoutError:
                stream.fail(TIMEOUT, f"no final outcome within {body.timeout_ms}ms")
                await self._stop_stream(stream, task)
                outcome, value = stream.ended.result()
            if outcome == "complete":
                final = {"final": True, "outcome": {"status": "complete", "chunks": value}}
                await self._respond(op_id, True, None, final)
            else:
                await self._respond(op_id, False, str(value), {})
        except asyncio.CancelledError:
            if not stream.finished:
                stream.fail(DISCONNECTED, "the connection closed")
            await self._stop_stream(stream, task)
            raise
        finally:
            self.streams.pop(request_id, None)

    async def _stop_stream(self, stream: LocalStream, task: asyncio.Task[None]) -> None:
        """Chunks are already stopped (the stream has ended): signal the cancel, then drain."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CANCEL_S):
                await self._ingest.pipeline.cancel(stream.request_id)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(DRAIN_S):
                await asyncio.shield(task)
        if not task.done():
            task.cancel()

    async def _cancel(self, raw: dict[Any, Any]) -> None:
        """`cancel` acts only on a stream active on this connection; otherwise it answers `{}`."""
        request_id = raw.get("request_id")
        if isinstance(request_id, str) and request_id in self.streams:
            await self._ingest.pipeline.cancel(request_id)

    # -- closing ----------------------------------------------------------------------------------

    async def _close(self) -> None:
        """Client EOF or a closed connection: every active stream is cancelled at the backend, every
        waiting request abandoned."""
        self._abandon_pending("cancelled" if self._ingest.shutting_down else None)
        self._closing = True
        ops = list(self._ops)
        for task in ops:
            task.cancel()
        if ops:
            await asyncio.gather(*ops, return_exceptions=True)
        await self._writer.close()

    async def finish(self, grace_s: float) -> None:
        """Shutdown: let in-flight ops finish for up to `grace_s`, answer the rest `cancelled`, close."""
        waiting: set[asyncio.Future[Any]] = {*self._ops, *(p.work.done for p in self._pending.values())}
        if waiting:
            await asyncio.wait(waiting, timeout=grace_s)
        await asyncio.sleep(0)  # the done callbacks of what finished have queued their answers
        self._abandon_pending("cancelled")
        for task in list(self._ops):
            task.cancel()
        if self._ops:
            await asyncio.gather(*self._ops, return_exceptions=True)
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


class LocalIngest:
    """The listener: owner-only socket, the connections, and the process-wide request-id claims."""

    def __init__(self, path: str, pipeline: LocalPipeline) -> None:
        self.path = path
        self.pipeline = pipeline
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[_Connection] = set()
        self._claims: dict[str, _Connection] = {}
        self.shutting_down = False

    def claim(self, request_id: str, conn: _Connection) -> bool:
        owner = self._claims.get(request_id)
        if owner is not None and owner is not conn:
            return False
        self._claims[request_id] = conn
        return True

    def release(self, request_id: str, conn: _Connection) -> None:
        if self._claims.get(request_id) is conn:
            del self._claims[request_id]

    async def start(self) -> None:
        """Bind the socket: a stale file is unlinked, a new parent directory is created 0700, the
        socket is chmod 0600 before the first connection is accepted."""
        path = Path(self.path)
        parent = path.parent
        if not parent.exists():
            parent.mkdir(mode=0o700, parents=True)
            os.chmod(parent, 0o700)  # the umask may have narrowed mkdir's mode, never widened it
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()
        old = os.umask(0o177)  # no window in which the socket is reachable by others
        try:
            self._server = await asyncio.start_unix_server(self._accept, path=self.path, limit=2**16)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.shutting_down:
            writer.close()
            return
        conn = _Connection(self, reader, writer)
        conn.task = asyncio.current_task()
        self._connections.add(conn)
        try:
            await conn.serve()
        except asyncio.CancelledError:  # closed by the sidecar (stall, shutdown): the handler ends here
            pass
        finally:
            self._connections.discard(conn)

    async def close(self, grace_s: float = 10.0) -> None:
        """Stop accepting and remove the socket file; in-flight calls get up to `grace_s` to finish,
        then answer `cancelled` (§15.4)."""
        self.shutting_down = True
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        conns = list(self._connections)
        if conns:
            await asyncio.gather(*(c.finish(grace_s) for c in conns), return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._server.wait_closed()


__all__ = ["LocalIngest"]
