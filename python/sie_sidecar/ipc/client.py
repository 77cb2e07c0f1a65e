# SPDX-License-Identifier: Apache-2.0
"""The sidecar's IPC client: a pool of Unix-socket connections to one backend child.

Wire-protocol §1.2 (pool transport), §1.4 (timeouts), §2 (envelopes) and §6 (response chunks).
Each pooled connection carries one request at a time, so a response is simply the next frame(s) on
that connection; the ids still have to match, and anything that may have left unread bytes on the
stream (timeout, decode, frame-size or chunk errors) costs the connection, because the next
request on it would read the tail of this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar

import msgpack

from .. import wire
from ..errors import (
    NO_RUN_BATCH,
    ConfigNotAttested,
    DecodeError,
    IpcServerError,
    IpcTimeout,
    IpcTransportError,
    ProtocolError,
    WireError,
)
from ..logs import Throttled
from ..telemetry import (
    DURATION_BOUNDS_S,
    IPC_ACQUIRE_DURATION,
    IPC_CAPACITY,
    IPC_CHUNK_COUNT,
    IPC_CHUNK_RESERVED,
    IPC_INFLIGHT,
    IPC_RECONSTRUCTED_SIZE,
    IPC_REQUEST_DURATION,
    IPC_REQUESTS,
    IPC_RESPONSE_CHUNKS,
    SIZE_BOUNDS_BYTES,
    Counter,
    Histogram,
    Registry,
)
from ..telemetry.catalog import IPC_METHODS, closed
from ..wire.limits import IPC_VERSION
from .connection import FrameConnection, open_frame_connection
from .transport import TransportFailure, is_retryable
from .types import ConfigResponse, GenerateEvent, PingResponse, ReadyResponse

if TYPE_CHECKING:
    from types import TracebackType

    from .requests import EncodedBody

log = logging.getLogger(__name__)
#: Replaced by a new object whenever a request running in this task needs the §1.2 retry: a request
#: that finds another object here at its end than at its start was retried (`success_after_retry`).
#: Read, not reset, at each request's start: a `set` per request made a context and a token.
_retried: contextvars.ContextVar[object | None] = contextvars.ContextVar("ipc_retried", default=None)
_METHOD_NAMES: dict[str, str] = {}


def _method_name(method: str) -> str:
    """§13's IPC method attribute: the snake_case of the method (`RunBatch` → `run_batch`)."""
    name = _METHOD_NAMES.get(method)
    if name is None:
        name = _METHOD_NAMES[method] = closed(re.sub(r"(?<!^)(?=[A-Z])", "_", method).lower(), IPC_METHODS)
    return name


#: Chunk counts of one reassembled response: 2 to 4,096 (wire-protocol §6 caps a transfer).
CHUNK_COUNT_BOUNDS: Final = tuple(float(2**n) for n in range(1, 13))


def record_assembled(telemetry: Registry, frames: int, nbytes: int) -> None:
    """A response that came in `frames` chunk frames (§6): its chunk count and reconstructed size."""
    telemetry.histogram(IPC_CHUNK_COUNT, (), CHUNK_COUNT_BOUNDS).record(frames)
    telemetry.histogram(IPC_RECONSTRUCTED_SIZE, (), SIZE_BOUNDS_BYTES).record(nbytes)


def observe_ipc(telemetry: Registry, clients: list[IpcClient]) -> None:
    """Exported, not recorded: each transport's capacity and requests in flight (summed over the
    backend children), and the process-wide response budget's transfer totals and reservation."""
    budget = wire.response_budget()

    def observe(registry: Registry) -> None:
        for transport in ("pool", "mux"):
            mine = [c for c in clients if c.transport == transport]
            if mine:
                attrs = (("transport", transport),)
                registry.gauge(IPC_CAPACITY, attrs).set(sum(c.capacity for c in mine))
                registry.gauge(IPC_INFLIGHT, attrs).set(sum(c.busy for c in mine))
        for outcome, total in (
            ("completed", budget.completed),
            ("protocol_error", budget.protocol_error),
            ("budget_rejected", budget.budget_rejected),
        ):
            registry.counter(IPC_RESPONSE_CHUNKS, (("outcome", outcome),)).catch_up(total)
        registry.gauge(IPC_CHUNK_RESERVED).set(budget.reserved)

    telemetry.observe(observe)


#: A backend that is gone fails every call (each heartbeat, each batch): one line per method per 10 s.
_warn = Throttled(log)

T = TypeVar("T")
#: Whether the hash a backend last reported lets hash-pinned work run on it (`ConfigState.executes_on`).
Attest = Callable[[str | None], bool]

#: The per-op batch methods `process_batch` may call (wire-protocol §3.10).
PROCESS_BATCH_METHODS: Final = ("ProcessEncodeBatch", "ProcessScoreBatch", "ProcessExtractBatch")


class _Slot:
    """One pool connection (opened lazily); its protocol splits the frames as they arrive."""

    __slots__ = ("conn", "index")

    def __init__(self, index: int) -> None:
        self.index = index
        self.conn: FrameConnection | None = None

    @property
    def connected(self) -> bool:
        return self.conn is not None

    def disconnect(self) -> None:
        """Drop the connection (the transport closes in the background); the slot stays reusable."""
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    async def aclose(self) -> None:
        conn = self.conn
        self.disconnect()
        if conn is not None:
            with contextlib.suppress(OSError, RuntimeError):
                await conn.wait_closed()


class IpcClient:
    """Pool transport to one backend socket (wire-protocol §1.2).

    `pool_size` connections, each opened on first use and carrying one request at a time. Request
    ids are `w-<n>` from 1. A transport error is retried exactly once with the identical bytes,
    preferring another slot; nothing else is retried. Each timeout covers one exchange: connecting,
    writing, reading the response and reassembling a chunked one (waiting for a free slot is not
    counted).
    """

    def __init__(
        self,
        socket_path: str,
        *,
        pool_size: int = 4,
        request_timeout_s: float = 60.0,
        model_ready_timeout_s: float = 900.0,
        budget: wire.ResponseBudget | None = None,
    ) -> None:
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size must be a positive integer, got {pool_size!r}")
        for name, value in (("request_timeout_s", request_timeout_s), ("model_ready_timeout_s", model_ready_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        self._path = socket_path
        self._pool_size = pool_size
        self._request_timeout_s = float(request_timeout_s)
        self._model_ready_timeout_s = float(model_ready_timeout_s)
        self._budget = budget
        self._ids = itertools.count(1)
        self._slots = [_Slot(i) for i in range(pool_size)]
        #: Models whose dispatch width already grew the pool (each counts once).
        self._widened: set[str] = set()
        # LIFO: the most recently used (warm) connection goes out first; the rest stay unopened.
        self._idle: asyncio.LifoQueue[_Slot] = asyncio.LifoQueue()
        for slot in reversed(self._slots):
            self._idle.put_nowait(slot)
        self._closed = False
        #: Where `ipc.requests` and `ipc.request.duration` are recorded (§13); None: not recorded.
        self.telemetry: Registry | None = None
        self._instruments: dict[tuple[str, str], tuple[Registry, Counter, Histogram]] = {}
        self._acquire_instruments: dict[str, tuple[Registry, Histogram]] = {}
        #: v0.7.1 sends every batch as RunBatch (it never reads `supports_run_batch`); a backend that
        #: answered "unknown method RunBatch" once, to a batch or a drain probe, gets per-op methods.
        self._runs_batches = True
        #: The bundle-config hash this backend reported in its last Ping; None before the first one
        #: and after a transport failure (a restarted backend may hold another config, §9.4).
        self.reported_hash: str | None = None

    # -- properties ---------------------------------------------------------------------------

    #: The telemetry name of this transport (§13: IPC transport {pool, mux}).
    transport = "pool"

    @property
    def socket_path(self) -> str:
        return self._path

    @property
    def pool_size(self) -> int:
        return self._pool_size

    @property
    def open_connections(self) -> int:
        """Connections currently open (idle or busy); for metrics and tests."""
        return sum(1 for slot in self._slots if slot.connected)

    @property
    def capacity(self) -> int:
        """Requests this client can have in flight at once (`sie.worker.ipc.capacity`)."""
        return self._pool_size

    @property
    def busy(self) -> int:
        """Requests in flight now (`sie.worker.ipc.inflight`): the slots not idle."""
        return self._pool_size - self._idle.qsize()

    @property
    def closed(self) -> bool:
        return self._closed

    def grow_for(self, model_id: str, width: int | None) -> int:
        """wire-protocol §1.2 (newer than v0.7.1): an engine-batched model (dispatch width > 1, clamped
        to 1024) adds its width of connections to the pool, once per model, so its concurrent batches
        do not queue for a slot; the pool never shrinks. Returns the pool size after."""
        if width is None or width <= 1 or model_id in self._widened or self._closed:
            return self._pool_size
        self._widened.add(model_id)
        added = min(1024, width)
        start = len(self._slots)
        new = [_Slot(i) for i in range(start, start + added)]
        self._slots.extend(new)
        for slot in reversed(new):
            self._idle.put_nowait(slot)
        self._pool_size += added
        return self._pool_size

    @property
    def runs_batches(self) -> bool:
        """False once the backend answered RunBatch `unknown method` (remembered per backend)."""
        return self._runs_batches

    # -- typed calls --------------------------------------------------------------------------

    async def call(self, method: str, body: bytes, *, timeout_s: float | None = None) -> bytes:
        """Send `body` (an encoded msgpack map) and return the response body map's raw bytes."""
        return await self._request(method, body, self._timeout_for(method, timeout_s), bytes)

    async def ping(self, *, timestamp_ms: float | None = None) -> PingResponse:
        """Heartbeat; `timestamp_ms` defaults to the wall clock in milliseconds."""
        ts = time.time() * 1000.0 if timestamp_ms is None else float(timestamp_ms)
        body = _pack({"timestamp_ms": ts})
        pong = await self._request("Ping", body, self._request_timeout_s, _typed(PingResponse.from_body))
        self.reported_hash = pong.bundle_config_hash
        return pong

    async def ensure_model_ready(self, model_id: str) -> ReadyResponse:
        """Ask the backend to make `model_id` ready; bounded by `model_ready_timeout_s`."""
        if not isinstance(model_id, str):
            raise TypeError("model_id must be a str")
        body = _pack({"model_id": model_id})
        return await self._request(
            "EnsureModelReady", body, self._model_ready_timeout_s, _typed(ReadyResponse.from_body)
        )

    async def client_for(self, model_id: str) -> Self:
        """The client that serves `model_id`'s batches: this one (one child serves every model)."""
        return self

    async def run_batch(self, body: EncodedBody) -> wire.BatchOutcome:
        """RunBatch with an already-encoded RunBatchRequest."""
        return await self.run_batch_with(body, wire.decode_batch_outcome)

    async def run_batch_with(
        self,
        body: EncodedBody,
        decode: Callable[[memoryview], T],
        *,
        attest: Attest | None = None,
        timeout_s: float | None = None,
    ) -> T:
        """RunBatch whose response body goes to `decode` while the client still holds its bytes
        (the pipeline frames replies straight from them); `decode` must not keep the view.

        `attest` (for hash-pinned work): called with the hash the backend reported in its last Ping,
        on the connection the batch is about to be written to; False raises `ConfigNotAttested` and
        nothing is sent. A connection opened after one was lost has no attested hash (None): the
        process behind it may be a restarted backend that lost its config.

        `timeout_s`: the batch's wait when longer than the request timeout (a work deadline further
        out, sidecar-behaviour §15.1); never shorter."""
        try:
            return await self._request("RunBatch", body, self._batch_wait(timeout_s), decode, attest=attest)
        except IpcServerError as exc:
            if exc.message == NO_RUN_BATCH and self._runs_batches:
                self._runs_batches = False
                log.warning("backend does not implement RunBatch; per-op batch methods from now on")
            raise

    def _batch_wait(self, timeout_s: float | None) -> float:
        """A batch call's wait: the request timeout, or a longer `timeout_s` (a work deadline)."""
        return self._request_timeout_s if timeout_s is None else max(self._request_timeout_s, float(timeout_s))

    async def process_batch(
        self, method: str, body: bytes, *, attest: Attest | None = None, timeout_s: float | None = None
    ) -> wire.BatchOutcome:
        """One of the per-op batch methods, for a backend that answered RunBatch `unknown method`
        (`timeout_s` as for `run_batch_with`: the V1 variants get the deadline-derived wait too)."""
        if method not in PROCESS_BATCH_METHODS:
            raise ValueError(f"process_batch method must be one of {', '.join(PROCESS_BATCH_METHODS)}, got {method!r}")
        return await self._request(method, body, self._batch_wait(timeout_s), wire.decode_batch_outcome, attest=attest)

    async def probe_draining(self, model_id: str = "") -> bool:
        """Whether the backend refuses batch work as `draining`, found with an empty batch (§4.1: empty
        `items` → empty outcomes), so no work item spends a delivery to learn it. A Ping cannot tell:
        its `ready` is the backend's health, not its drain state. Any answer but `draining` (outcomes,
        or an error about the empty body) means it takes work; transport failures raise."""
        if not self._runs_batches:
            return await self._per_op_draining(model_id)
        body = _pack({"model_id": model_id, "batch_id": 0, "lora_key": "", "total_cost": 0, "items": []})
        try:
            await self.run_batch_with(body, bytes)
        except IpcServerError as exc:
            if exc.message == NO_RUN_BATCH:  # a per-op backend: ask one of its methods
                return await self._per_op_draining(model_id)
            return exc.message == "draining"
        return False

    async def _per_op_draining(self, model_id: str) -> bool:
        try:
            await self._request(
                "ProcessEncodeBatch", _pack({"model_id": model_id, "items": []}), self._request_timeout_s, bytes
            )
        except IpcServerError as exc:
            return exc.message == "draining"
        return False

    async def apply_model_config(self, body: dict[str, Any]) -> ConfigResponse:
        """ApplyModelConfig (§3.3) with the ordinary IPC timeout; the caller retries transient errors."""
        return await self._request(
            "ApplyModelConfig", _pack(body), self._request_timeout_s, _typed(ConfigResponse.from_body)
        )

    async def replace_model_configs(self, body: dict[str, Any]) -> ConfigResponse:
        """ReplaceModelConfigs (§3.4): an authoritative snapshot of the bundle's configs."""
        return await self._request(
            "ReplaceModelConfigs", _pack(body), self._request_timeout_s, _typed(ConfigResponse.from_body)
        )

    async def signal_generate_cancel(self, request_id: str) -> bool:
        """SignalGenerateCancel (§3.8): whether the backend had a generation of `request_id` to stop."""
        body = _pack({"request_id": request_id})
        return await self._request("SignalGenerateCancel", body, self._request_timeout_s, _typed(_matched))

    async def generate(
        self, model_id: str, work_item_msgpack: bytes, *, frame_timeout_s: float = 300.0
    ) -> AsyncIterator[GenerateEvent]:
        """ProcessGenerate (wire-protocol §5): a fresh connection of its own, no response chunks, and
        the backend's events one by one until `done` (included). Each frame must arrive within
        `frame_timeout_s` (`IpcTimeout`); an `ok=false` frame raises `IpcServerError`; a connection
        that ends before `done` raises `IpcTransportError`. The connection closes when the caller
        stops iterating, whatever the reason."""
        if self._closed:
            raise IpcTransportError(f"IPC client for {self._path} is closed", transient=False)
        request_id = f"w-{next(self._ids)}"
        body = _pack({"model_id": model_id, "work_item_msgpack": work_item_msgpack})
        frame = wire.encode_request("ProcessGenerate", request_id, body, False)
        try:
            conn = await asyncio.wait_for(open_frame_connection(self._path), frame_timeout_s)
        except TimeoutError:
            raise IpcTimeout(f"ProcessGenerate {request_id}: connect timed out") from None
        except OSError as exc:
            self.reported_hash = None
            raise IpcTransportError(f"ProcessGenerate {request_id} to {self._path}: {exc}") from exc
        try:
            conn.write(frame)
            await conn.drain()
            while True:
                try:
                    raw = await asyncio.wait_for(conn.next_frame(), frame_timeout_s)
                except TimeoutError:
                    raise IpcTimeout(f"ProcessGenerate {request_id}: no frame for {frame_timeout_s:g} s") from None
                except EOFError:
                    raise IpcTransportError(f"ProcessGenerate {request_id}: the backend closed the stream") from None
                env = wire.decode_response(raw)
                if not isinstance(env, wire.ResponseEnvelope):
                    raise ProtocolError("a ProcessGenerate stream carries no response chunks")
                if env.request_id != request_id:  # wire §2.2: a server error here, not a protocol one
                    raise IpcServerError("generate stream response request_id mismatch")
                event = GenerateEvent.from_body(wire.decode_body(wire.response_body(env, request_id)))
                yield event
                if event.kind == "done":
                    return
        except OSError as exc:
            raise IpcTransportError(f"ProcessGenerate {request_id} to {self._path}: {exc}") from exc
        finally:
            conn.close()
            with contextlib.suppress(Exception):
                await conn.wait_closed()

    async def drain(self, deadline_ms: int = 15000) -> bool:
        """Tell the backend to stop taking batch work; returns its `acknowledged` flag."""
        if isinstance(deadline_ms, bool) or not isinstance(deadline_ms, int) or deadline_ms < 0:
            raise ValueError(f"deadline_ms must be a non-negative integer, got {deadline_ms!r}")
        body = _pack({"deadline_ms": deadline_ms})
        return await self._request("Drain", body, self._request_timeout_s, _typed(_acknowledged))

    async def close(self) -> None:
        """Close idle connections now and busy ones when their request ends; later calls fail."""
        self._closed = True
        idle: list[_Slot] = []
        while not self._idle.empty():
            idle.append(self._idle.get_nowait())
        await asyncio.gather(*(slot.aclose() for slot in idle))
        for slot in reversed(idle):
            self._idle.put_nowait(slot)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- the exchange -------------------------------------------------------------------------

    def _timeout_for(self, method: str, timeout_s: float | None) -> float:
        if timeout_s is not None:
            if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
                raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
            return float(timeout_s)
        return self._model_ready_timeout_s if method == "EnsureModelReady" else self._request_timeout_s

    async def _acquire(self) -> _Slot:
        if self._closed:
            raise IpcTransportError(f"IPC client for {self._path} is closed", transient=False)
        slot = await self._idle.get()
        if self._closed:
            self._release(slot)
            raise IpcTransportError(f"IPC client for {self._path} is closed", transient=False)
        return slot

    def _idle_slot(self) -> _Slot | None:
        """An idle slot, taken, or None when there is none (or the client is closed: `_acquire`
        then raises)."""
        if self._closed or self._idle.empty():
            return None
        return self._idle.get_nowait()

    def _acquire_histogram(self, telemetry: Registry, outcome: str) -> Histogram:
        """`sie.worker.ipc.acquire.duration` of `outcome` (metrics on only)."""
        found = self._acquire_instruments.get(outcome)
        if found is None or found[0] is not telemetry:  # once per outcome and registry
            attrs = (("transport", self.transport), ("outcome", outcome))
            found = (telemetry, telemetry.histogram(IPC_ACQUIRE_DURATION, attrs, DURATION_BOUNDS_S))
            self._acquire_instruments[outcome] = found
        return found[1]

    async def _acquire_other(self, failed: _Slot) -> _Slot:
        """For the retry: another idle slot if there is one, else whichever frees first (maybe
        `failed` itself, reconnected). `failed` is released either way."""
        try:
            other = self._idle.get_nowait()
        except asyncio.QueueEmpty:
            self._release(failed)
            return await self._acquire()
        self._release(failed)
        if self._closed:
            self._release(other)
            raise IpcTransportError(f"IPC client for {self._path} is closed", transient=False)
        return other

    def _release(self, slot: _Slot) -> None:
        if self._closed:
            slot.disconnect()
        self._idle.put_nowait(slot)

    async def _request(
        self,
        method: str,
        body: EncodedBody,
        timeout_s: float,
        decode: Callable[[memoryview], T],
        *,
        attest: Attest | None = None,
    ) -> T:
        telemetry = self.telemetry  # None (metrics off): no clock, no flag, nothing recorded
        started = 0.0
        retries: object | None = None
        if telemetry is not None:
            started = time.perf_counter()
            retries = _retried.get()
        outcome = "success"
        try:
            return await self._exchange_once(method, body, timeout_s, decode, attest)
        except IpcTransportError:
            self.reported_hash = None  # whatever answers next may be a restarted backend
            outcome = "transport_error"
            raise
        except IpcTimeout:
            outcome = "timeout"
            raise
        except IpcServerError:
            outcome = "server_error"
            raise
        except (ConfigNotAttested, asyncio.CancelledError):
            outcome = "not_sent"  # refused before writing, or abandoned by its caller: no outcome to count
            raise
        except WireError:
            outcome = "protocol_error"
            raise
        finally:
            if telemetry is not None and outcome != "not_sent":
                if outcome == "success" and _retried.get() is not retries:
                    outcome = "success_after_retry"
                # The lookup inline, a method only on a miss: a call a batch to a function run
                # nowhere else costs its cold code and frame (docs/benchmarks.md, issue 32).
                found = self._instruments.get((method, outcome))
                if found is None or found[0] is not telemetry:
                    found = self._request_instruments(telemetry, method, outcome)
                found[1].value += 1
                found[2].record(time.perf_counter() - started)

    def _request_instruments(
        self, telemetry: Registry, method: str, outcome: str
    ) -> tuple[Registry, Counter, Histogram]:
        """The request counter and duration of (method, outcome), made once per registry and kept
        in `_instruments` (two registry lookups per request were a third of the IPC recording)."""
        attrs = (("method", _method_name(method)), ("outcome", outcome))
        found = self._instruments[(method, outcome)] = (
            telemetry,
            telemetry.counter(IPC_REQUESTS, attrs),
            telemetry.histogram(IPC_REQUEST_DURATION, attrs, DURATION_BOUNDS_S),
        )
        return found

    async def _exchange_once(
        self, method: str, body: EncodedBody, timeout_s: float, decode: Callable[[memoryview], T], attest: Attest | None
    ) -> T:
        """One request over a pool slot, with the §1.2 transport retry on another slot."""
        request_id = f"w-{next(self._ids)}"
        frame = wire.encode_request(method, request_id, body, True)  # FrameTooLarge: nothing written
        telemetry = self.telemetry
        # An idle slot is taken at once, as `_acquire` would take it, without its coroutine (and,
        # metrics on, without timing a wait that did not happen: it is recorded as 0).
        slot: _Slot | None = self._idle_slot()
        waited_s = 0.0
        if slot is None:
            if telemetry is None:
                slot = await self._acquire()
            else:  # timed here, not in a wrapping coroutine: one coroutine less per request
                asked = time.perf_counter()
                try:
                    slot = await self._acquire()
                except BaseException:
                    self._acquire_histogram(telemetry, "error").record(time.perf_counter() - asked)
                    raise
                waited_s = time.perf_counter() - asked
        try:
            assert slot is not None
            if telemetry is not None:  # inside: the slot goes back whatever the recording does
                self._acquire_histogram(telemetry, "success").record(waited_s)
            try:
                return await self._attempt(slot, frame, request_id, timeout_s, decode, attest=attest)
            except TransportFailure as first:
                self._retry_or_raise(method, request_id, first)
            failed, slot = slot, None
            slot = await self._acquire_other(failed)  # releases `failed` on every path
            try:
                return await self._attempt(slot, frame, request_id, timeout_s, decode, attest=attest)
            except TransportFailure as second:
                raise self._retry_failed(method, request_id, second) from second.cause
        finally:
            if slot is not None:
                self._release(slot)

    # The §1.2 retry rule of both transports, as two plain calls on the failure paths only: the
    # success path makes no closure and no extra coroutine per request (the hot path, issue 13).

    def _retry_or_raise(self, method: str, request_id: str, first: TransportFailure) -> None:
        """§1.2, after a first transport failure: raise `IpcTransportError` unless it is retryable
        (then log it: the caller sends the same bytes once more, on another connection)."""
        if not first.retryable:
            detail = f"{method} {request_id} to {self._path}: {first}"
            raise IpcTransportError(detail, transient=False) from first.cause
        _retried.set(object())
        _warn.warning(
            "IPC transport error; retrying once",
            key=method,
            extra={"method": method, "request_id": request_id, "error": str(first), "transport": self.transport},
        )

    def _retry_failed(self, method: str, request_id: str, second: TransportFailure) -> IpcTransportError:
        """§1.2: what the retry's own transport failure becomes (the caller raises it)."""
        return IpcTransportError(
            f"{method} {request_id} to {self._path} failed after one retry: {second}",
            transient=second.retryable,
        )

    async def _attempt(
        self,
        slot: _Slot,
        frame: bytes | memoryview,
        request_id: str,
        timeout_s: float,
        decode: Callable[[memoryview], T],
        *,
        attest: Attest | None = None,
    ) -> T:
        """One write and the response(s) on one slot; the slot is disconnected unless `keep`."""
        assembler = wire.IpcChunkAssembler(request_id, self._budget)
        keep = False
        frames = 0
        try:
            try:
                async with asyncio.timeout(timeout_s):
                    conn = await self._connect(slot)
                    if attest is not None and not attest(self.reported_hash):
                        keep = True  # nothing was written: the connection is in step
                        raise ConfigNotAttested(f"backend at {self._path} does not attest the config")
                    conn.write(frame)
                    await conn.drain()
                    while True:
                        frames += 1
                        assembled = assembler.feed(wire.decode_response(await conn.next_frame()))
                        if assembled is not None:
                            break
                if frames > 1 and self.telemetry is not None:
                    record_assembled(self.telemetry, frames, assembled.nbytes)
            except TimeoutError:
                raise IpcTimeout(f"IPC request {request_id} timed out after {timeout_s:g} s") from None
            except (OSError, EOFError) as exc:
                self.reported_hash = None  # the process that answers next may be another one
                raise TransportFailure(exc, retryable=is_retryable(exc)) from exc
            try:
                env = assembled.decode()
                try:
                    raw = wire.response_body(env, request_id)
                except IpcServerError:
                    keep = True  # a logical error; the stream is in step
                    raise
                except ProtocolError:
                    keep = env.version != IPC_VERSION and env.request_id == request_id  # §1.2: kept
                    raise
                result = decode(raw)
                keep = True
                return result
            finally:
                assembled.release()  # only after the typed decode: the reservation covers the bytes
        finally:
            if not keep:
                assembler.abort()
                slot.disconnect()

    async def _connect(self, slot: _Slot) -> FrameConnection:
        conn = slot.conn
        if conn is not None and (conn.at_eof or conn.is_closing):
            slot.disconnect()  # the backend closed this idle connection; reconnecting is not a retry
            self.reported_hash = None  # ... but whatever answers may be a restarted backend
            conn = None
        if conn is None:
            conn = slot.conn = await open_frame_connection(self._path)
        return conn


def _pack(body: dict[str, Any]) -> bytes:
    return bytes(msgpack.packb(body, use_bin_type=True))


def _typed(from_body: Callable[[Any], T]) -> Callable[[memoryview], T]:
    """Generic decode of the body map, then the typed decoder (both raise DecodeError)."""

    def decode(raw: memoryview) -> T:
        return from_body(wire.decode_body(raw))

    return decode


def _matched(body: Any) -> bool:
    if not isinstance(body, dict):
        raise DecodeError("SignalGenerateCancelResponse must be a map")
    value = body.get("matched")
    if value is None:
        return False
    if not isinstance(value, bool):
        raise DecodeError("SignalGenerateCancelResponse 'matched' must be a bool")
    return value


def _acknowledged(body: Any) -> bool:
    if not isinstance(body, dict):
        raise DecodeError("DrainResponse must be a map")
    value = body.get("acknowledged")
    if value is None:
        return False
    if not isinstance(value, bool):
        raise DecodeError("DrainResponse 'acknowledged' must be a bool")
    return value


__all__ = [
    "PROCESS_BATCH_METHODS",
    "IpcClient",
    "IpcTimeout",
    "IpcTransportError",
    "observe_ipc",
    "record_assembled",
]
