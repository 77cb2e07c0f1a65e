# SPDX-License-Identifier: Apache-2.0
"""Confirmed ACKs (`bus.ack_confirm`) against real nats-servers: the server property they rest on (a
replicated consumer answers an ACK only once a quorum holds it), ACKs lost with a durable's leader
re-sent to the next leader so that nothing is delivered again, re-sends that give up at ack_wait,
and the sidecar wired with them (its `/debug/state`)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest
from benches.chaos.cluster import NatsCluster, Node
from nats.aio.client import Client

from sie_sidecar.bus import ack_confirm
from sie_sidecar.bus.ack_confirm import AckConfirmer, ask_last_ack
from sie_sidecar.bus.direct import DirectQueue
from sie_sidecar.bus.outbound import FramedWriter, frame_pubs

from .conftest import NatsServer
from .stack import Stack, running_stack, work_item

STREAM = "CONFIRM"
DURABLE = "workers"
ACK_WAIT_S = 10.0
API_TIMEOUT_S = 10.0


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[NatsCluster]:
    rig = NatsCluster(tmp_path)
    await rig.start()
    try:
        nc = await nats.connect(servers=rig.urls)
        try:
            await rig.wait_jetstream(nc)
            js = nc.jetstream(timeout=API_TIMEOUT_S)
            await js.add_stream(
                name=STREAM, subjects=[f"{STREAM}.>"], num_replicas=3, storage="file", retention="workqueue"
            )
            await js.add_consumer(
                STREAM, durable_name=DURABLE, ack_policy="explicit", num_replicas=3, ack_wait=ACK_WAIT_S
            )
            for i in range(4):
                await js.publish(f"{STREAM}.work", b"item-%d" % i)
            assert await rig.wait_replicas_current(nc, STREAM)
        finally:
            await nc.close()
        yield rig
    finally:
        rig.stop()


async def _consumer_leader(rig: NatsCluster, nc: Client) -> Node:
    reply = await nc.request(f"$JS.API.CONSUMER.INFO.{STREAM}.{DURABLE}", b"", timeout=API_TIMEOUT_S)
    return rig.node_named(json.loads(reply.data)["cluster"]["leader"])


async def _new_leader(rig: NatsCluster, nc: Client, candidates: list[Node], timeout: float = 30.0) -> Node:
    """The durable's next leader, once one of `candidates` has been elected."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            leader = await _consumer_leader(rig, nc)
            if leader in candidates:
                return leader
        except (TimeoutError, nats.errors.Error, KeyError):
            pass  # no leader yet: the API has no responder, or answers without one
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("no new leader for the durable")
        await asyncio.sleep(0.1)


async def _fetch(nc: Client, n: int, timeout: float) -> list[Any]:
    sub = await nc.jetstream(timeout=API_TIMEOUT_S).pull_subscribe_bind(DURABLE, STREAM)
    try:
        return list(await sub.fetch(n, timeout=timeout))
    except TimeoutError:  # nats-py raises its own subclass or, from `_fetch_n`'s wait, the builtin one
        return []
    finally:
        await sub.unsubscribe()


async def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(0.02)


async def test_a_replicated_consumer_answers_an_ack_only_once_a_quorum_holds_it(cluster: NatsCluster) -> None:
    """What confirmation means: with both followers paused the leader cannot commit, and says nothing."""
    probe = await nats.connect(servers=cluster.urls)
    leader = await _consumer_leader(cluster, probe)
    await probe.close()
    nc = await nats.connect(servers=[leader.url])
    followers = [n for n in cluster.nodes if n is not leader]
    try:
        first, second = await _fetch(nc, 2, 5)
        assert (await nc.request(first.reply, b"+ACK", timeout=5)) is not None  # healthy: answered
        for node in followers:
            cluster.pause(node)
        answer = asyncio.ensure_future(nc.request(second.reply, b"+ACK", timeout=20))
        await asyncio.sleep(2.0)
        assert not answer.done()  # no quorum, no answer
        for node in followers:
            cluster.resume(node)
        await asyncio.wait_for(answer, 20)
    finally:
        for node in followers:
            cluster.resume(node)
        await nc.close()


async def _lose_acks_with_the_leader(cluster: NatsCluster, *, confirm: bool) -> tuple[list[Any], AckConfirmer | None]:
    """Fetch every item through a sidecar-like client connected to a follower, freeze the durable's
    leader, ACK (the follower forwards the ACKs into the frozen leader's route, unread), kill the
    leader: no server that survives saw them. Returns what the next leader delivers again within
    1.5 ack_waits."""
    probe = await nats.connect(servers=cluster.urls)
    leader = await _consumer_leader(cluster, probe)
    await probe.close()
    others = [n for n in cluster.nodes if n is not leader]
    worker = await nats.connect(servers=[others[0].url], dont_randomize=True)
    writer = FramedWriter(worker)
    confirmer = AckConfirmer(worker, writer, timeout_s=0.5, ack_wait_s=ACK_WAIT_S) if confirm else None
    try:
        if confirmer is not None:
            await confirmer.start()
        msgs = await _fetch(worker, 4, 5)
        assert len(msgs) == 4
        await asyncio.sleep(0.5)  # the deliveries replicate while the quorum is whole
        cluster.pause(leader)
        subjects = [m.reply for m in msgs]
        if confirmer is not None:
            await confirmer.ack_many(subjects)
        else:
            await writer.ack_many(subjects)
        await worker.flush(timeout=5)  # the follower has read them and routed them to the frozen leader
        await asyncio.sleep(0.3)
        cluster.kill(leader)
        if confirmer is not None:
            await _until(lambda: confirmer.pending == 0, ACK_WAIT_S, "the re-sent ACKs confirmed by the next leader")
        observer = await nats.connect(servers=[n.url for n in others])
        try:
            await _new_leader(cluster, observer, others)
            again = await _fetch(observer, 4, ACK_WAIT_S * 1.5)
        finally:
            await observer.close()
        return again, confirmer
    finally:
        if confirmer is not None:
            await confirmer.close(0)
        await worker.close()


async def test_plain_acks_lost_with_the_durables_leader_are_delivered_again(cluster: NatsCluster) -> None:
    """The duplicates the chaos rig counted at a durable failover, reproduced: without confirmation."""
    again, _ = await _lose_acks_with_the_leader(cluster, confirm=False)
    assert sorted(m.data for m in again) == [b"item-%d" % i for i in range(4)]


async def test_confirmed_acks_lost_with_the_durables_leader_are_sent_again_and_nothing_is_redelivered(
    cluster: NatsCluster,
) -> None:
    again, confirmer = await _lose_acks_with_the_leader(cluster, confirm=True)
    assert confirmer is not None
    assert again == []
    assert confirmer.counts.resent >= 1 and confirmer.counts.confirmed == 1
    assert confirmer.counts.expired == confirmer.counts.abandoned == 0


async def test_a_batch_is_confirmed_by_one_answer(nats_server: NatsServer) -> None:
    nc = await nats.connect(servers=[nats_server.url])
    try:
        js = nc.jetstream(timeout=API_TIMEOUT_S)
        await js.add_stream(name=STREAM, subjects=[f"{STREAM}.>"], retention="workqueue")
        await js.add_consumer(STREAM, durable_name=DURABLE, ack_policy="explicit", ack_wait=30)
        for i in range(10):
            await js.publish(f"{STREAM}.work", b"%d" % i)
        confirmer = AckConfirmer(nc, FramedWriter(nc), timeout_s=2.0, ack_wait_s=30)
        await confirmer.start()
        # The answers are handed over by nats-py's reader (no task per answer): issue 30.
        assert isinstance(confirmer._sub._pending_queue, DirectQueue)
        msgs = await _fetch(nc, 10, 5)
        await confirmer.ack_many([m.reply for m in msgs[:6]])
        await confirmer.ack_many([m.reply for m in msgs[6:]])
        await _until(lambda: confirmer.pending == 0, 5, "both batches answered")
        assert confirmer.snapshot() == {
            "timeout_s": 2.0,
            "pending": 0,
            "batches": 2,
            "confirmed": 2,
            "resent": 0,
            "expired": 0,
            "abandoned": 0,
            "overflowed": 0,
            "unheard": 0,
        }
        info = await js.consumer_info(STREAM, DURABLE)
        assert info.num_ack_pending == 0 and info.num_pending == 0
        await confirmer.close()
    finally:
        await nc.close()


async def test_unanswered_acks_are_resent_backing_off_and_given_up_at_ack_wait(nats_server: NatsServer) -> None:
    """An ACK subject nobody answers (no such consumer): re-sent at 0.2, 0.6, 1.4 s... then given up."""
    nc = await nats.connect(servers=[nats_server.url])
    seen: list[float] = []
    loop = asyncio.get_running_loop()

    async def count(msg: Any) -> None:
        seen.append(loop.time())

    try:
        await nc.subscribe("$JS.ACK.NOPE.x.1.1.1.0.0", cb=count)  # hears the ACKs, never answers
        confirmer = AckConfirmer(nc, FramedWriter(nc), timeout_s=0.2, ack_wait_s=2.0)
        await confirmer.start()
        await confirmer.ack_many(["$JS.ACK.NOPE.x.1.1.1.0.0"])
        await _until(lambda: confirmer.counts.expired == 1, 10, "given up")
        assert confirmer.pending == 0 and confirmer.counts.confirmed == 0
        assert confirmer.counts.resent == 3  # due at 0.2, 0.6, 1.4 s; at 3.0 s past the 2 s ack_wait
        await nc.flush()
        gaps = [b - a for a, b in itertools.pairwise(seen)]
        assert len(seen) == 4 and all(g2 > g1 for g1, g2 in itertools.pairwise(gaps))  # backing off
        await confirmer.close()
    finally:
        await nc.close()


async def _debug_state(stack: Stack) -> dict[str, Any]:
    url = f"http://127.0.0.1:{stack.settings.worker_probe_port}/debug/state"
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        assert r.status == 200
        state: dict[str, Any] = await r.json()
        return state


@pytest.mark.parametrize("confirm_s", ["2", "0"])
async def test_the_sidecar_confirms_each_batchs_acks_unless_turned_off(
    nats_server: NatsServer, tmp_path: Path, confirm_s: str
) -> None:
    env = {"SIE_SIDECAR_DEBUG_ENDPOINT": "1", "SIE_NATS_ACK_CONFIRM_S": confirm_s}
    async with running_stack(nats_server, tmp_path, env=env) as stack:
        ids = [await stack.publish(work_item(text=f"text {i}")) for i in range(20)]
        await stack.wait_for(lambda: all(len(stack.results_for(wid)) == 1 for wid in ids))
        await stack.settled_pool()  # every ACK taken, confirmed or not
        if confirm_s == "0":
            assert (await _debug_state(stack))["ack_confirm"] is None
            return
        deadline = asyncio.get_running_loop().time() + 10
        while (state := (await _debug_state(stack))["ack_confirm"])["pending"]:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        assert state["timeout_s"] == 2.0 and state["batches"] >= 1
        assert state["confirmed"] == state["batches"] and state["resent"] == state["expired"] == 0


async def test_batches_owed_past_the_bound_are_given_up_oldest_first(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that keeps the connection but never answers cannot grow what the sidecar holds."""
    monkeypatch.setattr(ack_confirm, "MAX_PENDING_BATCHES", 2)
    nc = await nats.connect(servers=[nats_server.url])
    try:
        confirmer = AckConfirmer(nc, FramedWriter(nc), timeout_s=30, ack_wait_s=60)
        await confirmer.start()
        for i in range(5):
            await confirmer.ack_many([f"$JS.ACK.NOPE.x.1.{i}.{i}.0.0"])
        assert confirmer.pending == 2 and confirmer.counts.overflowed == 3
        owed = [batch.subjects for batch in confirmer._pending.values()]
        assert owed == [["$JS.ACK.NOPE.x.1.3.3.0.0"], ["$JS.ACK.NOPE.x.1.4.4.0.0"]]
        await confirmer.close(0)
    finally:
        await nc.close()


@dataclass
class _Held:
    """What `AckConfirmer.ask` reads of a delivery: its message (the ACK subject is `msg.reply`)."""

    msg: Any


async def test_acks_whose_replies_may_have_died_with_the_connection_are_not_sent_again(cluster: NatsCluster) -> None:
    """The sidecar's own node freezes and dies with a batch's replies and ACKs unread in its socket;
    the client reconnects elsewhere. ACKing again there would settle items whose replies never
    left (lost: the first version did so), so the batch is abandoned and JetStream redelivers it."""
    probe = await nats.connect(servers=cluster.urls)
    leader = await _consumer_leader(cluster, probe)
    await probe.close()
    doomed = next(n for n in cluster.nodes if n is not leader)
    others = [n for n in cluster.nodes if n is not doomed]
    replies: list[bytes] = []
    gateway = await nats.connect(servers=[leader.url])

    async def on_reply(msg: Any) -> None:
        replies.append(msg.data)

    await gateway.subscribe("replies.>", cb=on_reply)
    await gateway.flush()
    worker = await nats.connect(
        servers=[doomed.url, *(n.url for n in others)], dont_randomize=True, ping_interval=0.3, max_outstanding_pings=2
    )
    confirmer = AckConfirmer(worker, FramedWriter(worker), timeout_s=0.5, ack_wait_s=ACK_WAIT_S)
    try:
        await confirmer.start()
        msgs = await _fetch(worker, 4, 5)
        assert len(msgs) == 4
        await asyncio.sleep(0.5)  # the deliveries replicate
        cluster.pause(doomed)
        held = [_Held(m) for m in msgs]
        framed = frame_pubs(
            [*((f"replies.{i}", m.data) for i, m in enumerate(msgs)), *((m.reply, b"+ACK") for m in msgs)]
        )
        reply = confirmer.reserve()
        buffer = ask_last_ack(framed, msgs[-1].reply, reply)  # the last ACK asks, as the framer writes it
        assert buffer is not None
        await FramedWriter(worker).publish_framed(buffer, 8, sum(len(m.data) for m in msgs) + 16)
        confirmer.owe_reply(reply, held)
        await asyncio.sleep(0.3)  # into the frozen server's socket
        cluster.kill(doomed)
        await _until(lambda: confirmer.pending == 0, ACK_WAIT_S, "the batch abandoned once the client moved on")
        assert confirmer.counts.abandoned == 1 and confirmer.counts.resent == 0 and confirmer.counts.confirmed == 0
        observer = await nats.connect(servers=[n.url for n in others])
        try:
            again = await _fetch(observer, 4, ACK_WAIT_S * 1.5)
        finally:
            await observer.close()
        assert replies == []  # they died with the node
        assert sorted(m.data for m in again) == [b"item-%d" % i for i in range(4)]  # so nothing is lost
    finally:
        await confirmer.close(0)
        await worker.close()
        await gateway.close()
