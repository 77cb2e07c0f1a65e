# SPDX-License-Identifier: Apache-2.0
"""ProcessGenerate over the real socket (wire-protocol §5): the event order the backend library
writes, the client's stream on a fresh connection, cancellation, failures and the frame timeout."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import msgpack
import pytest

from sie_sidecar.backend.generation import TokenStreamer
from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer
from sie_sidecar.errors import IpcServerError, IpcTimeout
from sie_sidecar.ipc.client import IpcClient
from sie_sidecar.ipc.types import GenerateEvent

pytestmark = pytest.mark.timeout(30)

MODEL = "gen/model"


def item(request_id: str = "r1", **generate: Any) -> bytes:
    doc = {
        "work_item_id": f"{request_id}.0",
        "request_id": request_id,
        "reply_subject": f"_INBOX.gw.{request_id}",
        "generate": {"prompt": "hello", "max_new_tokens": 3} | generate,
    }
    return bytes(msgpack.packb(doc))


async def collect(client: IpcClient, body: bytes, **kw: Any) -> list[GenerateEvent]:
    return [event async for event in client.generate(MODEL, body, **kw)]


async def serve(sock_dir: str, streamer: TokenStreamer | None = None) -> tuple[BackendServer, IpcClient]:
    sock = os.path.join(sock_dir, "gen.sock")
    server = BackendServer(NullAdapter(8, preloaded_models=[MODEL], generator=streamer), sock, worker_id="g")
    await server.start()
    return server, IpcClient(sock, request_timeout_s=5)


async def test_the_event_order_and_a_fresh_connection_per_stream(sock_dir: str) -> None:
    server, client = await serve(sock_dir)
    try:
        events = await collect(client, item())
        assert [e.kind for e in events] == ["in_progress", "publish", "publish", "publish", "publish", "ack", "done"]
        chunks = [msgpack.unpackb(e.payload) for e in events if e.kind == "publish"]
        assert [c["seq"] for c in chunks] == [0, 1, 2, 3] and chunks[-1]["done"] is True
        assert {e.reply_subject for e in events if e.kind == "publish"} == {"_INBOX.gw.r1"}
        assert client.open_connections == 0  # the stream's own connection, closed at the end
        assert server.method_calls["ProcessGenerate"] == 1
    finally:
        await client.close()
        await server.close()


async def test_cancel_is_matched_and_ends_the_stream_cancelled(sock_dir: str) -> None:
    server, client = await serve(sock_dir, TokenStreamer(token_delay_s=0.05))
    try:
        stream = client.generate(MODEL, item("long", max_new_tokens=500))
        seen: list[GenerateEvent] = []
        async for event in stream:
            seen.append(event)
            if len(seen) == 3:
                assert await client.signal_generate_cancel("long") is True
        chunks = [msgpack.unpackb(e.payload) for e in seen if e.kind == "publish"]
        assert chunks[-1]["finish_reason"] == "cancelled" and len(chunks) < 50
        assert [e.kind for e in seen][-2:] == ["ack", "done"]
        assert await client.signal_generate_cancel("long") is False  # over: nothing to match
    finally:
        await client.close()
        await server.close()


async def test_a_failing_generation_and_a_bad_body_are_error_envelopes(sock_dir: str) -> None:
    server, client = await serve(sock_dir, TokenStreamer(fail_after_tokens=1))
    try:
        seen: list[str] = []
        with pytest.raises(IpcServerError, match="injected failure"):
            async for event in client.generate(MODEL, item()):
                seen.append(event.kind)
        assert seen == ["in_progress", "publish"]
        with pytest.raises(IpcServerError, match="bad body for ProcessGenerate"):
            await collect(client, b"\x93\x01\x02\x03")  # not a map
    finally:
        await client.close()
        await server.close()


async def test_a_silent_backend_hits_the_frame_timeout(sock_dir: str) -> None:
    server, client = await serve(sock_dir, TokenStreamer(token_delay_s=2.0))
    try:
        with pytest.raises(IpcTimeout):
            await asyncio.wait_for(collect(client, item(max_new_tokens=5), frame_timeout_s=0.3), 10)
    finally:
        await client.close()
        await server.close()


async def _scripted_stream(sock: str, frames_for: Any) -> asyncio.Server:
    """A real Unix-socket peer that answers a ProcessGenerate request with `frames_for(request_id)`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        size = int.from_bytes(await reader.readexactly(4), "big")
        request = msgpack.unpackb(await reader.readexactly(size), raw=False)
        for envelope in frames_for(request["request_id"]):
            body = msgpack.packb(envelope, use_bin_type=True)
            writer.write(len(body).to_bytes(4, "big") + body)
        await writer.drain()
        await reader.read()  # hold the stream open until the client closes it
        writer.close()

    return await asyncio.start_unix_server(handle, sock)


async def test_a_frame_for_another_request_is_a_server_error(sock_dir: str) -> None:
    """wire §2.2: in a generation stream a different request_id is a server error with the spec's
    words, never taken as this stream's event."""

    def event(request_id: str, kind: str) -> dict[str, Any]:
        body = {"kind": kind, "reply_subject": "", "payload": b"", "delay_ms": None, "error": None}
        return {"version": 1, "request_id": request_id, "ok": True, "body": body, "error": None}

    sock = os.path.join(sock_dir, "peer.sock")
    server = await _scripted_stream(sock, lambda rid: [event(rid, "in_progress"), event("w-other", "ack")])
    client = IpcClient(sock, request_timeout_s=5)
    seen: list[str] = []
    try:
        with pytest.raises(IpcServerError, match=r"^generate stream response request_id mismatch$"):
            async for ev in client.generate(MODEL, item()):
                seen.append(ev.kind)
        assert seen == ["in_progress"]  # the foreign ack was never yielded
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
