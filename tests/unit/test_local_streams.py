# SPDX-License-Identifier: Apache-2.0
"""The local generation-stream contract (sidecar-behaviour §11): the sidecar's check of backend chunks
(`LocalStream`), and the client's check of the `{chunk, seq}` / final responses (TV-L2 shapes) over a
real Unix socket."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack
import pytest

from sie_sidecar.errors import GenerationStreamError, LocalFrameError
from sie_sidecar.local import Client, frames
from sie_sidecar.local.streams import LocalStream, StreamSettlementError


def chunk(seq: int, *, done: object = False, attempt: str = "a-1", request_id: str = "req", **extra: Any) -> bytes:
    body = {
        "kind": "chunk",
        "request_id": request_id,
        "attempt_id": attempt,
        "seq": seq,
        "text_delta": "x",
        "done": done,
    }
    body.update(extra)
    return bytes(msgpack.packb(body))


async def new_stream() -> tuple[LocalStream, list[tuple[bytes, int]]]:
    sent: list[tuple[bytes, int]] = []

    async def send(payload: bytes, seq: int) -> None:
        sent.append((payload, seq))

    return LocalStream("req", b"", send), sent


async def test_contiguous_chunks_then_the_backend_ack_complete_the_stream() -> None:
    stream, sent = await new_stream()
    assert stream.reply_subject == "_LOCAL.req"
    for seq in range(3):
        assert await stream.on_chunk(chunk(seq, done=seq == 2))
    await stream.ack()
    assert stream.ended.result() == ("complete", 3)
    assert [s for _, s in sent] == [0, 1, 2]


@pytest.mark.parametrize(
    ("payloads", "code", "match"),
    [
        ([chunk(1)], "TRANSPORT_FAILURE", "expected 0"),
        ([chunk(0), chunk(2)], "TRANSPORT_FAILURE", "expected 1"),
        ([chunk(0), chunk(1, attempt="a-2")], "TRANSPORT_FAILURE", "attempt_id changed"),
        ([chunk(0, attempt="")], "TRANSPORT_FAILURE", "1-128 bytes"),
        ([chunk(0, attempt="a" * 129)], "TRANSPORT_FAILURE", "1-128 bytes"),
        ([chunk(0, request_id="other")], "TRANSPORT_FAILURE", "another request"),
        ([chunk(0, done="yes")], "TRANSPORT_FAILURE", "done must be a bool"),
        ([chunk(0, done=True), chunk(1)], "TRANSPORT_FAILURE", "after the terminal"),
        ([b"\xc1"], "DECODE_ERROR", "not msgpack"),
        ([bytes.fromhex("82a46b696e64a56368756e6ba46b696e64a56368756e6b")], "DECODE_ERROR", "duplicate key"),
        (
            [chunk(0), msgpack.packb({"kind": "nak", "request_id": "req", "reason": "kv_budget"})],
            "TRANSPORT_FAILURE",
            "nak after output",
        ),
        ([msgpack.packb({"kind": "nak", "request_id": "req", "reason": ""})], "TRANSPORT_FAILURE", "1-64 bytes"),
        ([msgpack.packb({"kind": "nak", "request_id": "req", "reason": "r" * 65})], "TRANSPORT_FAILURE", "1-64 bytes"),
        ([msgpack.packb({"kind": "result"})], "TRANSPORT_FAILURE", "unexpected publication kind"),
    ],
)
async def test_each_chunk_rule_ends_the_stream_with_its_code(payloads: list[bytes], code: str, match: str) -> None:
    stream, _ = await new_stream()
    results = [await stream.on_chunk(p) for p in payloads]
    assert results[-1] is False and all(results[:-1])
    outcome, error = stream.ended.result()
    assert outcome == "error" and str(error).startswith(f"{code}: ") and match in str(error)


async def test_an_ack_before_the_terminal_chunk_is_a_transport_failure() -> None:
    stream, _ = await new_stream()
    await stream.on_chunk(chunk(0))
    await stream.ack()
    assert stream.ended.result() == ("error", "TRANSPORT_FAILURE: backend acknowledged before the terminal chunk")


async def test_a_nak_settlement_is_retry_later_before_output_and_a_failure_after() -> None:
    before, _ = await new_stream()
    await before.nak(1000)
    assert str(before.ended.result()[1]).startswith("RETRY_LATER: ")
    after, _ = await new_stream()
    await after.on_chunk(chunk(0))
    await after.nak(1000)
    assert str(after.ended.result()[1]).startswith("TRANSPORT_FAILURE: ")


# -- TV-G3: local generation publication validation, row by row ------------------------------------

NAK = bytes(msgpack.packb({"kind": "nak", "request_id": "req", "attempt_id": "attempt-1", "reason": "kv_budget"}))


async def test_tv_g3_two_chunks_then_exactly_one_ack() -> None:
    stream, sent = await new_stream()
    assert await stream.on_chunk(chunk(0, attempt="attempt-1"))
    assert await stream.on_chunk(chunk(1, done=True, attempt="attempt-1"))
    assert stream.chunks == 2 and not stream.finished  # next expected seq 2; waiting for one ack
    await stream.ack()
    assert stream.ended.result() == ("complete", 2)
    for late in (stream.ack, stream.in_progress, stream.nak):  # terminal chunk, ack, then another
        with pytest.raises(StreamSettlementError):
            await late()
    assert stream.ended.result() == ("complete", 2) and [s for _, s in sent] == [0, 1]


async def test_tv_g3_a_chunk_after_the_terminal_one() -> None:
    stream, _ = await new_stream()
    await stream.on_chunk(chunk(0))
    await stream.on_chunk(chunk(1, done=True))
    assert await stream.on_chunk(chunk(2)) is False
    assert stream.ended.result() == ("error", "TRANSPORT_FAILURE: chunk after the terminal chunk")


@pytest.mark.parametrize(
    ("first", "match"),
    [
        (chunk(0, request_id="other"), "another request"),
        (chunk(1), "expected 0"),
        (
            bytes.fromhex("83a46b696e64a56368756e6baa726571756573745f6964a3726571aa726571756573745f6964a3726571"),
            "duplicate",
        ),
    ],
)
async def test_tv_g3_a_first_chunk_breaking_a_rule_is_an_error(first: bytes, match: str) -> None:
    stream, sent = await new_stream()
    assert await stream.on_chunk(first) is False
    outcome, error = stream.ended.result()
    assert outcome == "error" and match in str(error) and sent == []


async def test_tv_g3_a_nak_before_any_chunk_ends_as_retry_later_after_one_ack() -> None:
    stream, sent = await new_stream()
    assert await stream.on_chunk(NAK) is True and not stream.finished  # accepted as a retry
    await stream.ack()
    assert stream.ended.result() == ("error", "RETRY_LATER: backend asked to retry later (kv_budget)")
    for late in (stream.ack, stream.in_progress, stream.nak):  # a second ack, progress or NAK
        with pytest.raises(StreamSettlementError):
            await late()
    assert sent == []


async def test_tv_g3_a_nak_after_a_chunk_is_an_error() -> None:
    stream, _ = await new_stream()
    await stream.on_chunk(chunk(0))
    assert await stream.on_chunk(NAK) is False
    assert stream.ended.result() == ("error", "TRANSPORT_FAILURE: nak after output")


async def test_tv_g3_a_nak_then_a_transport_nak_or_a_chunk_is_an_error() -> None:
    stream, _ = await new_stream()
    await stream.on_chunk(NAK)
    await stream.nak()
    assert str(stream.ended.result()[1]).startswith("TRANSPORT_FAILURE: nak settlement after a nak publication")
    again, _ = await new_stream()
    await again.on_chunk(NAK)
    assert await again.on_chunk(chunk(0)) is False
    assert again.ended.result() == ("error", "TRANSPORT_FAILURE: publication after a nak")


async def test_the_first_end_wins() -> None:
    stream, _ = await new_stream()
    await stream.refuse("MODEL_LOADING", "loading")
    await stream.ack()
    await stream.nak()
    assert stream.ended.result() == ("error", "MODEL_LOADING: loading")
    assert await stream.on_chunk(chunk(0)) is False


# -- the client's side, over a real socket ----------------------------------------------------------


async def serve_frames(tmp_path: Path, responses: list[bytes]) -> tuple[str, asyncio.base_events.Server]:
    """A socket that answers the first request with `responses` (frames), whatever it asked."""
    path = str(tmp_path / "fixture.sock")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await frames.read_frame(reader)
        for frame in responses:
            writer.write(frame)
        await writer.drain()
        await reader.read()  # until the client closes
        writer.close()

    server = await asyncio.start_unix_server(handle, path=path)
    return path, server


async def collect(path: str) -> list[bytes]:
    async with await Client.connect(path) as client:
        return [c async for c in client.generate({})]


async def test_tv_l2_chunk_and_final_shapes_give_the_stream(tmp_path: Path) -> None:
    responses = [
        frames.encode_response(1, True, None, {"chunk": b"a", "seq": 0}),
        frames.encode_response(1, True, None, {"chunk": b"b", "seq": 1}),
        frames.encode_response(1, True, None, {"final": True, "outcome": {"status": "complete", "chunks": 2}}),
    ]
    path, server = await serve_frames(tmp_path, responses)
    async with server:
        assert await collect(path) == [b"a", b"b"]


async def test_a_first_chunk_with_seq_1_is_rejected(tmp_path: Path) -> None:
    path, server = await serve_frames(tmp_path, [frames.encode_response(1, True, None, {"chunk": b"a", "seq": 1})])
    async with server:
        with pytest.raises(LocalFrameError, match="not expected 0"):
            await collect(path)


async def test_a_final_that_miscounts_is_rejected(tmp_path: Path) -> None:
    responses = [
        frames.encode_response(1, True, None, {"chunk": b"a", "seq": 0}),
        frames.encode_response(1, True, None, {"final": True, "outcome": {"status": "complete", "chunks": 2}}),
    ]
    path, server = await serve_frames(tmp_path, responses)
    async with server:
        with pytest.raises(LocalFrameError, match="counts 2 chunks, received 1"):
            await collect(path)


async def test_an_error_response_is_a_typed_stream_error(tmp_path: Path) -> None:
    path, server = await serve_frames(tmp_path, [frames.encode_response(1, False, "MODEL_LOADING: wait", {})])
    async with server:
        with pytest.raises(GenerationStreamError) as caught:
            await collect(path)
    assert (caught.value.code, caught.value.message) == ("MODEL_LOADING", "wait")


@pytest.mark.parametrize(("data", "match"), [("0100", "header is truncated"), ("01000000c1", "invalid MessagePack")])
async def test_tv_l4_framing_errors_reach_the_caller(tmp_path: Path, data: str, match: str) -> None:
    path = str(tmp_path / "bad.sock")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await frames.read_frame(reader)
        writer.write(bytes.fromhex(data))
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(handle, path=path)
    async with server, await Client.connect(path) as client:
        with pytest.raises(LocalFrameError, match=match):
            await client.ping()
