# SPDX-License-Identifier: Apache-2.0
"""The framed outbound writer against a real nats-server, and canaries for the nats-py internals
it relies on (they fail if a nats-py upgrade changes them)."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest
from nats import errors as nats_errors
from nats.aio.client import Client

from sie_sidecar.bus.outbound import FramedWriter, frame_pubs

from .conftest import NatsServer


def test_frame_pubs_is_the_nats_protocol() -> None:
    assert frame_pubs([("a.b", b"xy"), ("_INBOX.c", b"")]) == b"PUB a.b 2\r\nxy\r\nPUB _INBOX.c 0\r\n\r\n"


def test_nats_py_internals_are_still_there() -> None:
    assert FramedWriter.supported(Client())
    assert asyncio.iscoroutinefunction(Client._send_command)
    assert asyncio.iscoroutinefunction(Client._flush_pending)


async def test_send_command_still_appends_to_the_pending_buffer(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        before = nc._pending_data_size
        await nc._send_command(b"PUB canary 0\r\n\r\n")
        assert nc._pending_data_size in (before + 16, 0)  # appended (or already flushed out)
        await nc.flush()
    finally:
        await nc.close()


async def test_publish_many_delivers_every_message_in_order(nats_server: NatsServer, nc: Client) -> None:
    got: list[tuple[str, bytes]] = []
    done = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        got.append((msg.subject, msg.data))
        if len(got) == 300:
            done.set()

    await nc.subscribe("out.>", cb=on_msg)
    await nc.flush()
    writer = FramedWriter(nc)
    assert writer.framed
    messages = [(f"out.{i % 3}", f"payload {i}".encode() * (i % 5)) for i in range(300)]
    await writer.publish_many(messages)
    await nc.flush()
    await asyncio.wait_for(done.wait(), 10)
    assert got == messages


async def test_direct_writes_never_overtake_queued_commands(nats_server: NatsServer, nc: Client) -> None:
    """A buffer goes straight to the transport only while nothing waits in the client's pending list;
    with something queued (a publish whose flusher has not run yet) it queues behind it, so the
    server sees every message in the order it was handed over."""
    got: list[bytes] = []
    done = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        got.append(msg.data)
        if len(got) == 4:
            done.set()

    await nc.subscribe("ord", cb=on_msg)
    await nc.flush()
    writer = FramedWriter(nc)
    assert writer.direct
    await writer.publish_framed(frame_pubs([("ord", b"1")]), 1, 1)
    assert (writer.direct_writes, writer.queued_writes) == (1, 0)  # nothing was queued: straight out
    await nc.publish("ord", b"2")  # queued in nats-py's pending list; its flusher has not run yet
    assert nc._pending
    await writer.publish_framed(frame_pubs([("ord", b"3")]), 1, 1)
    assert (writer.direct_writes, writer.queued_writes) == (1, 1)  # behind "2", not before it
    await writer.publish_framed(frame_pubs([("ord", b"4")]), 1, 1)
    await nc.flush()
    await asyncio.wait_for(done.wait(), 10)
    assert got == [b"1", b"2", b"3", b"4"]


async def test_ack_many_acks_real_jetstream_messages(nats_server: NatsServer, nc: Client) -> None:
    js = nc.jetstream()
    await js.add_stream(name="ACKS", subjects=["acks.>"])
    for i in range(20):
        await js.publish(f"acks.{i}", b"x")
    sub = await js.pull_subscribe("acks.>", durable="d")
    msgs = await sub.fetch(20, timeout=5)
    await FramedWriter(nc).ack_many([m.reply for m in msgs])
    await nc.flush()
    for _ in range(50):
        info = await js.consumer_info("ACKS", "d")
        if info.num_ack_pending == 0:
            break
        await asyncio.sleep(0.05)
    assert (info.num_ack_pending, info.num_pending) == (0, 0)


async def test_refusals_match_publish(nats_server: NatsServer, nc: Client) -> None:
    writer = FramedWriter(nc)
    with pytest.raises(nats_errors.MaxPayloadError):
        await writer.publish_many([("big", b"x" * (nc.max_payload + 1))])
    with pytest.raises(nats_errors.BadSubjectError):
        await writer.publish_many([("", b"x")])


async def test_buffer_limit_while_disconnected_is_refused(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2, pending_size=1024)
    try:
        await nats_server.stop()
        for _ in range(100):
            if not nc.is_connected:
                break
            await asyncio.sleep(0.05)
        with pytest.raises(nats_errors.OutboundBufferLimitError):
            await FramedWriter(nc).publish_many([("x", b"y" * 2048)])
    finally:
        await nats_server.start()
        await nc.close()


async def test_falls_back_to_publish_without_the_internals() -> None:
    sent: list[tuple[str, bytes]] = []

    class Minimal:
        async def publish(self, subject: str, payload: bytes) -> None:
            sent.append((subject, payload))

    writer = FramedWriter(Minimal())
    assert not writer.framed
    await writer.publish_many([("a", b"1"), ("b", b"2")])
    assert sent == [("a", b"1"), ("b", b"2")]


async def test_the_publisher_flushes_only_for_chunked_transfers(nc: Client) -> None:
    """§6.2: chunks, then one flush as barrier, then the ACK; single replies go out without one."""
    from sie_sidecar.bus.publisher import Publisher
    from sie_sidecar.wire.types import Reply, WorkResult

    flushes = 0
    real_flush = nc.flush

    async def counting_flush(*args: Any, **kwargs: Any) -> None:
        nonlocal flushes
        flushes += 1
        await real_flush(*args, **kwargs)

    nc.flush = counting_flush  # type: ignore[method-assign]
    received: list[bytes] = []

    async def on_msg(msg: Any) -> None:
        received.append(msg.data)

    sub = await nc.subscribe("_INBOX.flushcheck.>", cb=on_msg)
    publisher = Publisher(nc)
    from sie_sidecar.telemetry import Registry

    publisher.telemetry = registry = Registry()

    def reply(i: int, size: int) -> Reply:
        result = WorkResult(
            work_item_id=f"w{i}", request_id="r", item_index=i, success=True, result_msgpack=b"x" * size
        )
        return Reply(subject=f"_INBOX.flushcheck.{i}", result=result, accepts_result_chunks=True)

    assert await publisher.publish_batch([reply(0, 10), reply(1, 10)]) == [True, True]
    assert flushes == 0
    big = nc.max_payload + 1000
    assert await publisher.publish_batch([reply(2, 10), reply(3, big)]) == [True, True]
    assert flushes == 1 and publisher.stats.chunked == 1
    await real_flush()
    await asyncio.sleep(0.1)
    assert len(received) >= 4  # two singles, a single and at least two chunks
    # §13: each reply counted once by mode and outcome, and the chunks that went out.
    assert registry.value("sie.worker.result.transport.attempts", (("mode", "single"), ("outcome", "published"))) == 3
    assert registry.value("sie.worker.result.transport.attempts", (("mode", "chunked"), ("outcome", "published"))) == 1
    assert registry.value("sie.worker.result.chunks.published") == publisher.stats.chunks >= 2
    await sub.unsubscribe()
