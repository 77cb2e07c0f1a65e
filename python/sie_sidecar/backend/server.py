# SPDX-License-Identifier: Apache-2.0
"""The reference backend's IPC server (wire-protocol §1.3, §2, §3, §4.1, §6.1/§6.4).

It plays the Python backend's side of the socket so the sidecar can be tested end to end without a
GPU, and so a real model (MiniLM) can be put behind the same protocol code. Everything a backend
must get right on the wire lives here; adapters only see validated batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import stat
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

import msgpack

from .. import wire
from ..errors import INVALID_INPUT, RUN_BATCH_INVALID_ITEM, RUN_BATCH_MIXED_OP, DecodeError, FrameTooLarge
from ..ipc.types import GenerateEvent, PingResponse, ReadyResponse
from ..wire.limits import IPC_VERSION
from .adapter import OOM_NAK_DELAY_MS, OPS, Adapter, F16Multivector, is_out_of_memory, item_outcome, outcome_for
from .audio import prepared_audio_error
from .bodies import BadBody
from .bodies import opt_bool as _opt_bool
from .bodies import opt_str as _opt_str
from .bodies import opt_uint as _opt_uint
from .bodies import req_list as _req_list
from .bodies import req_str as _req_str
from .bodies import req_uint as _req_uint
from .generation import GenerateStream
from .grouping import limit_error, sub_groups
from .model_config import (
    apply_response,
    decode_apply_model_config,
    decode_replace_model_configs,
    decode_set_pinned_models,
    pinned_response,
    replace_response,
)

log = logging.getLogger(__name__)

#: Methods that run as background tasks (responses may leave out of order) and are refused while draining.
HEAVY_METHODS: Final = frozenset(
    {"RunBatch", "ProcessEncodeBatch", "ProcessScoreBatch", "ProcessExtractBatch", "ProcessGenerate"}
)
#: The per-op batch methods and the op each carries.
PROCESS_METHOD_OPS: Final = {
    "ProcessEncodeBatch": "encode",
    "ProcessScoreBatch": "score",
    "ProcessExtractBatch": "extract",
}
#: v0.7.1 methods this backend knows but does not implement (answered with a NotImplementedError envelope).
UNSUPPORTED_METHODS: Final[frozenset[str]] = frozenset()
#: How long a stop lets in-flight batches finish (upstream's bound; a Drain deadline, if tighter, wins).
STOP_GRACE_S: Final = 25.0
#: The backend considers its sidecar stale after this long without a Ping (wire-protocol §3.1).
HEARTBEAT_STALE_S: Final = 10.0

_READ_LIMIT: Final = 1 << 20
_MAX_SOCKET_PATH: Final = 107  # sun_path holds 108 bytes including the terminating NUL
_READ_SIZE: Final = 4 << 20

Body = dict[str, Any]
_Identity = tuple[str, str, int]  # a RunBatchItem's work_item_id, request_id, item_index
Handler = Callable[[Body], Awaitable[Body]]


def encode_response(request_id: str, ok: bool, body: Mapping[str, Any] | None, error: str | None) -> bytes:
    """A ResponseEnvelope with exactly the five keys in fast-path order (wire-protocol §1.6, TV-I1)."""
    envelope = {"version": IPC_VERSION, "request_id": request_id, "ok": ok, "body": body, "error": error}
    return bytes(msgpack.packb(envelope, use_bin_type=True))


class _Connection:
    """One accepted socket: its writer and the heavy tasks answering on it."""

    __slots__ = ("tasks", "writer")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.tasks: set[asyncio.Task[None]] = set()


class BackendServer:
    """Serves one adapter on a Unix socket (mode 0600), any number of concurrent connections."""

    def __init__(
        self,
        adapter: Adapter,
        socket_path: str,
        *,
        worker_id: str,
        stop_grace_s: float = STOP_GRACE_S,
        release_drain_on_disconnect: bool = True,
        oom_nak_delay_ms: int = OOM_NAK_DELAY_MS,
    ) -> None:
        """`stop_grace_s`: how long `close` lets in-flight batches finish (a Drain deadline, when
        tighter, wins). `oom_nak_delay_ms`: the `nak_retry` delay of a batch whose adapter ran the
        accelerator out of memory (`SIE_OOM_NAK_DELAY_S`, wire-protocol §4.6).
        `release_drain_on_disconnect`: a `Drain` IPC belongs to the sidecar that sent it; once
        every connection has closed, the backend takes work again (our extension: v0.7.1 stays
        draining until restarted, so a sidecar container restarted alone, say after a
        failed liveness probe, left the pod idle; False restores that)."""
        self._adapter = adapter
        self._stop_grace_s = max(0.0, stop_grace_s)
        self._oom_nak_delay_ms = max(1, int(oom_nak_delay_ms))
        self._path = socket_path
        self._worker_id = worker_id
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[Any], _Connection] = {}
        self._heavy: set[asyncio.Task[None]] = set()
        self._draining = False
        #: The drain came from a Drain request (not from `close` or the test hook): it is released
        #: when the last connection closes, if `release_drain_on_disconnect`.
        self._drain_requested = False
        self._release_drain_on_disconnect = release_drain_on_disconnect
        self._undrain: asyncio.TimerHandle | None = None
        #: Batch items refused with `draining` (tests count how much work a sidecar sent meanwhile),
        #: and how often each work item was refused (a delivery the item spent for nothing).
        self.refused_items = 0
        self.refusals: Counter[str] = Counter()
        self._drain_deadline_ms: float | None = None
        self._last_ping: float | None = None
        self._closed = False
        #: Active generation streams by the work item's request id (for SignalGenerateCancel).
        self._generations: dict[str, GenerateStream] = {}
        self._handlers: dict[str, Handler] = {
            "Ping": self._ping,
            "EnsureModelReady": self._ensure_model_ready,
            "WorkerCapabilities": self._worker_capabilities,
            "Drain": self._drain,
            "SignalGenerateCancel": self._signal_generate_cancel,
            "RunBatch": self._run_batch,
            "ApplyModelConfig": self._apply_model_config,
            "ReplaceModelConfigs": self._replace_model_configs,
            "SetPinnedModels": self._set_pinned_models,
            "ProcessEncodeBatch": self._process_encode_batch,
            "ProcessScoreBatch": self._process_score_batch,
            "ProcessExtractBatch": self._process_extract_batch,
            "ProcessGenerate": self._process_generate,
        }
        for method in UNSUPPORTED_METHODS:
            self._handlers[method] = self._unsupported(method)
        if getattr(adapter, "supports_run_batch", True) is False:
            # A per-op backend, as one from before RunBatch: the method is unknown, not refused.
            del self._handlers["RunBatch"]
        #: Requests received per method (diagnostics and tests).
        self.method_calls: Counter[str] = Counter()

    # -- state --------------------------------------------------------------------------------

    @property
    def socket_path(self) -> str:
        return self._path

    @property
    def worker_id(self) -> str:
        return self._worker_id

    @property
    def adapter(self) -> Adapter:
        return self._adapter

    @property
    def draining(self) -> bool:
        return self._draining

    def drain_for(self, seconds: float | None = None) -> None:
        """Test hook: refuse batch work with `draining`, as after a `Drain`, for `seconds` (None: until
        `undrain()`), like a backend restarting gracefully. The heartbeat keeps answering the adapter's
        health: a drain is reported by the refusals, as upstream's server does."""
        if self._undrain is not None:
            self._undrain.cancel()
            self._undrain = None
        self._draining = True
        self._drain_requested = False
        if seconds is not None:
            self._undrain = asyncio.get_running_loop().call_later(seconds, self.undrain)
        log.info("backend draining (test hook)", extra={"seconds": seconds})

    def undrain(self) -> None:
        """Test hook: take batch work again (a drained backend restarted, or `drain_for` ran out)."""
        if self._undrain is not None:
            self._undrain.cancel()
            self._undrain = None
        self._draining = False
        self._drain_requested = False
        log.info("backend serving again (test hook)")

    @property
    def drain_deadline_ms(self) -> float | None:
        """The tightest in-flight drain cap a Drain request has set (None: none set)."""
        return self._drain_deadline_ms

    @property
    def last_ping(self) -> float | None:
        """`time.monotonic()` of the latest Ping, the sidecar heartbeat (None before the first)."""
        return self._last_ping

    @property
    def sidecar_stale(self) -> bool:
        """True when no Ping arrived in the last 10 s (or none ever)."""
        return self._last_ping is None or time.monotonic() - self._last_ping > HEARTBEAT_STALE_S

    @property
    def open_connections(self) -> int:
        """Accepted connections whose handler has not finished."""
        return len(self._connections)

    @property
    def in_flight(self) -> int:
        """Heavy requests being processed right now."""
        return len(self._heavy)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind, listen, then move the socket into place: the path appears only when it already
        accepts connections and is already mode 0600 (waiting for the file is a readiness check).

        What a previous run left at the path is cleared: a regular file, or a socket nobody
        listens on. A socket another running server accepts on is refused (`BackendAlreadyRunning`),
        and any other kind of file (a directory, a link) is an error: neither is ours to remove."""
        if self._server is not None:
            return
        if self._closed:
            raise RuntimeError("BackendServer is closed")
        _clear_stale_path(self._path)
        staging = self._path + ".new"
        if len(os.fsencode(staging)) > _MAX_SOCKET_PATH:
            staging = self._path  # no room for a staging name: bind in place
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(staging)
            os.chmod(staging, 0o600)
            self._server = await asyncio.start_unix_server(self._on_connection, sock=sock, limit=_READ_LIMIT)
            if staging != self._path:
                os.replace(staging, self._path)
        except BaseException:
            if self._server is not None:
                self._server.close()
                self._server = None
            sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staging)
            raise
        log.info("backend listening", extra={"socket": self._path, "worker_id": self._worker_id})

    async def serve_forever(self) -> None:
        """Start if needed and serve until cancelled; closes the server on the way out."""
        await self.start()
        assert self._server is not None
        try:
            await self._server.serve_forever()
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop accepting, let in-flight batches finish (up to `stop_grace_s`, or the Drain deadline
        when tighter; new batch work is refused with `draining` meanwhile), cancel the rest, unlink."""
        if self._closed:
            return
        self._closed = True
        if self._undrain is not None:
            self._undrain.cancel()
            self._undrain = None
        server, self._server = self._server, None
        if server is not None:
            server.close()
        if self._heavy:
            bound = self._stop_grace_s
            if self._drain_deadline_ms:
                bound = min(bound, self._drain_deadline_ms / 1000.0)
            self._draining = True  # a graceful stop: batches in flight finish, new ones are refused
            if bound > 0:
                await asyncio.wait(set(self._heavy), timeout=bound)
        heavy = list(self._heavy)
        for task in heavy:
            task.cancel()
        await asyncio.gather(*heavy, return_exceptions=True)
        # Aborting the transports ends each connection's read loop with EOF, so the handlers finish
        # on their own (Python 3.11's stream server mis-reports a handler that ends cancelled).
        for conn in list(self._connections.values()):
            conn.writer.transport.abort()
        if self._connections:
            _, pending = await asyncio.wait(set(self._connections), timeout=5.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)
        await self._adapter.aclose()

    async def __aenter__(self) -> BackendServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- connections --------------------------------------------------------------------------

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closed:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        conn = _Connection(writer)
        self._connections[task] = conn
        try:
            await self._serve(reader, conn)
        except ConnectionError:
            pass
        except asyncio.CancelledError:
            # Only close() cancels a handler, and only one that ignored its aborted transport; ending
            # normally keeps 3.11's stream server from logging the cancellation as an error.
            pass
        finally:
            for heavy in conn.tasks:
                heavy.cancel()
            await asyncio.gather(*conn.tasks, return_exceptions=True)
            writer.close()
            with contextlib.suppress(OSError, RuntimeError, asyncio.CancelledError):
                await writer.wait_closed()
            del self._connections[task]
            self._release_drain_if_unowned()

    def _release_drain_if_unowned(self) -> None:
        """The sidecar that asked for the drain has gone (no connection left): take work again, so
        the next sidecar of the pod is served instead of finding the backend drained for good."""
        if not (self._drain_requested and self._release_drain_on_disconnect) or self._connections or self._closed:
            return
        self._drain_requested = False
        self._draining = False
        self._drain_deadline_ms = None
        log.info("backend takes work again: every connection of the sidecar that asked for the drain has closed")

    async def _serve(self, reader: asyncio.StreamReader, conn: _Connection) -> None:
        splitter = wire.FrameSplitter()
        while True:
            data = await reader.read(_READ_SIZE)
            if not data:
                return
            try:
                frames = splitter.feed(data)
            except FrameTooLarge as exc:
                log.warning("IPC frame too large; closing the connection", extra={"error": str(exc)})
                return
            for frame in frames:
                if not await self._dispatch(conn, frame):
                    return

    async def _dispatch(self, conn: _Connection, frame: memoryview) -> bool:
        """Route one request frame; False closes the connection (a protocol error, §1.3 / TV-I4)."""
        try:
            request = wire.decode_body(frame)
        except DecodeError as exc:
            log.warning("undecodable IPC frame; closing the connection", extra={"error": str(exc)})
            return False
        if not isinstance(request, dict):
            log.warning("IPC frame is not a map; closing the connection")
            return False
        request_id = request.get("request_id")
        reply_id = request_id if isinstance(request_id, str) else ""
        version = request.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version != IPC_VERSION:
            await self._send(conn, reply_id, None, f"unsupported version {version}", accepts_chunks=False)
            return True
        method = request.get("method")
        body = request.get("body")
        if body is None:
            body = {}
        if not isinstance(method, str) or not isinstance(request_id, str) or not isinstance(body, dict):
            await self._send(conn, reply_id, None, "envelope missing fields", accepts_chunks=False)
            return True
        accepts_chunks = request.get("accepts_ipc_response_chunks_v1") is True
        self.method_calls[method] += 1
        handler = self._handlers.get(method)
        if handler is None:
            await self._send(conn, request_id, None, f"unknown method {method}", accepts_chunks=False)
        elif method in HEAVY_METHODS:
            if self._draining:
                items = body.get("items")
                self.refused_items += len(items) if isinstance(items, list) else 0
                self._count_refusals(items)
                await self._send(conn, request_id, None, "draining", accepts_chunks=False)
            else:
                answer = (
                    self._stream_generate(conn, request_id, body)
                    if method == "ProcessGenerate"
                    else self._answer(conn, method, request_id, body, handler, accepts_chunks=accepts_chunks)
                )
                task = asyncio.create_task(answer)
                conn.tasks.add(task)
                self._heavy.add(task)
                task.add_done_callback(conn.tasks.discard)
                task.add_done_callback(self._heavy.discard)
        else:
            await self._answer(conn, method, request_id, body, handler, accepts_chunks=accepts_chunks)
        return True

    def _count_refusals(self, items: object) -> None:
        if not isinstance(items, list):
            return
        for item in items:
            inner = next(
                (item.get(op) for op in ("encode", "score", "extract") if isinstance(item, dict) and item.get(op)), item
            )
            work_item_id = inner.get("work_item_id") if isinstance(inner, dict) else None
            if isinstance(work_item_id, str):
                self.refusals[work_item_id] += 1

    async def _answer(
        self, conn: _Connection, method: str, request_id: str, body: Body, handler: Handler, *, accepts_chunks: bool
    ) -> None:
        try:
            result = await handler(body)
        except BadBody as exc:
            await self._send(conn, request_id, None, f"bad body for {method}: {exc}", accepts_chunks=False)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("IPC method failed", extra={"method": method, "request_id": request_id})
            await self._send(conn, request_id, None, f"{type(exc).__name__}: {exc}", accepts_chunks=False)
        else:
            await self._send(conn, request_id, result, None, accepts_chunks=accepts_chunks)

    async def _send(
        self, conn: _Connection, request_id: str, body: Body | None, error: str | None, *, accepts_chunks: bool
    ) -> None:
        """Serialize once; over 32 MiB, chunk when negotiated, else answer the §2.2 error envelope."""
        try:
            response = encode_response(request_id, error is None, body, error)
        except (TypeError, ValueError, OverflowError) as exc:  # an adapter put a non-msgpack value in its outcome
            log.exception("IPC response not serializable", extra={"request_id": request_id})
            response = encode_response(request_id, False, None, f"{type(exc).__name__}: {exc}")
        try:
            frames = wire.encode_response_frames(response, request_id, accepts_chunks=accepts_chunks)
        except FrameTooLarge as exc:
            log.warning("IPC response too large", extra={"request_id": request_id, "bytes": len(response)})
            frames = [encode_response(request_id, False, None, str(exc))]
        del response
        writer = conn.writer
        if writer.is_closing():
            return
        # No await between the writes: frames of one response are never interleaved with another's.
        for frame in frames:
            writer.write(wire.encode_frame(frame))
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    # -- cheap methods ------------------------------------------------------------------------

    async def _ping(self, body: Body) -> Body:
        timestamp = body.get("timestamp_ms")
        if isinstance(timestamp, bool) or not isinstance(timestamp, int | float):
            raise BadBody("timestamp_ms is required and must be a number")
        self._last_ping = time.monotonic()
        adapter = self._adapter
        return PingResponse(
            timestamp_ms=float(timestamp),
            worker_id=self._worker_id,
            ready=await adapter.health(),  # health only: a Drain shows as `draining` refusals (§3.9)
            bundle_config_hash=adapter.bundle_config_hash(),
            loaded_models=tuple(sorted(set(adapter.loaded_models()))),
            loading_models=tuple(sorted(set(adapter.loading_models()))),
        ).to_body()

    async def _ensure_model_ready(self, body: Body) -> Body:
        model_id = _req_str(body, "model_id")
        ready = await self._adapter.ensure_ready(model_id)
        if not isinstance(ready, ReadyResponse):
            raise TypeError(f"adapter returned {type(ready).__name__}, not ReadyResponse")
        return ready.to_body()

    async def _worker_capabilities(self, body: Body) -> Body:
        adapter = self._adapter
        generation = sorted(set(adapter.generation_models()))
        return {
            "has_generation_models": bool(generation),
            "generation_models": generation,
            "supported_models": sorted(set(adapter.supported_models())),
            "loaded_models": sorted(set(adapter.loaded_models())),
        }

    async def _drain(self, body: Body) -> Body:
        deadline = body.get("deadline_ms")
        if isinstance(deadline, int | float) and not isinstance(deadline, bool) and deadline > 0:
            current = self._drain_deadline_ms
            self._drain_deadline_ms = float(deadline) if current is None else min(current, float(deadline))
        if not self._draining:
            log.info("backend draining", extra={"deadline_ms": self._drain_deadline_ms, "in_flight": self.in_flight})
            self._drain_requested = True  # a drain of the hook's or of close() stays theirs
        self._draining = True
        return {"acknowledged": True}

    async def _signal_generate_cancel(self, body: Body) -> Body:
        request_id = _req_str(body, "request_id")
        stream = self._generations.get(request_id) if request_id else None
        if stream is None:
            return {"matched": False}
        stream.cancelled.set()
        return {"matched": True}

    async def _process_generate(self, body: Body) -> Body:
        raise AssertionError("ProcessGenerate streams (_stream_generate); it has no single answer")

    async def _stream_generate(self, conn: _Connection, request_id: str, body: Body) -> None:
        """ProcessGenerate (wire-protocol §5): `in_progress`, the adapter's events, a settlement (ACK
        when the adapter left it), `done`; an error ends the stream with an error envelope instead."""

        async def send(event: GenerateEvent) -> None:
            await self._send(conn, request_id, event.to_body(), None, accepts_chunks=False)

        try:
            model_id = _req_str(body, "model_id")
            raw = body.get("work_item_msgpack")
            if not isinstance(raw, bytes | bytearray):
                raise BadBody("work_item_msgpack is required and must be binary")
            item = msgpack.unpackb(raw, raw=False, strict_map_key=False)
            if not isinstance(item, dict):
                raise BadBody("work_item_msgpack must be a WorkItem map")
        except BadBody as exc:
            await self._send(conn, request_id, None, f"bad body for ProcessGenerate: {exc}", accepts_chunks=False)
            return
        except Exception as exc:  # undecodable msgpack
            await self._send(conn, request_id, None, f"bad body for ProcessGenerate: {exc}", accepts_chunks=False)
            return
        stream = GenerateStream(send, item, attempt_id=f"{self._worker_id}:{request_id}")
        key = stream.request_id
        self._generations[key] = stream
        try:
            await stream.in_progress()
            await self._adapter.generate(model_id, item, stream)
            if stream.settled is None:
                await stream.ack()
            await stream.done()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("generation failed", extra={"request_id": key, "error": repr(exc)})
            await self._send(conn, request_id, None, f"{type(exc).__name__}: {exc}", accepts_chunks=False)
        finally:
            if self._generations.get(key) is stream:
                del self._generations[key]

    # -- model configuration (§3.3-3.5): checked here, carried out by the adapter's hooks ----------

    async def _apply_model_config(self, body: Body) -> Body:
        return apply_response(await self._adapter.apply_model_config(decode_apply_model_config(body)))

    async def _replace_model_configs(self, body: Body) -> Body:
        return replace_response(await self._adapter.replace_model_configs(decode_replace_model_configs(body)))

    async def _set_pinned_models(self, body: Body) -> Body:
        return pinned_response(await self._adapter.set_pinned_models(decode_set_pinned_models(body)))

    @staticmethod
    def _unsupported(method: str) -> Handler:
        async def handler(body: Body) -> Body:
            raise NotImplementedError(f"{method} is not supported by this backend")

        return handler

    # -- batch methods ------------------------------------------------------------------------

    async def _run_batch(self, body: Body) -> Body:
        """RunBatch (§4.1): one op per request, per-item rejections, LoRA injected, then the adapter."""
        model_id = _req_str(body, "model_id")
        _req_uint(body, "batch_id")
        lora_key = _req_str(body, "lora_key")
        _req_uint(body, "total_cost")
        items = _req_list(body, "items")
        accepts_f16 = _opt_bool(body, "accepts_batched_f16_multivectors")
        wrappers: list[tuple[str, _Identity, Any]] = []
        for i, item in enumerate(items):
            where = f"items[{i}]"
            if not isinstance(item, dict):
                raise BadBody(f"{where} must be a map")
            op = item.get("op")
            if not isinstance(op, str) or op not in OPS:
                raise BadBody(f"{where}.op {op!r} is not one of {', '.join(OPS)}")
            identity = (
                _opt_str(item, "work_item_id", where),
                _opt_str(item, "request_id", where),
                _opt_uint(item, "item_index", 0, where),
            )
            for key in ("traceparent", "tracestate"):
                if item.get(key) is not None and not isinstance(item[key], str):
                    raise BadBody(f"{where}.{key} must be a string or nil")
            wrappers.append((op, identity, item.get(op)))

        ops = sorted({op for op, _, _ in wrappers})
        if len(ops) > 1:
            message = f"RunBatch mixes operations ({', '.join(ops)}); one request must carry one op"
            outcomes = [_reject(identity, message, RUN_BATCH_MIXED_OP) for _, identity, _ in wrappers]
            return {"outcomes": outcomes, "batched_f16_multivectors": []}

        valid: list[dict[str, Any]] = []
        rejected: list[dict[str, Any]] = []
        for i, (op, identity, payload) in enumerate(wrappers):
            if payload is None:
                message = f"RunBatch item has op {op!r} but no {op} payload"
                rejected.append(_reject(identity, message, RUN_BATCH_INVALID_ITEM))
                continue
            _check_payload(op, payload, f"items[{i}].{op}")
            refusal = _refusal(op, payload)
            if refusal is not None:
                rejected.append(_reject(identity, refusal, INVALID_INPUT))
                continue
            valid.append(_with_lora(payload, lora_key) if op != "score" and lora_key else payload)
        outcomes, f16 = await self._outputs(model_id, ops[0] if ops else "", valid, lora_key, accepts_f16)
        # Rejected first, as upstream's server answers (some callers bind outcomes by position).
        return {"outcomes": [*rejected, *outcomes], "batched_f16_multivectors": f16}

    async def _outputs(
        self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str, accepts_f16: bool
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The adapter's outcomes and its batched f16 multivectors (checked, §4.7), for the valid items:
        one adapter call per compatible sub-group (scheduler-and-prep §1.3), one after another."""
        outcomes: list[dict[str, Any]] = []
        f16: list[dict[str, Any]] = []
        for group in sub_groups(op, items):
            try:
                result = await self._adapter.run_batch_outputs(model_id, op, group, lora_key, accepts_f16=accepts_f16)
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                outcomes.extend(self._out_of_memory(model_id, group, exc))
                continue
            if result.f16_buffers and not accepts_f16:
                raise ValueError("the adapter returned batched f16 multivectors the caller did not accept")
            outcomes.extend(result.outcomes)
            f16.extend(batched_f16_output(buffer, slices) for buffer, slices in result.f16_buffers)
        return outcomes, f16

    def _out_of_memory(self, model_id: str, items: list[dict[str, Any]], exc: BaseException) -> list[dict[str, Any]]:
        """An accelerator OOM (wire-protocol §4.6): every item goes back with `nak_retry` and the OOM
        delay, as the Python backend answers, rather than failing the call (which the sidecar would
        NAK with its base delay, straight into the same OOM)."""
        error = f"{type(exc).__name__}: {exc}"
        log.warning(
            "adapter out of memory; batch NAKed", extra={"model": model_id, "items": len(items), "error": error}
        )
        return [outcome_for(item, "nak_retry", nak_delay_ms=self._oom_nak_delay_ms, error=error) for item in items]

    async def _process_batch(self, op: str, body: Body) -> Body:
        """Process{Encode,Score,Extract}Batch (§3.10): the per-op form, items unwrapped, no batch LoRA."""
        model_id = _req_str(body, "model_id")
        items = _req_list(body, "items")
        accepts_f16 = op == "encode" and _opt_bool(body, "accepts_batched_f16_multivectors")
        valid: list[dict[str, Any]] = []
        rejected: list[dict[str, Any]] = []
        for i, item in enumerate(items):
            _check_payload(op, item, f"items[{i}]")
            refusal = _refusal(op, item)
            if refusal is None:
                valid.append(item)
            else:
                rejected.append(outcome_for(item, "publish_error_and_ack", error=refusal, error_code=INVALID_INPUT))
        outcomes, f16 = await self._outputs(model_id, op, valid, "", accepts_f16)
        return {"outcomes": [*rejected, *outcomes], "batched_f16_multivectors": f16}  # rejected first

    async def _process_encode_batch(self, body: Body) -> Body:
        return await self._process_batch("encode", body)

    async def _process_score_batch(self, body: Body) -> Body:
        return await self._process_batch("score", body)

    async def _process_extract_batch(self, body: Body) -> Body:
        return await self._process_batch("extract", body)


# -- validation helpers ----------------------------------------------------------------------------


def _refusal(op: str, payload: dict[str, Any]) -> str | None:
    """Why one valid-shaped item is answered `invalid_input` instead of run: its prepared audio, or
    a builder limit (candidates, labels, schema size)."""
    if op == "extract":
        bad_audio = prepared_audio_error(payload)
        if bad_audio is not None:
            return bad_audio
    return limit_error(op, payload)


def _check_payload(op: str, payload: object, where: str) -> None:
    """The required fields of an Encode/Score/ExtractBatchItem (wire-protocol §4.3)."""
    if not isinstance(payload, dict):
        raise BadBody(f"{where} must be a map")
    _req_str(payload, "work_item_id", where)
    _req_str(payload, "request_id", where)
    _req_uint(payload, "item_index", where)
    _req_uint(payload, "total_items", where)
    timestamp = payload.get("timestamp")
    if isinstance(timestamp, bool) or not isinstance(timestamp, int | float):
        raise BadBody(f"{where}.timestamp is required and must be a number")
    if op == "score":
        if not isinstance(payload.get("query_item"), dict):
            raise BadBody(f"{where}.query_item is required and must be a map")
        if not isinstance(payload.get("score_items"), list):
            raise BadBody(f"{where}.score_items is required and must be an array")
    elif not isinstance(payload.get("item"), dict):
        raise BadBody(f"{where}.item is required and must be a map")
    options = payload.get("options")
    if options is not None and not isinstance(options, dict):
        raise BadBody(f"{where}.options must be a map or nil")


def _with_lora(payload: dict[str, Any], lora_key: str) -> dict[str, Any]:
    """The batch's LoRA in `options["lora"]`, unless the item names one (then the item's wins)."""
    options = dict(payload.get("options") or {})
    existing = options.get("lora")
    if existing in (None, ""):
        options["lora"] = lora_key
    elif existing != lora_key:
        log.warning(
            "item LoRA differs from the batch lora_key; the item's wins",
            extra={"work_item_id": payload.get("work_item_id"), "item_lora": existing, "lora_key": lora_key},
        )
    return {**payload, "options": options}


def batched_f16_output(buffer: bytes, slices: Sequence[F16Multivector]) -> dict[str, Any]:
    """A BatchedF16MultivectorOutput map (wire-protocol §4.7), checked so a sidecar never gets a
    buffer it must refuse: even length, every slice even, inside the buffer, of
    num_tokens x token_dims x 2 bytes, one slice per work item."""
    if len(buffer) % 2:
        raise ValueError("batched f16 multivector buffer has an odd length")
    seen: set[str] = set()
    items = []
    for s in slices:
        end = s.byte_offset + s.byte_len
        if s.byte_offset % 2 or s.byte_offset < 0 or end > len(buffer) or min(s.num_tokens, s.token_dims) < 0:
            raise ValueError(f"batched f16 multivector slice of {s.work_item_id!r} is outside the buffer or odd")
        if s.work_item_id in seen:
            raise ValueError(f"batched f16 multivector slice of {s.work_item_id!r} given twice")
        seen.add(s.work_item_id)
        items.append(
            {
                "work_item_id": s.work_item_id,
                "byte_offset": s.byte_offset,
                "byte_len": s.byte_len,
                "num_tokens": s.num_tokens,
                "token_dims": s.token_dims,
            }
        )
    return {"values_f16": bytes(buffer), "items": items}


class BackendAlreadyRunning(FileExistsError):
    """Another server accepts connections on the socket path: starting would steal its sidecar."""


def _clear_stale_path(path: str) -> None:
    """Remove a regular file or a dead socket left at `path`; refuse a live socket or anything else."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode):
        log.warning("a regular file was at the socket path; removed", extra={"socket": path})
        os.unlink(path)
        return
    if not stat.S_ISSOCK(mode):
        raise FileExistsError(f"{path} exists and is neither a socket nor a regular file")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError:  # refused, or gone meanwhile: nobody listens there
        log.info("stale socket at the socket path; replaced", extra={"socket": path})
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    finally:
        probe.close()
    raise BackendAlreadyRunning(f"another backend is serving on {path}")


def _reject(identity: _Identity, message: str, code: str) -> dict[str, Any]:
    work_item_id, request_id, item_index = identity
    return item_outcome(work_item_id, request_id, item_index, "publish_error_and_ack", error=message, error_code=code)


async def serve_until_signalled(server: BackendServer) -> None:
    """Start `server`, serve until SIGTERM or SIGINT, then close it (in-flight batches finish first, bounded)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)
        await server.close()


__all__ = [
    "HEARTBEAT_STALE_S",
    "HEAVY_METHODS",
    "BackendAlreadyRunning",
    "BackendServer",
    "BadBody",
    "encode_response",
    "serve_until_signalled",
]
