# SPDX-License-Identifier: Apache-2.0
"""Local ingest (sidecar-behaviour §11) end to end: the real sidecar in `SIE_SIDECAR_INGEST=local`
mode, the real reference backend on a real Unix socket, the package's client (or raw frames where a
test must misbehave). The socket's permissions, every op, the item rules, the in-process retry, the
timeout, generation streams and every per-connection budget exhausted."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket as socketlib
import stat
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from sie_sidecar.backend.generation import TokenStreamer
from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.errors import GenerationStreamError, LocalIngestError
from sie_sidecar.local import Client, frames, work_items
from sie_sidecar.local.client import request_body
from sie_sidecar.local.limits import DATA_OPS, REQUEST_BYTES, STREAMS

from .local_stack import (
    LANE,
    MODEL,
    POOL,
    PROFILE,
    LocalStack,
    encode_body,
    generate_body,
    new_request_id,
    running_local,
)

pytestmark = pytest.mark.timeout(90)


def streaming(**streamer: Any) -> NullAdapter:
    return NullAdapter(dim=8, preloaded_models=[MODEL], generator=TokenStreamer(**streamer))


async def ready(stack: LocalStack) -> Client:
    """A connected client once the sidecar serves (the first heartbeat opened the gate)."""
    client = await stack.client()
    await client.ping()
    await stack.wait_for(lambda: stack.backend.method_calls["Ping"] > 0)
    return client


async def gate_open(stack: LocalStack) -> None:
    """Wait until the sidecar serves, without keeping a connection."""
    client = await ready(stack)
    await client.close()


class Raw:
    """A client that writes whatever frames a test needs and reads responses by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, path: str) -> Raw:
        return cls(*await asyncio.open_unix_connection(path, limit=2**16))

    async def send(self, *payloads: bytes) -> None:
        self.writer.write(b"".join(payloads))
        await self.writer.drain()

    async def response(self, timeout: float = 10.0) -> frames.Response:
        payload = await asyncio.wait_for(frames.read_frame(self.reader), timeout)
        assert payload is not None, "connection closed"
        return frames.decode_response(payload)

    async def closed(self, timeout: float = 10.0) -> bool:
        """Whether the sidecar closes the connection (EOF) within `timeout`, responses skipped."""
        try:
            async with asyncio.timeout(timeout):
                while await self.reader.read(65536):
                    pass
        except TimeoutError:
            return False
        except ConnectionError:
            return True
        return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


# -- the socket ----------------------------------------------------------------------------------


async def test_the_socket_is_owner_only_and_a_stale_file_is_replaced(tmp_path: Path) -> None:
    stale_dir = tmp_path / "ingest"
    stale_dir.mkdir(mode=0o755)
    stale = socketlib.socket(socketlib.AF_UNIX)
    stale.bind(str(stale_dir / "local.sock"))  # a socket file left by a crashed sidecar
    stale.close()
    async with running_local(tmp_path) as stack:
        mode = os.stat(stack.socket).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        async with await ready(stack) as client:
            await client.ping()
    assert not os.path.exists(stack.socket)  # removed at shutdown


async def test_a_new_parent_directory_is_created_0700(tmp_path: Path) -> None:
    async with running_local(tmp_path) as stack:
        assert stat.S_IMODE(os.stat(Path(stack.socket).parent).st_mode) == 0o700


# -- ops -----------------------------------------------------------------------------------------


async def test_ping_and_an_unknown_op(tmp_path: Path) -> None:
    async with running_local(tmp_path) as stack, await ready(stack) as client:
        with pytest.raises(LocalIngestError) as caught:
            await client.call("bogus", {})
        assert caught.value.error == 'ValueError: unknown op: "bogus"'
        await client.ping()  # the connection stays usable


async def test_publish_work_answers_every_slot_in_order(tmp_path: Path) -> None:
    async with running_local(tmp_path) as stack, await ready(stack) as client:
        body = encode_body(["a", "b", "c", "d"])
        results = await client.publish_work(body)
        assert [r["item_index"] for r in results] == [0, 1, 2, 3]
        assert all(r["success"] and r["worker_direct"] for r in results)
        assert all(r["work_item_id"] == f"{body['request_id']}.{i}" for i, r in enumerate(results))


async def test_a_thousand_concurrent_requests_are_each_answered_in_slot_order(tmp_path: Path) -> None:
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_time_a_ms=2.0)
    async with running_local(tmp_path, adapter=adapter) as stack:
        clients = [await ready(stack) for _ in range(4)]
        bodies = [encode_body([f"t{i}-{k}" for k in range(1 + i % 5)]) for i in range(1000)]
        answers = await asyncio.gather(*(clients[i % 4].publish_work(b) for i, b in enumerate(bodies)))
        for body, results in zip(bodies, answers, strict=True):
            rid = body["request_id"]
            assert [r["work_item_id"] for r in results] == [f"{rid}.{k}" for k in range(len(results))]
            assert all(r["success"] for r in results)
        assert sum(len(a) for a in answers) == sum(1 + i % 5 for i in range(1000))
        for client in clients:
            await client.close()


async def test_binding_and_item_rule_failures_are_typed_errors(tmp_path: Path) -> None:
    async with running_local(tmp_path) as stack, await ready(stack) as client:
        body = encode_body(["a"])
        body["payload_digest"] = b"\0" * 32
        with pytest.raises(LocalIngestError, match=r"^InvalidTransportBinding: payload_digest does not match"):
            await client.publish_work(body)
        rid = new_request_id()
        items = work_items(rid, "encode", MODEL, [{"item": {"text": "x"}}], pool_name=POOL, machine_profile=PROFILE)
        items[0]["total_items"] = 2
        bad = request_body(lane=LANE, endpoint="encode", model=MODEL, request_id=rid, items=msgpack.packb(items))
        with pytest.raises(LocalIngestError, match=r"^ValueError: item 0: total_items must be 1"):
            await client.publish_work(bad)
        with pytest.raises(LocalIngestError, match=r"^ValueError: timeout_ms"):
            await client.publish_work(encode_body(["a"], timeout_ms=300_001))
        assert stack.backend.method_calls["EnsureModelReady"] == 0  # nothing reached the backend


async def test_generate_on_publish_work_and_a_foreign_pool_are_answered_per_slot(tmp_path: Path) -> None:
    async with running_local(tmp_path) as stack, await ready(stack) as client:
        (gen,) = await client.publish_work(generate_body())
        assert (gen["success"], gen["error_code"]) == (False, "bad_operation")
        rid = new_request_id()
        fields = [
            {"item": {"text": "ok"}, "admission_pool": "default"},
            {"item": {"text": "x"}, "admission_pool": "gpu"},
        ]
        items = work_items(rid, "encode", MODEL, fields, pool_name=POOL, machine_profile=PROFILE)
        body = request_body(
            lane=LANE,
            endpoint="encode",
            model=MODEL,
            request_id=rid,
            items=msgpack.packb(items),
            admission_pool="default",
        )
        ok, rejected = await client.publish_work(body)
        assert ok["success"] is True
        assert (rejected["success"], rejected["error_code"]) == (False, "pool_admission_rejected")


async def test_a_nak_is_retried_three_times_in_process_then_typed(tmp_path: Path) -> None:
    adapter = NullAdapter(dim=8, retry_later_models=[MODEL])
    async with running_local(tmp_path, adapter=adapter) as stack, await ready(stack) as client:
        started = time.monotonic()
        (result,) = await client.publish_work(encode_body(["a"]))
        assert (result["success"], result["error_code"]) == (False, "inference_error")
        assert "retried 3 times" in result["error"]
        assert stack.backend.method_calls["EnsureModelReady"] == 4  # the first try and 3 retries
        assert time.monotonic() - started >= 3 * 0.2  # each after the NAK delay (0.2 s here, ≤ 5 s)


async def test_publish_work_times_out_with_the_lane_in_the_message(tmp_path: Path) -> None:
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_delay_s=3.0)
    async with running_local(tmp_path, adapter=adapter) as stack, await ready(stack) as client:
        with pytest.raises(LocalIngestError) as caught:
            await client.publish_work(encode_body(["a"], timeout_ms=300))
        assert caught.value.error == f"TimeoutError: publish_work timed out after 300ms (lane '{LANE}')"
        results = await client.publish_work(encode_body(["b"]))  # the connection goes on
        assert results[0]["success"]


async def test_shutdown_answers_what_is_still_in_flight_cancelled(tmp_path: Path) -> None:
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_delay_s=30.0)
    async with running_local(tmp_path, adapter=adapter) as stack:
        client = await ready(stack)
        pending = asyncio.ensure_future(client.publish_work(encode_body(["slow"])))
        await stack.wait_for(lambda: stack.adapter.batches > 0)
        stack.stop.set()
        with pytest.raises(LocalIngestError, match=r"^cancelled$"):
            await asyncio.wait_for(pending, 30)
        await client.close()


# -- generation ----------------------------------------------------------------------------------


async def test_a_generation_streams_over_the_socket(tmp_path: Path) -> None:
    async with running_local(tmp_path, adapter=streaming()) as stack, await ready(stack) as client:
        chunks = [msgpack.unpackb(c) async for c in client.generate(generate_body(max_new_tokens=4))]
        assert [c["seq"] for c in chunks] == [0, 1, 2, 3, 4]
        assert chunks[-1]["done"] is True and chunks[-1]["finish_reason"] == "length"
        assert len({c["attempt_id"] for c in chunks}) == 1


async def test_cancel_ends_a_stream_with_a_cancelled_chunk(tmp_path: Path) -> None:
    async with running_local(tmp_path, adapter=streaming(token_delay_s=0.05)) as stack, await ready(stack) as client:
        body = generate_body(max_new_tokens=200)
        chunks: list[dict[str, Any]] = []
        async for raw in client.generate(body):
            chunks.append(msgpack.unpackb(raw))
            if len(chunks) == 3:
                await client.cancel(body["request_id"])
        assert chunks[-1]["finish_reason"] == "cancelled" and len(chunks) < 50
        assert stack.backend.method_calls["SignalGenerateCancel"] == 1
        await client.cancel("not-streaming")  # not active here: answered {} and nothing signalled
        assert stack.backend.method_calls["SignalGenerateCancel"] == 1


async def test_client_eof_cancels_its_streams_at_the_backend(tmp_path: Path) -> None:
    async with running_local(tmp_path, adapter=streaming(token_delay_s=0.05)) as stack:
        client = await ready(stack)
        stream = client.generate(generate_body(max_new_tokens=500)).__aiter__()
        await stream.__anext__()
        await client.close()
        await stack.wait_for(lambda: stack.backend.method_calls["SignalGenerateCancel"] >= 1)
        assert stack.adapter.generator is not None
        await stack.wait_for(lambda: not stack.backend._generations)  # the backend stream ended


@pytest.mark.parametrize(
    ("adapter", "code"),
    [
        (NullAdapter(dim=8, load_delay_s=30.0, generator=TokenStreamer()), "MODEL_LOADING"),
        (NullAdapter(dim=8, failed_models=[MODEL], generator=TokenStreamer()), "MODEL_LOAD_FAILED"),
        (NullAdapter(dim=8, retry_later_models=[MODEL], generator=TokenStreamer()), "RETRY_LATER"),
        (streaming(kv_budget_naks=1), "RETRY_LATER"),
    ],
)
async def test_dispatch_errors_end_the_stream_with_their_code(tmp_path: Path, adapter: NullAdapter, code: str) -> None:
    async with running_local(tmp_path, adapter=adapter) as stack, await ready(stack) as client:
        with pytest.raises(GenerationStreamError) as caught:
            async for _ in client.generate(generate_body()):
                pass
        assert caught.value.code == code


async def test_a_stream_that_fails_mid_way_is_a_transport_failure(tmp_path: Path) -> None:
    async with running_local(tmp_path, adapter=streaming(fail_after_tokens=2)) as stack, await ready(stack) as client:
        received = []
        with pytest.raises(GenerationStreamError) as caught:
            async for raw in client.generate(generate_body(max_new_tokens=10)):
                received.append(raw)
        assert len(received) == 2 and caught.value.code == "TRANSPORT_FAILURE"


async def test_generation_request_ids_are_claimed_per_connection_and_process_wide(tmp_path: Path) -> None:
    async with running_local(tmp_path, adapter=streaming(token_delay_s=0.05)) as stack:
        first, second = await ready(stack), await ready(stack)
        body = generate_body(max_new_tokens=100)
        stream = first.generate(body).__aiter__()
        await stream.__anext__()
        for client, code in ((first, "DUPLICATE_REQUEST"), (second, "INVALID_TRANSPORT_BINDING")):
            with pytest.raises(GenerationStreamError) as caught:
                async for _ in client.generate(body):
                    pass
            assert caught.value.code == code
        await first.cancel(body["request_id"])
        async for _ in stream:
            pass
        await first.close()
        await second.close()


async def test_a_generation_timeout_stops_the_stream_and_cancels_it(tmp_path: Path) -> None:
    async with running_local(tmp_path, adapter=streaming(token_delay_s=0.05)) as stack, await ready(stack) as client:
        with pytest.raises(GenerationStreamError) as caught:
            async for _ in client.generate(generate_body(max_new_tokens=500, timeout_ms=300)):
                pass
        assert caught.value.code == "TIMEOUT"
        assert stack.backend.method_calls["SignalGenerateCancel"] == 1


# -- budgets -------------------------------------------------------------------------------------


def _request(op_id: int, op: str, body: dict[str, Any]) -> bytes:
    return frames.encode_request(op_id, op, body)


async def test_the_81st_data_op_is_refused_for_capacity(tmp_path: Path) -> None:
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_delay_s=1.0)
    async with running_local(tmp_path, adapter=adapter) as stack:
        await gate_open(stack)
        raw = await Raw.connect(stack.socket)
        await raw.send(*(_request(i + 1, "publish_work", encode_body([f"t{i}"])) for i in range(DATA_OPS + 1)))
        responses = [await raw.response() for _ in range(DATA_OPS + 1)]
        refused = [r for r in responses if not r.ok]
        assert [r.id for r in refused] == [DATA_OPS + 1]
        assert refused[0].error == f"CapacityExhausted: {DATA_OPS} data operations in flight on this connection"
        assert all(r.ok for r in responses if r.id != DATA_OPS + 1)
        await raw.close()


async def test_a_second_cancel_in_flight_is_refused(tmp_path: Path) -> None:
    async with running_local(tmp_path) as stack:
        raw = await Raw.connect(stack.socket)
        await raw.send(_request(1, "cancel", {"request_id": "a"}), _request(2, "cancel", {"request_id": "b"}))
        by_id = {r.id: r for r in [await raw.response(), await raw.response()]}
        assert by_id[1].ok and by_id[2].error == "CapacityExhausted: a cancel is already in flight on this connection"
        await raw.close()


async def test_the_65th_generation_stream_is_refused(tmp_path: Path) -> None:
    async with running_local(tmp_path, adapter=streaming(token_delay_s=0.2)) as stack, await ready(stack) as client:
        bodies = [generate_body(max_new_tokens=1000) for _ in range(STREAMS + 1)]
        streams = [client.generate(b).__aiter__() for b in bodies[:STREAMS]]
        await asyncio.gather(*(s.__anext__() for s in streams))  # all 64 are streaming
        with pytest.raises(GenerationStreamError) as caught:
            async for _ in client.generate(bodies[STREAMS]):
                pass
        assert caught.value.code == "CAPACITY_EXHAUSTED"
        for body in bodies[:STREAMS]:
            await client.cancel(body["request_id"])
        for stream in streams:
            async for _ in stream:
                pass


def _frame_of_exactly(size: int) -> bytes:
    """A publish_work frame whose payload is `size` bytes (padding in a non-media binary field)."""

    def build(pad: int) -> bytes:
        rid = "big-1"
        fields = [{"item": {"text": "x", "blob": b"\0" * pad}}]
        items = work_items(rid, "encode", MODEL, fields, pool_name=POOL, machine_profile=PROFILE)
        packed = msgpack.packb(items, use_bin_type=True)
        body = request_body(lane=LANE, endpoint="encode", model=MODEL, request_id=rid, items=packed)
        return _request(1, "publish_work", body)

    probe = size - 4096
    overhead = len(build(probe)) - 4 - probe
    frame = build(size - overhead)
    assert len(frame) - 4 == size
    return frame


async def test_retained_request_bytes_leave_only_the_control_reserve(tmp_path: Path) -> None:
    """64 MiB of request bytes in flight: a data op is refused from the reserve, a cancel still passes."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_delay_s=2.0)
    async with running_local(tmp_path, adapter=adapter) as stack:
        await gate_open(stack)
        raw = await Raw.connect(stack.socket)
        big = _frame_of_exactly(REQUEST_BYTES)
        small = _request(2, "publish_work", encode_body(["small"]))
        assert len(small) - 4 <= 1024
        await raw.send(big, small, _request(3, "cancel", {"request_id": "x"}))
        second, third = await raw.response(), await raw.response()
        assert (second.id, second.error) == (
            2,
            f"CapacityExhausted: {REQUEST_BYTES} retained request bytes in use on this connection",
        )
        assert (third.id, third.ok) == (3, True)
        first = await raw.response(timeout=30)
        assert first.id == 1 and first.ok  # the big request itself is served
        await raw.close()


async def test_a_frame_that_declares_64_mib_and_stalls_does_not_block_others(tmp_path: Path) -> None:
    async with running_local(tmp_path) as stack:
        await gate_open(stack)
        stalled = await Raw.connect(stack.socket)
        await stalled.send(frames.MAX_FRAME.to_bytes(4, "little") + b"\x83")  # and never the rest
        async with await stack.client() as other:
            for _ in range(5):
                assert (await other.publish_work(encode_body(["still served"])))[0]["success"]
        await stalled.close()


@pytest.mark.parametrize(
    "payload",
    [
        (frames.MAX_FRAME + 1).to_bytes(4, "little"),  # over the frame limit, from the header alone
        (1).to_bytes(4, "little") + b"\xc1",  # not msgpack
        frames.frame(msgpack.packb([1, 2])),  # not an envelope
    ],
)
async def test_bad_frames_close_the_connection(tmp_path: Path, payload: bytes) -> None:
    async with running_local(tmp_path) as stack:
        raw = await Raw.connect(stack.socket)
        await raw.send(payload)
        assert await raw.closed()
        await raw.close()
        async with await stack.client() as client:
            await client.ping()  # the listener goes on


async def test_a_duplicate_active_envelope_id_closes_the_connection(tmp_path: Path) -> None:
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_delay_s=2.0)
    async with running_local(tmp_path, adapter=adapter) as stack:
        await gate_open(stack)
        raw = await Raw.connect(stack.socket)
        await raw.send(_request(7, "publish_work", encode_body(["a"])), _request(7, "ping", {}))
        assert await raw.closed()
        await raw.close()


async def test_a_client_that_stops_reading_is_closed_and_others_are_served(tmp_path: Path) -> None:
    """The writer is bounded (80 frames / 64 MiB) with a 5 s deadline: a client that never reads is
    closed, its memory let go, while another connection keeps being answered."""
    adapter = NullAdapter(dim=4096, preloaded_models=[MODEL])  # ~16 KiB per result: the socket fills
    async with running_local(tmp_path, adapter=adapter) as stack:
        await gate_open(stack)
        raw = await Raw.connect(stack.socket)
        texts = [f"t{k}" for k in range(32)]
        await raw.send(*(_request(i + 1, "publish_work", encode_body(texts)) for i in range(DATA_OPS)))
        async with await stack.client() as other:
            started = time.monotonic()
            while time.monotonic() - started < 6.0:  # past the write deadline
                assert (await other.publish_work(encode_body(["x"])))[0]["success"]
                await asyncio.sleep(0.2)
        assert await raw.closed(timeout=15)  # reading now: what was queued, then EOF
        await raw.close()


async def test_the_load_generator_drives_the_local_socket(tmp_path: Path) -> None:
    """`sie-sidecar loadgen --local`: the same summary as over NATS, every item answered once."""
    from sie_sidecar.tools.loadgen import LoadConfig
    from sie_sidecar.tools.loadgen_local import generate_local_load

    async with running_local(tmp_path) as stack:
        await gate_open(stack)
        config = LoadConfig(
            nats_url="",
            pool=POOL,
            machine_profile=PROFILE,
            bundle="default",
            model=MODEL,
            items=2_000,
            items_per_request=7,
        )
        summary = await generate_local_load(config, stack.socket, progress=False)
        assert summary.ok and (summary.results, summary.successes, summary.duplicates) == (2_000, 2_000, 0)
        assert summary.subject == f"local:{stack.socket}"
        rated = await generate_local_load(
            LoadConfig(**{**config.__dict__, "items": 300, "rate": 1_000.0}), stack.socket, progress=False
        )
        assert rated.ok and rated.results == 300 and rated.elapsed_s >= 0.25  # paced, not a burst


async def test_local_work_is_not_judged_by_deadlines(tmp_path: Path) -> None:
    """§15.3 and §4.1 row 10 are for NATS work: with SIE_WORK_DEADLINE_ENFORCE on, a local item past
    its deadline still runs (local ingest has no broker to lease from and no redelivery)."""
    from sie_sidecar.local.client import request_body, work_items

    from .local_stack import LANE, MODEL, POOL, PROFILE

    env = {"SIE_WORK_DEADLINE_ENFORCE": "true"}
    async with running_local(tmp_path, env=env) as stack, await ready(stack) as client:
        now = time.time()
        rid = "late-local"
        fields = [{"item": {"text": "late"}, "output_types": ["dense"], "deadline": now - 50.0}]
        items = work_items(rid, "encode", MODEL, fields, pool_name=POOL, machine_profile=PROFILE, timestamp=now - 100)
        body = request_body(lane=LANE, endpoint="encode", model=MODEL, request_id=rid, items=msgpack.packb(items))
        (result,) = await client.publish_work(body)
        assert result["success"] is True
