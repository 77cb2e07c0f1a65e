# SPDX-License-Identifier: Apache-2.0
"""`sie_sidecar.local.Client`: the asyncio client of the local-ingest socket (sidecar-behaviour §11).

One connection, one reader task that routes responses by envelope id, and a window of 80 data ops
(the server's per-connection budget), so a caller may start any number of requests at once and
none is refused for capacity. Generation streams are async iterators of chunk bytes whose `seq` is
checked to be contiguous from 0 and whose final outcome must count the chunks received.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Self

import msgpack

from ..errors import GenerationStreamError, LocalFrameError, LocalIngestError
from . import frames
from .digest import payload_digest
from .limits import DATA_OPS

#: What the client binds a request to when the caller gives no dispatch context (TV-L3).
DEFAULT_DISPATCH_CONTEXT = bytes(msgpack.packb({"source": "internal"}, use_bin_type=True))


def _pack(value: Any) -> bytes:
    return bytes(msgpack.packb(value, use_bin_type=True))


def work_items(
    request_id: str,
    endpoint: str,
    model: str,
    fields: Sequence[dict[str, Any]],
    *,
    pool_name: str = "default",
    machine_profile: str = "default",
    engine: str = "",
    bundle_config_hash: str = "",
    admission_pool: str = "",
    timestamp: float | None = None,
) -> list[dict[str, Any]]:
    """WorkItem maps for one request, slot `i` with `fields[i]` merged in (e.g. `{"item": {...}}` or
    `{"generate": {...}}`); ids, counts and the envelope fields filled as §11 requires. `timestamp`:
    the gateway-side enqueue time (now when not given)."""
    now = time.time() if timestamp is None else timestamp
    total = len(fields)
    out = []
    for index, extra in enumerate(fields):
        item: dict[str, Any] = {
            "work_item_id": f"{request_id}.{index}",
            "request_id": request_id,
            "item_index": index,
            "total_items": total,
            "operation": endpoint,
            "model_id": model,
            "pool_name": pool_name,
            "machine_profile": machine_profile,
            "reply_subject": "",
            "timestamp": now,
        }
        if engine:
            item["engine"] = engine
        if bundle_config_hash:
            item["bundle_config_hash"] = bundle_config_hash
        if admission_pool:
            item["admission_pool"] = admission_pool
        item.update(extra)
        out.append(item)
    return out


def request_body(
    *,
    lane: str,
    endpoint: str,
    model: str,
    request_id: str,
    items: bytes,
    engine: str = "",
    admission_pool: str = "",
    bundle_config_hash: str = "",
    params: bytes = b"",
    timeout_ms: int = 0,
    dispatch_context: bytes | None = None,
    digest: bytes | None = None,
) -> dict[str, Any]:
    """The body map in the order of TV-L3, the digest computed unless the caller brings its own
    (then it is forwarded unchanged with its dispatch context)."""
    context = DEFAULT_DISPATCH_CONTEXT if dispatch_context is None else dispatch_context
    if digest is None:
        digest = payload_digest(
            dispatch_context=context,
            lane=lane,
            endpoint=endpoint,
            model=model,
            engine=engine,
            admission_pool=admission_pool,
            bundle_config_hash=bundle_config_hash,
            request_id=request_id,
            params=params,
            items=items,
            timeout_ms=timeout_ms,
        )
    elif len(digest) != 32:
        raise ValueError("payload_digest must be exactly 32 bytes")
    return {
        "lane": lane,
        "endpoint": endpoint,
        "model": model,
        "engine": engine,
        "admission_pool": admission_pool,
        "bundle_config_hash": bundle_config_hash,
        "request_id": request_id,
        "params": params,
        "items": items,
        "dispatch_context": context,
        "payload_digest": digest,
        "timeout_ms": timeout_ms,
    }


class Client:
    """A connection to the local-ingest socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, window: int = DATA_OPS) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[frames.Response]] = {}
        self._streams: dict[int, asyncio.Queue[frames.Response | BaseException]] = {}
        self._window = asyncio.Semaphore(window)
        self._failure: BaseException | None = None
        self._write_lock = asyncio.Lock()
        self._task = asyncio.create_task(self._read(), name="local-client-reader")

    @classmethod
    async def connect(cls, path: str, *, window: int = DATA_OPS) -> Self:
        reader, writer = await asyncio.open_unix_connection(path, limit=2**16)
        return cls(reader, writer, window=window)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    # -- plumbing ------------------------------------------------------------------------------

    async def _read(self) -> None:
        failure: BaseException
        try:
            while True:
                payload = await frames.read_frame(self._reader)
                if payload is None:
                    failure = ConnectionResetError("the local-ingest socket closed the connection")
                    break
                response = frames.decode_response(payload)
                call = self._calls.pop(response.id, None)
                if call is not None:
                    if not call.done():
                        call.set_result(response)
                    continue
                stream = self._streams.get(response.id)
                if stream is not None:
                    stream.put_nowait(response)
        except (LocalFrameError, ConnectionError, OSError) as exc:
            failure = exc
        except asyncio.CancelledError:
            failure = ConnectionResetError("the local-ingest client was closed")
            self._fail_all(failure)
            raise
        self._fail_all(failure)

    def _fail_all(self, failure: BaseException) -> None:
        self._failure = failure
        for call in self._calls.values():
            if not call.done():
                call.set_exception(failure)
        self._calls.clear()
        for stream in self._streams.values():
            stream.put_nowait(failure)

    async def _send(self, op_id: int, op: str, body: dict[str, Any]) -> None:
        if self._failure is not None:
            raise self._failure
        frame = frames.encode_request(op_id, op, body)
        async with self._write_lock:
            self._writer.write(frame)
            await self._writer.drain()

    async def call(self, op: str, body: dict[str, Any]) -> dict[Any, Any]:
        """One request and its response body; `LocalIngestError` for `ok=false`."""
        op_id = next(self._ids)
        future: asyncio.Future[frames.Response] = asyncio.get_running_loop().create_future()
        self._calls[op_id] = future
        try:
            await self._send(op_id, op, body)
            response = await future
        finally:
            self._calls.pop(op_id, None)
        if not response.ok:
            raise LocalIngestError(response.error or "")
        return response.body

    # -- ops --------------------------------------------------------------------------------------

    async def ping(self) -> None:
        await self.call("ping", {})

    async def publish_work(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """A `publish_work` body (`request_body`) and its WorkResults in slot order."""
        async with self._window:
            reply = await self.call("publish_work", body)
        results = reply.get("results")
        if not isinstance(results, bytes):
            raise LocalIngestError("ValueError: publish_work answered without results")
        decoded = msgpack.unpackb(results, raw=False, strict_map_key=False)
        if not isinstance(decoded, list):
            raise LocalIngestError("ValueError: publish_work results are not an array")
        return decoded

    async def cancel(self, request_id: str) -> None:
        await self.call("cancel", {"request_id": request_id})

    async def generate(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """A `publish_generate_stream` body; yields each chunk's bytes in `seq` order. Raises
        `GenerationStreamError` (`.code`, `.message`) when the stream ends in an error."""
        async with self._window:
            op_id = next(self._ids)
            queue: asyncio.Queue[frames.Response | BaseException] = asyncio.Queue()
            self._streams[op_id] = queue
            try:
                await self._send(op_id, "publish_generate_stream", body)
                expected = 0
                while True:
                    item = await queue.get()
                    if isinstance(item, BaseException):
                        raise item
                    if not item.ok:
                        raise GenerationStreamError(item.error or "")
                    if item.body.get("final") is True:
                        outcome = item.body.get("outcome")
                        chunks = outcome.get("chunks") if isinstance(outcome, dict) else None
                        if chunks != expected:
                            raise LocalFrameError(f"final outcome counts {chunks!r} chunks, received {expected}")
                        return
                    seq = item.body.get("seq")
                    chunk = item.body.get("chunk")
                    if seq != expected:
                        raise LocalFrameError(f"chunk seq {seq!r}, not expected {expected}")
                    if not isinstance(chunk, bytes):
                        raise LocalFrameError("chunk is not binary")
                    expected += 1
                    yield chunk
            finally:
                self._streams.pop(op_id, None)


__all__ = ["DEFAULT_DISPATCH_CONTEXT", "Client", "request_body", "work_items"]
