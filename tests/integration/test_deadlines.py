# SPDX-License-Identifier: Apache-2.0
"""Work deadlines over a real nats-server (sidecar-behaviour §15.3, §4.1 rows 8/10/13, §4.2): no
expired item reaches the backend when enforcement is on, every fresh one is answered, expired work
runs when it is off, an item that expires while it waits is dropped before IPC, and a held item
with a deadline is not redelivered while it is held."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgpack
import nats
import pytest

from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.pipeline.deadlines import DeadlineLeases, DeadlineRules
from sie_sidecar.pipeline.delivery import Delivery, Settler
from sie_sidecar.wire.workitem import decode_work_item

from .conftest import NatsServer
from .stack import MODEL, running_stack, work_item

ENFORCE = {"SIE_WORK_DEADLINE_ENFORCE": "true"}


def expired_item(**extra: Any) -> dict[str, Any]:
    now = time.time()
    return work_item(timestamp=now - 100, deadline=now - 50, **extra)  # 50 s late, well past the 5 s skew


def fresh_item(**extra: Any) -> dict[str, Any]:
    now = time.time()
    return work_item(timestamp=now, deadline=now + 60, **extra)


@pytest.mark.parametrize("enforce", [True, False])
async def test_expired_work_never_reaches_the_backend_when_enforced(
    nats_server: NatsServer, tmp_path: Path, enforce: bool
) -> None:
    env = ENFORCE if enforce else {}
    async with running_stack(nats_server, tmp_path, env=env) as stack:
        expired = [await stack.publish(expired_item(text=f"old {i}")) for i in range(12)]
        fresh = [await stack.publish(fresh_item(text=f"new {i}")) for i in range(12)]
        undated = [await stack.publish(work_item(text=f"plain {i}")) for i in range(4)]
        answered = fresh + undated + ([] if enforce else expired)
        await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in answered))
        await stack.settled_pool()
        assert stack.adapter.items == len(answered)  # with enforcement, not one expired item ran
        for wid in expired:
            assert len(stack.results_for(wid)) == (0 if enforce else 1)
        for wid in answered:
            (reply,) = stack.results_for(wid)
            assert reply["success"] is True
        info = await stack.pool_consumer()
        assert info.num_redelivered == 0  # ACK-dropped, not NAKed


async def test_an_item_that_expires_while_it_waits_is_dropped_before_ipc(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """§4.2: expiry is checked again at `before_ipc`. The first batch holds the only pipeline slot
    for 2.5 s; the dated item behind it was fresh at intake and is expired when its turn comes."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_delay_s=2.5)
    env = {**ENFORCE, "SIE_WORK_DEADLINE_SKEW_TOLERANCE_MS": "0", "SIE_RUST_PIPELINE_DEPTH": "1"}
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
        first = await stack.publish(work_item(text="slow"))
        await stack.wait_for(lambda: stack.adapter.batches >= 1 or stack.adapter.items >= 1, timeout=5)
        now = time.time()
        doomed = await stack.publish(work_item(text="late", timestamp=now, deadline=now + 1.0))
        await stack.wait_for(lambda: len(stack.results_for(first)) == 1, timeout=10)
        await stack.settled_pool(timeout=10)
        assert stack.results_for(doomed) == []
        assert stack.adapter.items == 1
        assert (await stack.pool_consumer()).num_redelivered == 0


async def test_a_held_item_with_a_deadline_is_not_redelivered_while_held(nats_server: NatsServer) -> None:
    """The lease book over a real consumer with a 2 s ack_wait (ticks shortened to 0.5 s): held for
    three ack_waits, the dated items stay with us while the undated ones come back."""
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="LEASES", subjects=["lease.>"])
        await js.add_consumer("LEASES", durable_name="held", ack_policy="explicit", ack_wait=2.0)
        now = time.time()
        for i in range(4):
            dated = i < 2
            extra: dict[str, Any] = {"timestamp": now, "deadline": now + 60} if dated else {}
            await js.publish(f"lease.{i}", msgpack.packb(work_item(text=f"{i}", **extra)))
        sub = await js.pull_subscribe_bind("held", stream="LEASES")
        msgs = await sub.fetch(4, timeout=5)
        ds = [Delivery(msg=m, worker_direct=False, item=decode_work_item(m.data)) for m in msgs]
        settler = Settler()

        async def progress(held: list[Delivery]) -> None:
            for d in held:
                await settler.progress(d)

        book = DeadlineLeases(DeadlineRules(), progress, tick_s=0.5)
        book.hold(ds)
        ticker = book.start()
        try:
            await asyncio.sleep(6.0)
            back = await sub.fetch(4, timeout=2)
            redelivered = {m.subject for m in back}
            assert redelivered == {"lease.2", "lease.3"}  # only the undated ones
            for m in back:
                await m.ack()
            assert book.progressed >= 2 * 5
            for d in ds[:2]:
                await settler.ack(d)
        finally:
            await DeadlineLeases.stop(ticker)
        await asyncio.sleep(0.2)
        info = await js.consumer_info("LEASES", "held")
        assert info.num_ack_pending == 0 and info.num_pending == 0
    finally:
        await nc.close()
