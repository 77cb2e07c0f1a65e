# SPDX-License-Identifier: Apache-2.0
"""The delivery budget is the customer's data (issue 9, laws 2-4): every item has 20 deliveries, and
no path may spend them in a moment. Each test is one way they were lost, against a real nats-server,
the real reference backend over a real Unix socket and the real sidecar."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path
from typing import Any

import msgpack
import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from sie_sidecar import wire
from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer
from sie_sidecar.bus.topology import TopologySpec, ensure_topology

from .conftest import NatsServer
from .stack import (
    BUNDLE,
    MAX_DELIVERIES_ADVISORY,
    MODEL,
    POOL,
    PROFILE,
    ROUTER,
    WORKER,
    Stack,
    running_stack,
    start_stack,
    work_item,
)


def answered_once(stack: Stack, ids: list[str]) -> bool:
    return all(len(stack.results_for(w)) == 1 for w in ids)


async def leftovers(stack: Stack, expected: int, timeout: float = 15.0) -> dict[str, int]:
    """Drain the pool durable with a plain consumer: work item id → deliveries so far (this one included)."""
    stream, durable = wire.pool_stream_name(POOL), wire.pool_durable_name(POOL, PROFILE, BUNDLE)
    sub = await stack.js.pull_subscribe_bind(durable, stream)
    got: dict[str, int] = {}
    deadline = asyncio.get_running_loop().time() + timeout
    while len(got) < expected and asyncio.get_running_loop().time() < deadline:
        try:
            msgs = await sub.fetch(64, timeout=1)
        except TimeoutError:
            continue
        for msg in msgs:
            got[msgpack.unpackb(msg.data)["work_item_id"]] = msg.metadata.num_delivered
            await msg.ack()
    await sub.unsubscribe()
    return got


async def test_batches_refused_as_draining_are_naked_with_the_base_delay(
    nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A backend restarting gracefully refuses batches with `draining` for seconds while its heartbeat
    still says ready (Ping's `ready` is health, not drain state). NAKed after 100 ms, every item was
    redelivered 20 times within 2 s and a third of them were never answered; with the base delay and
    the pull gate closed at the first refusal, each comes back a few times at most."""
    async with running_stack(nats_server, tmp_path, env={"SIE_NAK_DELAY_S": "1.0"}) as stack:
        assert stack.backend is not None
        warm = await stack.publish(work_item(text="warm"))  # the handshake is done and the gate is open
        await stack.wait_for(lambda: answered_once(stack, [warm]))
        stack.backend.drain_for(3.0)
        ids = [await stack.publish(work_item(text=f"t{i}")) for i in range(200)]
        await stack.wait_for(lambda: answered_once(stack, ids), timeout=20)
        await stack.settled_pool()
        assert answered_once(stack, ids) and stack.max_deliveries == []
        assert stack.adapter.items == len(ids) + 1
        refused = [r for r in caplog.records if r.getMessage() == "batch RPC refused"]
        assert 1 <= len(refused) <= 2  # one line per model per 10 s, however many batches were refused


async def test_nothing_is_pulled_while_the_backend_is_left_draining(
    nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A backend left draining by the previous sidecar's SIGTERM (its heartbeat says ready: it is
    healthy): the handshake's drain probe finds it refusing work, and the sidecar must not pull (it
    used to, NAKing 15,358 times in 5 minutes until every item was gone). The probe is an empty
    batch, so the backend sees no item while it drains."""
    caplog.set_level(logging.INFO, logger="sie_sidecar.pipeline.gate")
    sock = str(tmp_path / "backend.sock")
    backend = BackendServer(NullAdapter(dim=8, preloaded_models=[MODEL]), sock, worker_id="backend-0")
    await backend.start()
    backend.drain_for(None)
    try:
        async with running_stack(nats_server, tmp_path, external_backend=sock) as stack:
            ids = [await stack.publish(work_item(text=f"t{i}")) for i in range(30)]
            await asyncio.sleep(1.0)  # an observation window: nothing may be delivered in it
            info = await stack.pool_consumer()
            assert (info.delivered.consumer_seq, info.num_pending) == (0, len(ids))
            assert backend.refused_items == 0 and backend.method_calls["RunBatch"] >= 1  # probes only
            backend.undrain()
            await stack.wait_for(lambda: answered_once(stack, ids))
            await stack.settled_pool()
            assert (await stack.pool_consumer()).num_redelivered == 0
            gate = [r for r in caplog.records if r.getMessage().startswith(("not pulling:", "pulling:"))]
            assert [r.getMessage() for r in gate][-1] == "pulling: the backend is ready"
            assert sum(r.getMessage() == "pulling: the backend is ready" for r in gate) == 1
            assert any(getattr(r, "reason", "").startswith("backend draining") for r in gate)
    finally:
        await backend.close()


async def test_pulling_stops_while_the_backend_drains_and_resumes_after(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Mid-run drain (the heartbeat still says ready): the first batch refused as draining stops the
    pulling, what the sidecar buffered goes back with a delay, the drain probe of each heartbeat keeps
    the gate shut, and the work is taken again when the backend is back. Only what it held when the
    drain began is refused, once; without the gate every item was, each time its NAK delay ran out."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_delay_s=0.02)
    async with running_stack(nats_server, tmp_path, adapter=adapter, env={"SIE_NAK_DELAY_S": "0.5"}) as stack:
        backend = stack.backend
        assert backend is not None
        first = [await stack.publish(work_item(text=f"a{i}")) for i in range(50)]
        backend.drain_for(2.0)
        later = [await stack.publish(work_item(text=f"b{i}")) for i in range(100)]
        await stack.wait_for(lambda: answered_once(stack, first + later), timeout=20)
        await stack.settled_pool()
        assert stack.max_deliveries == []
        assert answered_once(stack, first + later)
        # Each refused item was refused once, and most items never: the gate stopped the pulling. (The
        # count itself is not bounded by `pull_loop_max_outstanding`: the pull-ahead follows the batch
        # budget, and one more pull round may land while the gate shuts.)
        assert max(backend.refusals.values(), default=0) == 1
        assert backend.refused_items == sum(backend.refusals.values()) < len(first + later)


async def test_work_arriving_during_shutdown_keeps_its_delivery_budget(nats_server: NatsServer, tmp_path: Path) -> None:
    """SIGTERM under load: the pull requests outstanding at `stop()` stay live on the server, which
    keeps delivering to them while the in-flight batch finishes. NAKed at once, each such message went
    straight back to the same request and bounced 20 times in 15 ms; now it comes back once they expired."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_delay_s=1.0)
    stack = await start_stack(nats_server, tmp_path, adapter=adapter, env={"SIE_NATS_PULL_EXPIRES_S": "2"})
    try:
        first = [await stack.publish(work_item(text=f"a{i}")) for i in range(5)]
        await stack.wait_for(lambda: adapter.batches >= 1)
        stack.stop.set()  # what SIGTERM does
        late = [await stack.publish(work_item(text=f"b{i}")) for i in range(20)]
        assert await asyncio.wait_for(stack.task, 30) == 0
        answered = {r["work_item_id"] for r in stack.replies}
        assert len(answered) == len(stack.replies)  # never two replies for one item
        left = await leftovers(stack, len(first) + len(late) - len(answered))
        assert answered | set(left) == set(first + late)
        assert stack.max_deliveries == []
        assert max(left.values()) <= 2  # at most one delivery to the sidecar, plus ours
    finally:
        if stack.backend is not None:
            await stack.backend.close()
        await stack.nc.close()


async def test_costly_items_are_not_starved_past_ack_wait(nats_server: NatsServer, tmp_path: Path) -> None:
    """A burst longer than ack_wait at a slow backend: the cost-ascending packing passed the costliest
    items over until JetStream redelivered them and they ran twice. Now no item waits past the bound
    and everything held is progress-ACKed, so there is no duplicate and no redelivery."""
    # The operator's pool durable has a 2 s ack_wait; the sidecar leaves it and adapts to it.
    js_spec = TopologySpec(pool=POOL, machine_profile=PROFILE, bundle=BUNDLE, worker_id=WORKER)
    admin = await nats.connect(nats_server.url)
    try:
        js = admin.jetstream()
        await ensure_topology(js, js_spec)
        info = await js.consumer_info(js_spec.pool_stream, js_spec.pool_durable)
        config: ConsumerConfig = info.config
        config.ack_wait = 2.0
        assert config.ack_policy == AckPolicy.EXPLICIT
        await js.add_consumer(js_spec.pool_stream, config=config)
    finally:
        await admin.close()
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_delay_s=0.15)
    env = {
        "SIE_BATCHER_MAX_BATCH_REQUESTS": "4",
        "SIE_PULL_LOOP_MAX_OUTSTANDING": "200",
        "SIE_NATS_FETCH_BUDGET": "200",
    }
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
        rng = random.Random(9)
        ids = []
        for i in range(200):
            docs = [{"text": f"d{j}", "id": f"d{j}"} for j in range(rng.choice((1, 1, 1, 2, 8)))]
            ids.append(
                await stack.publish(
                    work_item(operation="score", item=None, query_item={"text": f"q{i}"}, score_items=docs)
                )
            )
        await stack.wait_for(lambda: all(stack.results_for(w) for w in ids), timeout=40)
        await stack.settled_pool(timeout=10)
        counts: dict[str, int] = {}
        for r in stack.replies:
            counts[r["work_item_id"]] = counts.get(r["work_item_id"], 0) + 1
        assert {w: n for w, n in counts.items() if n > 1} == {}
        assert (await stack.pool_consumer()).num_redelivered == 0


async def test_chaos_sidecar_restart_and_backend_drain_under_load(nats_server: NatsServer, tmp_path: Path) -> None:
    """Under steady load: SIGTERM the sidecar (it drains the backend on the way out), start a new one
    against the backend left draining, bring the backend back, then drain it again for a while.
    Every item is answered exactly once, none runs out of deliveries, within a bounded time. The
    backend keeps the drain after the sidecar has gone, as v0.7.1's does (`--keep-drain`)."""
    sock = str(tmp_path / "backend.sock")
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_delay_s=0.02)
    backend = BackendServer(adapter, sock, worker_id="b-0", release_drain_on_disconnect=False)
    await backend.start()
    gateway = await nats.connect(nats_server.url)
    replies: dict[str, int] = {}
    exhausted: list[bytes] = []

    async def on_reply(msg: Any) -> None:
        wid = msgpack.unpackb(msg.data)["work_item_id"]
        replies[wid] = replies.get(wid, 0) + 1

    async def on_advisory(msg: Any) -> None:
        exhausted.append(msg.data)

    await gateway.subscribe(f"_INBOX.{ROUTER}.>", cb=on_reply)
    await gateway.subscribe(f"{MAX_DELIVERIES_ADVISORY}.>", cb=on_advisory)
    env = {"SIE_NAK_DELAY_S": "0.5", "SIE_NATS_PULL_EXPIRES_S": "1"}
    ids: list[str] = []
    loop = asyncio.get_running_loop()
    started = loop.time()
    first = await start_stack(nats_server, tmp_path, env=env, external_backend=sock)
    second: Stack | None = None
    js = gateway.jetstream()
    subject = wire.pool_work_subject(POOL, PROFILE, BUNDLE, MODEL)

    async def produce() -> None:
        for i in range(400):  # 100 items/s for 4 s
            item = work_item(text=f"t{i}")
            await js.publish(subject, msgpack.packb(item))
            ids.append(item["work_item_id"])
            await asyncio.sleep(0.01)

    producer = asyncio.create_task(produce())
    try:
        await asyncio.sleep(1.0)
        first.stop.set()  # SIGTERM under load; on the way out it sends the backend Drain
        assert await asyncio.wait_for(first.task, 30) == 0
        assert backend.draining
        second = await start_stack(nats_server, tmp_path, env=env, external_backend=sock)
        await asyncio.sleep(0.5)
        # The heartbeat says ready (the backend is healthy); the handshake's drain probe keeps the gate shut.
        assert backend.refused_items == 0  # the new sidecar sent nothing to the backend left draining
        backend.undrain()  # the backend restarted
        await asyncio.sleep(1.0)
        backend.drain_for(1.0)  # and restarts gracefully once more, mid-run
        await producer
        # Only what the sidecar held when the drain began was refused (once); then it stopped pulling.
        assert max(backend.refusals.values(), default=0) <= 1
        assert backend.refused_items == sum(backend.refusals.values()) < len(ids)
        await second.wait_for(lambda: all(w in replies for w in ids), timeout=40)
        await second.settled_pool()
        assert {w: n for w, n in replies.items() if n != 1} == {}
        assert set(replies) == set(ids) and exhausted == []
        assert loop.time() - started < 60
    finally:
        producer.cancel()
        for stack in (first, second):
            if stack is not None:
                if not stack.task.done():
                    stack.stop.set()
                    await asyncio.wait_for(stack.task, 30)
                await stack.nc.close()
        await gateway.close()
        await backend.close()


async def test_a_sidecar_restarted_alone_finds_the_backend_taking_work(nats_server: NatsServer, tmp_path: Path) -> None:
    """A sidecar container restarted alone (SIGTERM: it drains the backend on the way out) must not
    leave the pod idle: our backend ends a Drain once its sidecar has closed every connection, so
    the next sidecar is served (before, 83,929 of the chaos rig's 100,000 items stayed unserved)."""
    sock = str(tmp_path / "backend.sock")
    backend = BackendServer(NullAdapter(dim=8, preloaded_models=[MODEL]), sock, worker_id="b-0")
    await backend.start()
    try:
        async with running_stack(nats_server, tmp_path, external_backend=sock) as stack:
            ids = [await stack.publish(work_item(text=f"a{i}")) for i in range(20)]
            await stack.wait_for(lambda: answered_once(stack, ids))
        assert backend.method_calls["Drain"] >= 1  # the SIGTERM path drained it
        async with asyncio.timeout(5):
            while backend.draining:
                await asyncio.sleep(0.01)
        async with running_stack(nats_server, tmp_path, external_backend=sock) as stack:
            ids = [await stack.publish(work_item(text=f"b{i}")) for i in range(20)]
            await stack.wait_for(lambda: answered_once(stack, ids))
            await stack.settled_pool()
            assert backend.refused_items == 0 and (await stack.pool_consumer()).num_redelivered == 0
    finally:
        await backend.close()


async def test_a_backend_batch_budget_below_the_fetch_budget_does_not_bounce_work(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """The group of one pull is cut at the backend's batch budget and the rest NAKed after 100 ms
    (§4.2); with a budget of 2 under a fetch budget of 64, most of every pull went straight back, over
    and over. Once the budget is known, pulls are no larger than it: only the first pull overflows."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_budget=2)
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        ids = [await stack.publish(work_item(text=f"t{i}")) for i in range(300)]
        await stack.wait_for(lambda: answered_once(stack, ids), timeout=30)
        await stack.settled_pool()
        info = await stack.pool_consumer()
        assert info.delivered.consumer_seq - len(ids) <= stack.settings.nats_fetch_budget  # redeliveries
        assert stack.max_deliveries == []
