# SPDX-License-Identifier: Apache-2.0
"""A hostile backend over the real socket (issue 15): a proxy in front of the reference backend
passes the handshake through and answers RunBatch itself, badly. Whatever it sends, the sidecar's
pipeline stays up, allocates nothing for what a frame only declares, NAKs every item of the batch
exactly once with the base delay, and serves the next batch once the backend behaves again.

Modes: a declared length of 4 GiB (then silence), garbage bytes in a well-formed frame, a frame that
stops mid-way (then the connection closes), an answer for a request id nobody asked for, 1,000
chunk frames of transfers nobody started, and a peer that never answers (the request timeout)."""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from .memory import memory_pipeline
from .test_sequencing import _item, _msg

NAK_DELAY_MS = 700
MODES = ["declared_4gib", "garbage", "truncated", "unknown_request_id", "chunk_flood", "silent"]


def _frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    header = await reader.readexactly(4)
    return await reader.readexactly(int.from_bytes(header, "big"))


class HostileProxy:
    """Between the sidecar and the backend: every request is forwarded except RunBatch (or the
    method a subclass names in `intercepted`) while `mode` is set; then the proxy answers it as
    `mode` says, and the backend never sees it."""

    intercepted = "RunBatch"

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.mode: str | None = None
        self.hostile_answers = 0
        self._writers: set[asyncio.StreamWriter] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        up_reader, up_writer = await asyncio.open_unix_connection(self.upstream)
        back = asyncio.create_task(self._pump(up_reader, writer))
        try:
            while True:
                body = await _read_frame(reader)
                request = msgpack.unpackb(body, raw=False)
                if request.get("method") == self.intercepted and self.mode is not None:
                    self.hostile_answers += 1
                    if not await self._answer(self.mode, request, writer):
                        return  # the hostile answer ends this connection
                    continue
                up_writer.write(_frame(body))
                await up_writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            back.cancel()
            up_writer.close()
            writer.close()
            self._writers.discard(writer)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                writer.write(_frame(await _read_frame(reader)))
                await writer.drain()

    async def _answer(self, mode: str, request: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        """Write the hostile answer; False when the connection is to be closed after it."""
        if mode == "declared_4gib":
            writer.write(b"\xff\xff\xff\xff" + b"\x00" * 16)  # 4 GiB declared, 16 bytes sent
        elif mode == "garbage":
            writer.write(_frame(b"\xc1\xff\x00not msgpack at all" * 8))
        elif mode == "truncated":
            writer.write((1000).to_bytes(4, "big") + b"\x85\xa7version\x01")
            await writer.drain()
            return False
        elif mode == "unknown_request_id":
            envelope = {"version": 1, "request_id": "w-nobody", "ok": True, "body": {"outcomes": []}, "error": None}
            writer.write(_frame(msgpack.packb(envelope)))
        elif mode == "chunk_flood":
            for i in range(1000):
                chunk = {
                    "version": 1,
                    "request_id": f"w-stranger-{i}",
                    "kind": "ipc_response_chunk_v1",
                    "transfer_digest": bytes(32),
                    "chunk_index": 0,
                    "chunk_count": 4,
                    "total_bytes": 30 * 1024 * 1024,
                    "payload": bytes(64 * 1024),
                }
                writer.write(_frame(msgpack.packb(chunk, use_bin_type=True)))
                if i % 50 == 0:
                    await writer.drain()
        # "silent": nothing at all
        await writer.drain()
        return True

    def close_all(self) -> None:
        for writer in list(self._writers):
            writer.close()


@contextlib.asynccontextmanager
async def hostile_proxy(
    tmp_path: Path, kind: type[HostileProxy] = HostileProxy
) -> AsyncIterator[tuple[HostileProxy, str]]:
    """A `kind` proxy (a HostileProxy subclass answers its own way) on its own socket, in front of
    the pipeline's backend (`backend.sock`)."""
    proxy = kind(str(tmp_path / "backend.sock"))
    path = str(tmp_path / "proxy.sock")
    server = await asyncio.start_unix_server(proxy.handle, path, limit=1 << 20)
    try:
        yield proxy, path
    finally:
        proxy.close_all()
        server.close()


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("mode", MODES)
async def test_a_hostile_answer_naks_the_batch_and_the_sidecar_serves_on(tmp_path: Path, mode: str) -> None:
    async with (
        hostile_proxy(tmp_path) as (proxy, proxy_sock),
        memory_pipeline(tmp_path, ipc_socket=proxy_sock, ipc_timeout_s=1.0, nak_delay_ms=NAK_DELAY_MS) as p,
    ):
        warm = [_msg(_item(f"warm{i}")) for i in range(4)]
        p.send(warm)  # the handshake and a first batch through the proxy, untouched
        await p.until_settled(warm)
        assert all(m.final == [("ack", None)] for m in warm)

        rss_before = _max_rss_mb()
        proxy.mode = mode
        hostile = [_msg(_item(f"h{i}")) for i in range(16)]
        p.send(hostile)
        await p.until_settled(hostile, timeout=20)
        assert proxy.hostile_answers >= 1
        assert all(m.final == [("nak", NAK_DELAY_MS / 1000)] for m in hostile), [m.final for m in hostile]
        # Nothing declared was allocated: 4 GiB, or 1,000 transfers of 30 MiB, stay on the wire.
        assert _max_rss_mb() - rss_before < 64

        proxy.mode = None
        after = [_msg(_item(f"a{i}")) for i in range(8)]
        p.send(after)
        await p.until_settled(after, timeout=20)
        assert all(m.final == [("ack", None)] for m in after), [m.final for m in after]
        assert len(p.sink.replies) == len(warm) + len(after)  # no reply for a NAKed item


class BindingProxy(HostileProxy):
    """Answers each RunBatch itself with well-formed outcomes that test the binding (§4.3, wire
    §4.5): the first item's outcome is missing, an outcome for a work item nobody sent comes first,
    and the rest are answered in reverse order."""

    async def _answer(self, mode: str, request: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        items = request["body"]["items"]
        outcomes = [_outcome("ghost.0", "ghost")]
        outcomes += [_outcome(it["work_item_id"], it["request_id"]) for it in reversed(items[1:])]
        envelope = {
            "version": 1,
            "request_id": request["request_id"],
            "ok": True,
            "body": {"outcomes": outcomes},
            "error": None,
        }
        writer.write(_frame(msgpack.packb(envelope, use_bin_type=True)))
        await writer.drain()
        return True


def _outcome(work_item_id: str, request_id: str) -> dict[str, object]:
    return {
        "work_item_id": work_item_id,
        "request_id": request_id,
        "item_index": 0,
        "disposition": "publish_and_ack",
        "result_msgpack": msgpack.packb({"ok": work_item_id}),
    }


async def test_outcomes_bind_by_work_item_id_a_ghost_is_ignored_and_a_missing_one_naks(tmp_path: Path) -> None:
    """sidecar-behaviour §4.3 / wire-protocol §4.5: outcomes are bound to deliveries by work item id,
    whatever their order; an outcome for an item nobody sent is ignored; an item without one is
    NAKed with the base delay; the rest are answered and ACKed."""
    proxy = BindingProxy(str(tmp_path / "backend.sock"))
    path = str(tmp_path / "proxy.sock")
    server = await asyncio.start_unix_server(proxy.handle, path, limit=1 << 20)
    try:
        async with memory_pipeline(tmp_path, ipc_socket=path, ipc_timeout_s=1.0, nak_delay_ms=NAK_DELAY_MS) as p:
            warm = [_msg(_item("warm"))]
            p.send(warm)
            await p.until_settled(warm)
            proxy.mode = "binding"
            batch = [_msg(_item(f"b{i}")) for i in range(6)]
            p.send(batch)
            await p.until_settled(batch, timeout=20)
            finals = [m.final for m in batch]
            assert finals.count([("nak", NAK_DELAY_MS / 1000)]) == 1, finals
            assert finals.count([("ack", None)]) == 5, finals
            answered = {reply["work_item_id"] for _, reply in p.sink.replies}
            assert "ghost.0" not in answered and len(answered) == 1 + 5
    finally:
        proxy.close_all()
        server.close()
