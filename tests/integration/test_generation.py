# SPDX-License-Identifier: Apache-2.0
"""Generation over NATS (sidecar-behaviour §4.4, §14; wire-protocol §5): `generate` items from the
pool and the worker-direct consumer streamed through the real sidecar from the reference backend's
token streamer, over a real nats-server; loading and failed models, the executed hash, cancellation,
a kv-budget nak, a stream that fails mid-way, and tombstones that must not drop generation."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack
import pytest

from sie_sidecar import wire
from sie_sidecar.backend.generation import TokenStreamer
from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.wire.generation import EXECUTED_HASH_KEY

from .conftest import NatsServer
from .stack import BUNDLE, MODEL, POOL, PROFILE, ROUTER, Stack, running_stack, work_item

pytestmark = pytest.mark.timeout(60)


def generate_item(prompt: str = "tell me", max_new_tokens: int = 5, **extra: Any) -> dict[str, Any]:
    item = work_item(operation="generate", text="", **extra)
    item["item"] = None
    item["output_types"] = None
    item["generate"] = {"prompt": prompt, "max_new_tokens": max_new_tokens}
    return item


def chunks_for(stack: Stack, request_id: str) -> list[dict[str, Any]]:
    return [r for r in stack.replies if r.get("kind") in ("chunk", "nak") and r.get("request_id") == request_id]


def finished(stack: Stack, request_id: str) -> bool:
    return any(c.get("done") or c.get("kind") == "nak" for c in chunks_for(stack, request_id))


def adapter(**streamer: Any) -> NullAdapter:
    return NullAdapter(dim=8, preloaded_models=[MODEL], generator=TokenStreamer(**streamer))


async def test_a_generation_streams_from_the_pool_and_the_worker_direct_consumer(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with running_stack(nats_server, tmp_path, adapter=adapter()) as stack:
        pooled = generate_item(max_new_tokens=5)
        direct = generate_item(max_new_tokens=3)
        await stack.publish(pooled)
        subject = wire.worker_direct_subject(POOL, PROFILE, BUNDLE, MODEL, stack.settings.worker_id)
        await stack.publish(direct, subject=subject)
        for item, tokens in ((pooled, 5), (direct, 3)):
            rid = item["request_id"]
            await stack.wait_for(lambda rid=rid: finished(stack, rid))
            chunks = chunks_for(stack, rid)
            assert [c["seq"] for c in chunks] == list(range(tokens + 1))
            assert len({c["attempt_id"] for c in chunks}) == 1 and chunks[0]["is_first"] is True
            assert chunks[-1]["done"] is True and chunks[-1]["finish_reason"] == "length"
            assert all(EXECUTED_HASH_KEY not in c for c in chunks)  # a legacy item: nothing stamped
        await stack.settled_pool()
        # The same prompt streams the same answer (the reference streamer is deterministic).
        again = generate_item(max_new_tokens=5)
        await stack.publish(again)
        await stack.wait_for(lambda: finished(stack, again["request_id"]))
        text = "".join(c["text_delta"] for c in chunks_for(stack, pooled["request_id"]))
        assert text == "".join(c["text_delta"] for c in chunks_for(stack, again["request_id"]))


@pytest.mark.parametrize(
    ("setup", "code", "message"),
    [
        ({"load_delay_s": 30.0, "preloaded_models": []}, "MODEL_LOADING", f"Model '{MODEL}' is loading; retry later."),
        ({"failed_models": [MODEL], "preloaded_models": []}, "MODEL_LOAD_FAILED", f"Model '{MODEL}' failed to load."),
    ],
)
async def test_a_model_that_cannot_serve_gets_the_terminal_chunk_and_an_ack(
    nats_server: NatsServer, tmp_path: Path, setup: dict[str, Any], code: str, message: str
) -> None:
    """§4.4: loading and load failure answer the fixed eight-key chunk of TV-G1, then ACK."""
    async with running_stack(nats_server, tmp_path, adapter=NullAdapter(dim=8, **setup)) as stack:
        item = generate_item()
        await stack.publish(item)
        await stack.wait_for(lambda: finished(stack, item["request_id"]))
        (chunk,) = chunks_for(stack, item["request_id"])
        assert list(chunk) == [
            "kind",
            "request_id",
            "attempt_id",
            "seq",
            "text_delta",
            "done",
            "finish_reason",
            "error",
        ]
        assert chunk["attempt_id"] == item["work_item_id"] + ":model-loading"
        assert chunk["error"] == {"code": code, "message": message}
        await stack.settled_pool()
        assert (await stack.pool_consumer()).num_redelivered == 0


async def test_chunks_of_a_pinned_item_carry_the_executed_hash_last(nats_server: NatsServer, tmp_path: Path) -> None:
    env = {"SIE_BUNDLE_CONFIG_HASH": "hash-a"}
    async with running_stack(nats_server, tmp_path, adapter=adapter(), env=env) as stack:
        item = generate_item(max_new_tokens=2, bundle_config_hash="hash-a")
        await stack.publish(item)
        await stack.wait_for(lambda: finished(stack, item["request_id"]))
        chunks = chunks_for(stack, item["request_id"])
        assert len(chunks) == 3 and all(
            list(c)[-1] == EXECUTED_HASH_KEY and c[EXECUTED_HASH_KEY] == "hash-a" for c in chunks
        )
        other = generate_item(bundle_config_hash="hash-b")  # not the worker's hash: NAKed, never run
        await stack.publish(other)
        await asyncio.sleep(1.0)
        assert chunks_for(stack, other["request_id"]) == []
        assert stack.adapter.generator.streams == 1


async def test_a_cancel_ends_the_stream_with_a_cancelled_chunk(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path, adapter=adapter(token_delay_s=0.05)) as stack:
        item = generate_item(max_new_tokens=200)
        await stack.publish(item)
        rid = item["request_id"]
        await stack.wait_for(lambda: len(chunks_for(stack, rid)) >= 3)
        await stack.nc.publish(f"cancel.{ROUTER}.{rid}", b"")
        await stack.wait_for(lambda: finished(stack, rid), timeout=10)
        chunks = chunks_for(stack, rid)
        assert chunks[-1]["finish_reason"] == "cancelled" and len(chunks) < 100
        assert [c["seq"] for c in chunks] == list(range(len(chunks)))
        await stack.settled_pool()


async def test_a_work_cancel_tombstone_does_not_drop_a_generation(nats_server: NatsServer, tmp_path: Path) -> None:
    """§14: generation is never ACK-dropped by tombstones (`work_cancel` is for batch work)."""
    async with running_stack(nats_server, tmp_path, adapter=adapter()) as stack:
        item = generate_item(max_new_tokens=2)
        await stack.cancel(f"work_cancel.{ROUTER}.{item['request_id']}")
        await stack.publish(item)
        await stack.wait_for(lambda: finished(stack, item["request_id"]))
        assert chunks_for(stack, item["request_id"])[-1]["finish_reason"] == "length"


async def test_a_kv_budget_nak_envelope_is_published_and_the_item_acked(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with running_stack(nats_server, tmp_path, adapter=adapter(kv_budget_naks=1)) as stack:
        item = generate_item()
        await stack.publish(item)
        await stack.wait_for(lambda: finished(stack, item["request_id"]))
        (nak,) = chunks_for(stack, item["request_id"])
        assert nak["kind"] == "nak" and nak["reason"] == "kv_budget"
        await stack.settled_pool()
        assert (await stack.pool_consumer()).num_redelivered == 0  # the gateway republishes, not JetStream


async def test_a_stream_that_fails_mid_way_is_naked_and_served_again(nats_server: NatsServer, tmp_path: Path) -> None:
    """An error envelope ends the stream unsettled: NAK (base delay), redelivered, a new attempt."""
    streamer = TokenStreamer(fail_after_tokens=2)
    async with running_stack(
        nats_server, tmp_path, adapter=NullAdapter(dim=8, preloaded_models=[MODEL], generator=streamer)
    ) as stack:
        item = generate_item(max_new_tokens=4)
        await stack.publish(item)
        rid = item["request_id"]
        await stack.wait_for(lambda: len(chunks_for(stack, rid)) >= 2)
        streamer.fail_after_tokens = 0
        await stack.wait_for(lambda: finished(stack, rid), timeout=15)
        chunks = chunks_for(stack, rid)
        attempts = list(dict.fromkeys(c["attempt_id"] for c in chunks))
        assert len(attempts) == 2
        second = [c for c in chunks if c["attempt_id"] == attempts[1]]
        assert [c["seq"] for c in second] == list(range(5)) and second[-1]["done"] is True
        await stack.settled_pool()  # the second attempt ACKed it (the first was NAKed: two attempts)


async def test_invalid_media_is_an_invalid_input_terminal_chunk(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path, adapter=adapter()) as stack:
        item = generate_item()
        item["generate"] = {"messages": [{"role": "user", "content": "x", "images": [{"data": "not base64!"}]}]}
        await stack.publish(item)
        await stack.wait_for(lambda: finished(stack, item["request_id"]))
        (chunk,) = chunks_for(stack, item["request_id"])
        assert chunk["error"]["code"] == "INVALID_INPUT" and stack.adapter.generator.streams == 0
        await stack.settled_pool()


async def test_an_offloaded_generate_payload_is_inlined_or_answered(nats_server: NatsServer, tmp_path: Path) -> None:
    """§4.4: a fetched `generate` value streams as if inline; an undecodable one is an internal_error
    result (never stamped), then ACK."""
    store = tmp_path / "payloads"
    store.mkdir()
    (store / "gen.msgpack").write_bytes(msgpack.packb({"prompt": "from the store", "max_new_tokens": 2}))
    (store / "bad.msgpack").write_bytes(b"\xc1")
    env = {"SIE_PAYLOAD_STORE_URL": f"file://{store}"}
    async with running_stack(nats_server, tmp_path, adapter=adapter(), env=env) as stack:
        good = generate_item(payload_ref="gen.msgpack")
        good["generate"] = None
        bad = generate_item(payload_ref="bad.msgpack")
        bad["generate"] = None
        await stack.publish(good)
        await stack.publish(bad)
        await stack.wait_for(lambda: finished(stack, good["request_id"]))
        assert [c["seq"] for c in chunks_for(stack, good["request_id"])] == [0, 1, 2]
        await stack.wait_for(lambda: len(stack.results_for(bad["work_item_id"])) == 1)
        (result,) = stack.results_for(bad["work_item_id"])
        assert result["error_code"] == "internal_error" and "executed_bundle_config_hash" not in result
        assert result["error"] == "failed to decode offloaded generate payload"  # wire §10.1's words
        await stack.settled_pool()


class _Misbehaving(TokenStreamer):
    """A generator that breaks the publish contract once: `foreign` publishes to another inbox,
    `oversized` publishes a chunk over NATS's max_payload; later streams behave."""

    def __init__(self, fault: str) -> None:
        super().__init__()
        self.fault: str | None = fault
        self.runs = 0

    async def run(self, work_item: Any, stream: Any) -> None:
        self.runs += 1
        fault, self.fault = self.fault, None
        if fault == "foreign":
            stream.reply_subject = "_INBOX.someone-else.x"
            await stream.chunk("stolen")
            await stream.ack()
            return
        if fault == "oversized":
            await stream.chunk("x" * (2 * 1024 * 1024))
            await stream.ack()
            return
        if fault == "double_ack":
            await stream.chunk("once", done=True, finish_reason="stop")
            await stream.ack()
            await stream.ack()
            await stream.in_progress()
            return
        await super().run(work_item, stream)


@pytest.mark.parametrize("fault", ["foreign", "oversized"])
async def test_a_publish_to_a_foreign_subject_or_that_fails_is_naked_and_served_again(
    nats_server: NatsServer, tmp_path: Path, fault: str
) -> None:
    """§4.4: a `publish` event for another reply subject, or one NATS refuses, fails the stream before
    its ACK: nothing reaches the other inbox, the item is NAKed and its redelivery streams normally."""
    streamer = _Misbehaving(fault)
    foreign: list[bytes] = []
    async with running_stack(
        nats_server, tmp_path, adapter=NullAdapter(dim=8, preloaded_models=[MODEL], generator=streamer)
    ) as stack:

        async def on_foreign(msg: Any) -> None:
            foreign.append(msg.data)

        sub = await stack.nc.subscribe("_INBOX.someone-else.>", cb=on_foreign)
        item = generate_item(max_new_tokens=2)
        await stack.publish(item)
        rid = item["request_id"]
        await stack.wait_for(lambda: finished(stack, rid), timeout=15)
        chunks = chunks_for(stack, rid)
        assert [c["seq"] for c in chunks] == [0, 1, 2] and chunks[-1]["done"] is True  # the second attempt
        assert all(c["text_delta"] != "stolen" for c in chunks) and foreign == []
        await stack.settled_pool()
        assert streamer.runs == 2  # NAKed once, redelivered, served
        await sub.unsubscribe()


async def test_an_offloaded_payload_too_large_or_unreadable(nats_server: NatsServer, tmp_path: Path) -> None:
    """§4.4: over the envelope cap is a PAYLOAD_TOO_LARGE terminal chunk, then ACK; a fetch error
    (here: no such object) NAKs for redelivery and publishes nothing."""
    store = tmp_path / "payloads"
    store.mkdir()
    (store / "huge.msgpack").write_bytes(b"\0" * 35_717_121)  # one byte over the cap (§12)
    env = {"SIE_PAYLOAD_STORE_URL": f"file://{store}"}
    async with running_stack(nats_server, tmp_path, adapter=adapter(), env=env) as stack:
        huge = generate_item(payload_ref="huge.msgpack")
        huge["generate"] = None
        missing = generate_item(payload_ref="missing.msgpack")
        missing["generate"] = None
        await stack.publish(huge)
        await stack.wait_for(lambda: finished(stack, huge["request_id"]))
        (chunk,) = chunks_for(stack, huge["request_id"])
        assert chunk["error"]["code"] == "PAYLOAD_TOO_LARGE"
        await stack.settled_pool()
        await stack.publish(missing)

        async def redelivered() -> int:
            return int((await stack.pool_consumer()).num_redelivered)

        deadline = asyncio.get_running_loop().time() + 10
        while await redelivered() < 1:
            assert asyncio.get_running_loop().time() < deadline, "the unreadable payload was not NAKed"
            await asyncio.sleep(0.05)
        assert chunks_for(stack, missing["request_id"]) == [] and stack.results_for(missing["work_item_id"]) == []
        assert stack.adapter.generator.streams == 0


async def test_a_backend_killed_mid_stream_naks_and_a_new_backend_streams_it(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """kill -9 of the backend process during a stream: the stream fails, the item is NAKed (not lost,
    not ACKed), and a replacement backend streams it from seq 0 under a new attempt."""
    from sie_sidecar.backend.server import BackendServer

    from .test_failures import backend_process, wait_socket

    sock = str(tmp_path / "streaming.sock")
    proc = backend_process(sock, "--gen-token-delay-s", "0.1")
    try:
        await wait_socket(sock, proc)
        async with running_stack(nats_server, tmp_path, external_backend=sock) as stack:
            item = generate_item(max_new_tokens=50)
            await stack.publish(item)
            rid = item["request_id"]
            await stack.wait_for(lambda: len(chunks_for(stack, rid)) >= 3)
            proc.kill()
            await asyncio.get_running_loop().run_in_executor(None, proc.wait, 10)
            first = list(dict.fromkeys(c["attempt_id"] for c in chunks_for(stack, rid)))
            assert len(first) == 1 and not finished(stack, rid)
            Path(sock).unlink(missing_ok=True)
            replacement = BackendServer(adapter(token_delay_s=0.0), sock, worker_id="backend-1")
            await replacement.start()
            try:
                await stack.wait_for(lambda: finished(stack, rid), timeout=20)
                chunks = chunks_for(stack, rid)
                second = [c for c in chunks if c["attempt_id"] != first[0]]
                assert [c["seq"] for c in second] == list(range(51)) and second[-1]["done"] is True
                await stack.settled_pool()
            finally:
                await replacement.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


async def test_a_second_settlement_after_the_ack_is_ignored_over_nats(
    nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """§4.4: over NATS the first settlement wins; a second ack and a progress after it are ignored
    (the stream is not failed, nothing is settled twice). TV-G3's stricter rule is the local
    stream's (tests/unit/test_local_streams.py)."""
    from sie_sidecar.logs import Throttled
    from sie_sidecar.pipeline import generation

    monkeypatch.setattr(generation, "_warn", Throttled(generation.log))  # no earlier test's throttle
    streamer = _Misbehaving("double_ack")
    async with running_stack(
        nats_server, tmp_path, adapter=NullAdapter(dim=8, preloaded_models=[MODEL], generator=streamer)
    ) as stack:
        item = generate_item(max_new_tokens=2)
        await stack.publish(item)
        rid = item["request_id"]
        await stack.wait_for(lambda: finished(stack, rid), timeout=15)
        await stack.settled_pool()
        assert [c["seq"] for c in chunks_for(stack, rid)] == [0] and streamer.runs == 1
        assert (await stack.pool_consumer()).num_redelivered == 0
    assert not any(r.getMessage() == "generation stream failed" for r in caplog.records)
    assert not any(r.getMessage() == "delivery settled twice" for r in caplog.records)
