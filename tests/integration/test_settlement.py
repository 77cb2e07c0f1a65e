# SPDX-License-Identifier: Apache-2.0
"""Every row of the settlement table (sidecar-behaviour §4, wire-protocol Appendix A) against a real
nats-server, the real reference backend over a real Unix socket, and the real sidecar."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from sie_sidecar import wire
from sie_sidecar.backend.null import NullAdapter

from .conftest import NatsServer
from .stack import MODEL, NAK_DELAY_S, ROUTER, Stack, running_stack, work_item

OTHER_MODEL = "org/model-b"


async def redelivered(stack: Stack, at_least: int = 1, timeout: float = 10.0) -> None:
    """Wait until the pool consumer has redelivered (i.e. the sidecar NAKed) at least once."""

    async def check() -> bool:
        return int((await stack.pool_consumer()).num_redelivered) >= at_least

    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("no redelivery observed")
        await asyncio.sleep(0.05)


async def test_encode_items_are_answered_and_acked(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path) as stack:
        ids = [
            await stack.publish(work_item(text=f"text {i}", item={"text": f"text {i}", "id": f"doc-{i}"}))
            for i in range(20)
        ]
        await stack.wait_for(lambda: len(stack.replies) == 20)
        await stack.settled_pool()
        for i, wid in enumerate(ids):
            (reply,) = stack.results_for(wid)
            assert reply["success"] is True and reply["error"] is None
            framed = msgpack.unpackb(reply["result_msgpack"])
            assert list(framed) == ["id", "dense"] and framed["id"] == f"doc-{i}"
            vector = np.frombuffer(framed["dense"]["values"][b"data"], np.float32)
            np.testing.assert_allclose(vector, stack.adapter.vector(f"text {i}"), rtol=1e-6)
            assert reply["worker_id"] == "w-test" and reply["worker_direct"] is False
            assert reply["processing_ms"] == 0.0 and reply["queue_ms"] >= 0.0
        assert (await stack.pool_consumer()).num_redelivered == 0


async def test_undecodable_work_item_is_naked(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path) as stack:
        subject = wire.pool_work_subject("default", "cpu", "default", MODEL)
        await stack.publish({}, subject=subject, data=b"\xc1 not msgpack")
        await redelivered(stack)
        info = await stack.pool_consumer()
        assert info.num_pending + info.num_ack_pending == 1  # still in the stream, for redelivery
        assert stack.raw_replies == []


async def test_work_item_missing_a_required_key_is_naked(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path) as stack:
        item = work_item()
        del item["machine_profile"]
        await stack.publish(item)
        await redelivered(stack)
        assert stack.replies == []


async def test_unsafe_reply_subject_is_ack_dropped(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path) as stack:
        seen: list[bytes] = []

        async def on_reply(msg: Any) -> None:
            seen.append(msg.data)

        await stack.nc.subscribe("reply.>", cb=on_reply)
        await stack.publish(work_item(reply_subject="reply.somewhere"))
        await stack.settled_pool()
        await asyncio.sleep(0.2)
        assert seen == [] and stack.raw_replies == []
        assert (await stack.pool_consumer()).num_redelivered == 0
        assert stack.adapter.batches == 0


async def test_a_server_copied_message_is_ack_dropped(nats_server: NatsServer, tmp_path: Path) -> None:
    """sidecar-behaviour §4.1 row 1 (newer than v0.7.1): a `Nats-` header other than `Nats-Msg-Id`
    marks a message the server copied (a mirror, a source): ACK-dropped, no reply, no batch; the
    publisher's own de-duplication header is ordinary work. (nats-server refuses a client-set
    `Nats-Stream-Source`, so the copy is marked with another `Nats-` header, in lower case.)"""
    async with running_stack(nats_server, tmp_path) as stack:
        copied = await stack.publish(work_item(text="copied"), headers={"nats-copied-from": "ORIGIN 7"})
        own = await stack.publish(work_item(text="own"), headers={"Nats-Msg-Id": "dedup-1", "X-Trace": "t"})
        await stack.wait_for(lambda: len(stack.results_for(own)) == 1)
        await stack.settled_pool()
        await asyncio.sleep(0.2)
        assert stack.results_for(copied) == []
        assert stack.adapter.items == 1
        consumer = await stack.pool_consumer()
        assert consumer.num_redelivered == 0 and consumer.delivered.stream_seq == 2  # both were delivered


async def test_empty_reply_subject_is_fire_and_forget(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path) as stack:
        await stack.publish(work_item(reply_subject=""))
        await stack.settled_pool()
        assert stack.adapter.items == 1 and stack.raw_replies == []


async def test_cold_load_progress_acks_then_succeeds_on_the_first_delivery(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    adapter = NullAdapter(dim=8, load_delay_s=3 * NAK_DELAY_S)
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        wid = await stack.publish(work_item())
        await stack.wait_for(lambda: len(stack.results_for(wid)) == 1)
        await stack.settled_pool()
        assert stack.results_for(wid)[0]["success"] is True
        assert (await stack.pool_consumer()).num_redelivered == 0  # progress-ACKed, never NAKed


async def _tombstoned_before_ipc(nats_server: NatsServer, tmp_path: Path, tree: str) -> None:
    """A cancel on `tree` tombstones its request: the request's item is ACK-dropped before IPC."""
    async with running_stack(nats_server, tmp_path) as stack:
        item = work_item()
        await stack.cancel(f"{tree}.{ROUTER}.{item['request_id']}")
        items_before = stack.adapter.items
        await stack.publish(item)
        other = await stack.publish(work_item())
        await stack.wait_for(lambda: len(stack.results_for(other)) == 1)
        await stack.settled_pool()
        assert stack.results_for(item["work_item_id"]) == []
        assert stack.adapter.items == items_before + 1  # only the other item reached the backend


async def test_tombstoned_work_is_ack_dropped_before_ipc(nats_server: NatsServer, tmp_path: Path) -> None:
    await _tombstoned_before_ipc(nats_server, tmp_path, "work_cancel")


async def test_tombstones_are_namespaced_by_router(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path) as stack:
        item = work_item()
        await stack.cancel(f"work_cancel.other-router.{item['request_id']}")
        wid = await stack.publish(item)
        await stack.wait_for(lambda: len(stack.results_for(wid)) == 1)


async def test_a_generation_cancel_also_tombstones_the_request(nats_server: NatsServer, tmp_path: Path) -> None:
    """§7 (newer than v0.7.1): `cancel.{router}.{request}` records the request tombstone as well as
    forwarding SignalGenerateCancel, so the request's non-generate items are ACK-dropped."""
    await _tombstoned_before_ipc(nats_server, tmp_path, "cancel")


@pytest.mark.parametrize("how", ["reply", "nats-header", "plain"])
async def test_a_cancel_with_a_reply_subject_or_a_nats_header_is_dropped(
    nats_server: NatsServer, tmp_path: Path, how: str
) -> None:
    """§3 (newer than v0.7.1): a cancel carrying a reply subject or a `Nats-` header is not the
    gateway's plain Core message; it records nothing. The plain one is the control."""
    async with running_stack(nats_server, tmp_path) as stack:
        item = work_item()
        subject = f"work_cancel.{ROUTER}.{item['request_id']}"
        if how == "reply":
            await stack.nc.publish(subject, b"", reply="_INBOX.somebody.1")
        elif how == "nats-header":
            await stack.nc.publish(subject, b"", headers={"Nats-Msg-Id": "x"})
        else:
            await stack.nc.publish(subject, b"")
        probe = await stack.publish(work_item(text="probe"))  # the cancel was handled before this
        await stack.wait_for(lambda: len(stack.results_for(probe)) == 1)
        wid = await stack.publish(item)
        later = await stack.publish(work_item(text="later"))
        await stack.wait_for(lambda: len(stack.results_for(later)) == 1)
        await stack.settled_pool()
        assert len(stack.results_for(wid)) == (0 if how == "plain" else 1)


async def test_bundle_hash_mismatch_is_naked(nats_server: NatsServer, tmp_path: Path) -> None:
    # A stale hash NAKs its whole model group (§4.2), so it travels under another model here.
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL, OTHER_MODEL])
    env = {"SIE_BUNDLE_CONFIG_HASH": "h-current"}
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
        stale = await stack.publish(work_item(model=OTHER_MODEL, bundle_config_hash="h-old"))
        current = await stack.publish(work_item(bundle_config_hash="h-current"))
        legacy = await stack.publish(work_item())
        await stack.wait_for(lambda: len(stack.results_for(current)) == 1 and len(stack.results_for(legacy)) == 1)
        await redelivered(stack)
        assert stack.results_for(stale) == []
        assert stack.results_for(current)[0]["executed_bundle_config_hash"] == "h-current"
        assert "executed_bundle_config_hash" not in stack.results_for(legacy)[0]


async def test_unknown_operation_publishes_bad_operation_and_acks(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path) as stack:
        wid = await stack.publish(work_item(operation="transmogrify"))
        await stack.wait_for(lambda: len(stack.results_for(wid)) == 1)
        await stack.settled_pool()
        (reply,) = stack.results_for(wid)
        assert (reply["success"], reply["error_code"], reply["error"]) == (False, "bad_operation", "unknown operation")
        assert reply["inference_ms"] is None and reply["queue_ms"] is None


async def test_permanent_load_failure_publishes_model_load_failed(nats_server: NatsServer, tmp_path: Path) -> None:
    adapter = NullAdapter(dim=8, failed_models=[MODEL])
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        wid = await stack.publish(work_item())
        await stack.wait_for(lambda: len(stack.results_for(wid)) == 1)
        await stack.settled_pool()
        (reply,) = stack.results_for(wid)
        assert reply["error_code"] == "MODEL_LOAD_FAILED"
        assert reply["error"] == f"Model '{MODEL}' failed to load permanently."


async def test_retry_later_is_naked(nats_server: NatsServer, tmp_path: Path) -> None:
    adapter = NullAdapter(dim=8, retry_later_models=[MODEL])
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        await stack.publish(work_item())
        await redelivered(stack)
        await asyncio.sleep(3 * NAK_DELAY_S)  # NAKed again on every redelivery, never answered
        assert stack.replies == []
        assert stack.adapter.batches == 0


async def test_per_item_backend_errors_are_published_and_the_rest_succeeds(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], error_every=2, error_retry_after_s=7)
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        rid = "req-batch"
        items = [work_item(request_id=rid, item_index=i, total_items=4) for i in range(4)]
        for it in items:
            await stack.publish(it)
        await stack.wait_for(lambda: len(stack.replies) == 4)
        await stack.settled_pool()
        codes = sorted((r["success"], r["error_code"]) for r in stack.replies)
        assert (False, "inference_error") in codes and (True, None) in codes
        # §6.1 (newer than v0.7.1): the backend's retry hint is passed through unchanged.
        for reply in stack.replies:
            assert reply.get("retry_after_s") == (None if reply["success"] else 7)


async def test_offloaded_payload_without_a_store_is_a_payload_error(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path) as stack:
        wid = await stack.publish(work_item(item=None, payload_ref="req_0.bin"))
        await stack.wait_for(lambda: len(stack.results_for(wid)) == 1)
        await stack.settled_pool()
        (reply,) = stack.results_for(wid)
        assert (reply["error_code"], reply["error"]) == ("payload_error", "failed to resolve item")


async def test_offloaded_payloads_resolve_and_bad_refs_fail_alone(nats_server: NatsServer, tmp_path: Path) -> None:
    """A local payload store (§12): a stored item is inlined and served; a traversal, a missing file
    and an oversized blob each get their own error result and ACK; nothing else in the batch is lost."""
    store = tmp_path / "payloads"
    store.mkdir()
    (store / "good.bin").write_bytes(msgpack.packb({"text": "text 7", "id": "from-store"}))
    (store / "huge.bin").write_bytes(b"\x00" * (35_717_120 + 1))
    (tmp_path / "secret.bin").write_bytes(msgpack.packb({"text": "secret"}))
    env = {"SIE_PAYLOAD_STORE_URL": str(store)}
    async with running_stack(nats_server, tmp_path, env=env) as stack:
        refs = ["good.bin", "../secret.bin", "missing.bin", "huge.bin"]
        ids = [await stack.publish(work_item(item=None, payload_ref=ref)) for ref in refs]
        inline = await stack.publish(work_item(text="text 8"))
        await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in [*ids, inline]))
        await stack.settled_pool()
        good, escape, missing, huge = (stack.results_for(w)[0] for w in ids)
        assert good["success"] is True
        decoded = msgpack.unpackb(good["result_msgpack"])
        assert decoded["id"] == "from-store"
        assert (escape["error_code"], missing["error_code"]) == ("payload_error", "payload_error")
        assert (huge["error_code"], huge["error"]) == (
            "PAYLOAD_TOO_LARGE",
            "referenced payload exceeds the worker size limit",
        )
        assert stack.results_for(inline)[0]["success"] is True
        assert good["payload_fetch_ms"] > 0  # §6.1: only when a payload was fetched
        assert stack.results_for(inline)[0]["payload_fetch_ms"] is None
        assert escape["payload_fetch_ms"] is None  # a pre-execution error carries no timings


async def test_run_batch_is_sent_to_a_backend_without_a_descriptor(nats_server: NatsServer, tmp_path: Path) -> None:
    """v0.7.1 sends every batch as RunBatch and never reads `supports_run_batch` (issue 11)."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], with_descriptor=False)
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        ids = [await stack.publish(work_item(text=f"t{i}")) for i in range(5)]
        await stack.wait_for(lambda: all(len(stack.results_for(i)) == 1 for i in ids))
        assert stack.backend is not None
        calls = stack.backend.method_calls
        assert calls["RunBatch"] >= 1 and calls["ProcessEncodeBatch"] == 0


async def test_a_backend_without_run_batch_gets_the_per_op_methods_after_one_refusal(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A backend that answers `unknown method RunBatch` is asked once; that batch and every later one
    go through the per-op methods, and no item is NAKed for it (its delivery budget is untouched)."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], supports_run_batch=False)
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        first = [await stack.publish(work_item(text=f"a{i}")) for i in range(3)]
        await stack.wait_for(lambda: all(len(stack.results_for(i)) == 1 for i in first))
        score = await stack.publish(
            work_item(operation="score", item=None, query_item={"text": "q"}, score_items=[{"text": "a", "id": "a"}])
        )
        later = [await stack.publish(work_item(text=f"b{i}")) for i in range(3)]
        await stack.wait_for(lambda: all(len(stack.results_for(i)) == 1 for i in [*later, score]))
        assert all(stack.results_for(i)[0]["success"] for i in [*first, *later, score])
        assert stack.backend is not None
        calls = stack.backend.method_calls
        assert calls["RunBatch"] == 1
        assert calls["ProcessEncodeBatch"] >= 2 and calls["ProcessScoreBatch"] == 1
        assert (await stack.pool_consumer()).num_redelivered == 0


async def test_score_and_extract_items(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path) as stack:
        score = await stack.publish(
            work_item(
                operation="score",
                item=None,
                query_item={"text": "q"},
                score_items=[{"text": "a", "id": "a"}, {"text": "b", "id": "b"}],
            )
        )
        extract = await stack.publish(work_item(operation="extract", labels=["person"]))
        await stack.wait_for(lambda: len(stack.results_for(score)) == 1 and len(stack.results_for(extract)) == 1)
        ranked = msgpack.unpackb(stack.results_for(score)[0]["result_msgpack"])
        assert sorted(r["item_id"] for r in ranked) == ["a", "b"] and [r["rank"] for r in ranked] == [0, 1]
        assert stack.results_for(extract)[0]["success"] is True


async def test_large_result_is_chunked_or_refused_compactly(nats_server: NatsServer, tmp_path: Path) -> None:
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], oversized_bytes=3 * 1024 * 1024)
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        assembler = wire.ResultChunkAssembler()
        chunked: list[tuple[str, bytes]] = []

        async def on_chunk(msg: object) -> None:
            decoded = msgpack.unpackb(msg.data)  # type: ignore[attr-defined]
            if isinstance(decoded, dict) and decoded.get("kind") == "result_chunk_v1":
                done = assembler.feed(msg.data)  # type: ignore[attr-defined]
                if done is not None:
                    chunked.append(done)

        await stack.nc.subscribe(f"_INBOX.{ROUTER}.>", cb=on_chunk)
        # The null adapter pads the first result of each batch: send the two items one at a time.
        with_chunks = await stack.publish(work_item())
        await stack.wait_for(lambda: len(chunked) == 1, timeout=20)
        without = await stack.publish(work_item(accepts_result_chunks=False))
        await stack.wait_for(lambda: len(stack.results_for(without)) == 1, timeout=20)
        await stack.settled_pool()
        wid, whole = chunked[0]
        assert wid == with_chunks and msgpack.unpackb(whole)["success"] is True
        (refused,) = stack.results_for(without)
        assert refused["error_code"] == "PAYLOAD_TOO_LARGE" and refused["result_msgpack"] == b""
        assert refused["error"].startswith("Encoded result exceeds the transport limit (")


async def test_over_budget_items_are_naked_with_a_short_delay(nats_server: NatsServer, tmp_path: Path) -> None:
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_budget=2, batch_delay_s=0.3)
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        ids = [await stack.publish(work_item()) for _ in range(6)]
        await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in ids), timeout=20)
        await stack.settled_pool()
        assert max(1, stack.adapter.batches) >= 3  # never more than the budget of 2 per batch


async def test_every_item_ends_with_one_final_reply_or_stays_in_the_stream(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """The accounting rule across a mix of settlements: nothing is lost, nothing is answered twice."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL, OTHER_MODEL], error_every=3)
    async with running_stack(nats_server, tmp_path, adapter=adapter, env={"SIE_BUNDLE_CONFIG_HASH": "h1"}) as stack:
        answered = [await stack.publish(work_item(text=f"t{i}")) for i in range(30)]
        answered.append(await stack.publish(work_item(operation="nope")))
        naked = [await stack.publish(work_item(model=OTHER_MODEL, bundle_config_hash="h0")) for _ in range(3)]
        dropped = work_item()
        await stack.cancel(f"work_cancel.{ROUTER}.{dropped['request_id']}")
        await stack.publish(dropped)
        await stack.wait_for(lambda: all(len(stack.results_for(w)) >= 1 for w in answered), timeout=20)
        await asyncio.sleep(3 * NAK_DELAY_S)
        for wid in answered:
            assert len(stack.results_for(wid)) == 1, wid
        for wid in [*naked, dropped["work_item_id"]]:
            assert stack.results_for(wid) == []
        info = await stack.pool_consumer()
        assert info.num_pending + info.num_ack_pending == len(naked)  # NAKed work waits for redelivery


async def test_malformed_subject_is_naked(nats_server: NatsServer, tmp_path: Path) -> None:
    """A subject with fewer than six tokens can not reach the pool stream, so the dispatcher is fed
    from a stream of its own here (real JetStream messages, real NAKs)."""
    from sie_sidecar.bus.publisher import Publisher
    from sie_sidecar.bus.pull import PullConsumer
    from sie_sidecar.pipeline.delivery import Settler
    from sie_sidecar.pipeline.dispatcher import Dispatcher, DispatchSettings

    async with running_stack(nats_server, tmp_path) as stack:
        await stack.js.add_stream(name="SHORT", subjects=["short.>"])
        await stack.js.add_consumer("SHORT", durable_name="d", ack_policy="explicit", ack_wait=30)
        await stack.js.publish("short.x", msgpack.packb(work_item()))
        consumer = PullConsumer(stack.nc, "SHORT", "d", batch=8, expires_s=2.0, max_outstanding=8)
        await consumer.start()
        try:
            settler = Settler()
            ipc = None  # never reached: intake NAKs before any backend call
            dispatcher = Dispatcher(DispatchSettings(worker_id="w"), ipc, Publisher(stack.nc), settler)  # type: ignore[arg-type]
            batch = await consumer.next_batch(8, 0.01)
            await dispatcher.handle(batch, consumer.settled)
            assert (settler.counts.naked, settler.counts.acked) == (1, 0)
            redelivery = await consumer.next_batch(8, 0.01)  # back after the base delay
            assert redelivery[0].metadata.num_delivered == 2
            await dispatcher.handle(redelivery, consumer.settled)
        finally:
            await consumer.stop()


async def test_worker_direct_work_is_answered_as_worker_direct(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path) as stack:
        subject = wire.worker_direct_subject("default", "cpu", "default", MODEL, stack.settings.worker_id)
        direct = work_item()
        await stack.publish(direct, subject=subject)
        cancelled = work_item()
        await stack.nc.publish(f"batch_cancel.{ROUTER}.someone-else.{direct['request_id']}", b"")
        await stack.cancel(
            f"batch_cancel.{ROUTER}.{wire.normalize_token(stack.settings.worker_id)}.{cancelled['request_id']}"
        )
        await stack.publish(cancelled, subject=subject)
        pooled = await stack.publish(work_item(request_id=cancelled["request_id"], item_index=1))
        await stack.wait_for(
            lambda: len(stack.results_for(direct["work_item_id"])) == 1 and len(stack.results_for(pooled)) == 1
        )
        assert stack.results_for(direct["work_item_id"])[0]["worker_direct"] is True
        assert stack.results_for(pooled)[0]["worker_direct"] is False  # batch tombstones apply to direct work only
        assert stack.results_for(cancelled["work_item_id"]) == []


async def test_model_unloaded_behind_the_readiness_cache_is_reloaded(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatcher reuses a `ready` answer briefly; a backend that unloaded the model answers
    nak_retry, which must make the very next delivery ask EnsureModelReady (and load) again."""
    from sie_sidecar.backend import null

    monkeypatch.setattr(null, "NOT_LOADED_NAK_MS", 50)  # redelivered well inside the 1 s cache window
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], load_delay_s=NAK_DELAY_S)
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        first = await stack.publish(work_item())
        await stack.wait_for(lambda: len(stack.results_for(first)) == 1)
        adapter._loaded.discard(MODEL)  # the backend evicts the model behind the sidecar's back
        second = await stack.publish(work_item())
        await stack.wait_for(lambda: len(stack.results_for(second)) == 1, timeout=20)
        await stack.settled_pool()
        assert stack.results_for(second)[0]["success"] is True
        assert MODEL in adapter.loaded_models()  # it was loaded again
        # ok, nak_retry, then ok after the reload: a stale cache would have re-sent the batch every
        # 50 ms for the rest of the second instead of asking EnsureModelReady.
        assert adapter.batches == 3
        assert (await stack.pool_consumer()).num_redelivered == 0  # all settled at the end


async def test_batched_f16_multivectors_from_the_backend_library_reach_the_replies(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Issue 11: an adapter returns token embeddings as one half-float buffer (wire-protocol §4.7)
    through `run_batch_outputs`; the library checks and sends it (the sidecar accepts it), and each
    item's reply is the float16 multivector of its slice."""
    from sie_sidecar import wire
    from sie_sidecar.backend.adapter import BatchOutputs, F16Multivector, outcome_for

    class Tokens(NullAdapter):
        async def run_batch_outputs(
            self, model_id: str, op: str, items: list[dict[str, Any]], lora_key: str, *, accepts_f16: bool
        ) -> BatchOutputs:
            assert accepts_f16
            buffer = b""
            slices = []
            for n, item in enumerate(items):
                rows = np.full((2, 3), n + 1, dtype=np.float16)  # 2 tokens x 3 dims
                slices.append(F16Multivector(str(item["work_item_id"]), len(buffer), 2, 3))
                buffer += rows.astype("<f2").tobytes()
            outcomes = [outcome_for(item, "publish_and_ack") for item in items]  # result_msgpack nil: in the buffer
            return BatchOutputs(outcomes, [(buffer, slices)])

    async with running_stack(nats_server, tmp_path, adapter=Tokens(dim=8, preloaded_models=[MODEL])) as stack:
        ids = [await stack.publish(work_item(text=f"t{i}", output_types=["multivector"])) for i in range(3)]
        await stack.wait_for(lambda: all(len(stack.results_for(i)) == 1 for i in ids))
        for wid in ids:
            (reply,) = stack.results_for(wid)
            assert reply["success"] is True, reply
            framed = msgpack.unpackb(reply["result_msgpack"])
            expected = msgpack.unpackb(
                wire.frame_multivector(None, 2, 3, dtype="float16", values_f16=framed_values(framed))
            )
            assert framed == expected
            values = np.frombuffer(framed_values(framed), dtype="<f2")
            assert values.shape == (6,) and len(set(values.tolist())) == 1  # one item's own slice


def framed_values(framed: dict[Any, Any]) -> bytes:
    """The half-float bytes of a framed multivector result (its nd sentinel's data)."""
    node = framed["multivector"]["values"] if "multivector" in framed else framed[b"multivector"][b"values"]
    data = node[b"data"] if b"data" in node else node["data"]
    return bytes(data)


async def test_a_nak_retry_of_a_remote_attempt_is_answered_as_a_queue_full_refusal(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """wire-protocol §4.6 (newer than v0.7.1): an item with `fallback_reason` stands in for a local
    refusal; when the backend answers it `nak_retry`, the gateway gets an error WorkResult (code
    QUEUE_FULL by default, the retry hint from the NAK delay) and the item is ACKed, not NAKed."""
    from sie_sidecar.backend import null

    monkeypatch.setattr(null, "NOT_LOADED_NAK_MS", 2500)
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL])
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        warm = await stack.publish(work_item())
        await stack.wait_for(lambda: len(stack.results_for(warm)) == 1)
        adapter._loaded.discard(MODEL)  # the next batch is answered nak_retry
        remote = await stack.publish(work_item(fallback_reason="queue_full"))
        await stack.wait_for(lambda: len(stack.results_for(remote)) == 1, timeout=10)
        await stack.settled_pool()
        (reply,) = stack.results_for(remote)
        assert (reply["success"], reply["error_code"]) == (False, "QUEUE_FULL")
        assert reply["error"] == "The remote profile cannot serve this request now"
        assert reply["retry_after_s"] == 3  # ceil(2500 ms / 1000)
        assert (await stack.pool_consumer()).num_redelivered == 0


async def test_a_load_item_is_acked_once_its_model_is_ready(nats_server: NatsServer, tmp_path: Path) -> None:
    """§4.2 (newer than v0.7.1): operation `load` waits for the model (loading progress-ACKed as any
    group) and is ACKed with no result once it is ready; the next encode finds it loaded."""
    adapter = NullAdapter(dim=8, load_delay_s=0.5)
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        await stack.publish(work_item(operation="load", item=None))
        await stack.wait_for(lambda: MODEL in adapter.loaded_models(), timeout=10)
        await stack.settled_pool()
        assert stack.replies == [] and adapter.items == 0  # no result and no batch for a load
        wid = await stack.publish(work_item())
        await stack.wait_for(lambda: len(stack.results_for(wid)) == 1)
        assert (await stack.pool_consumer()).num_redelivered == 0


async def test_an_engine_batched_model_grows_the_ipc_pool_to_its_width(nats_server: NatsServer, tmp_path: Path) -> None:
    """wire-protocol §1.2 (newer than v0.7.1): a descriptor with `max_concurrent_dispatch` 6 grows the
    pool of 2 connections by 6, so the six extract items (each dispatched alone, scheduler-and-prep
    §1.2) run at once; a pool of 2 would have run at most two at a time."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_delay_s=0.4, dispatch_width=6)
    env = {"SIE_IPC_POOL_SIZE": "2"}
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
        ids = [
            await stack.publish(work_item(operation="extract", item={"text": f"t{i}"}, labels=["x"])) for i in range(6)
        ]
        await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in ids), timeout=15)
        await stack.settled_pool()
        assert adapter.most_running > 2
