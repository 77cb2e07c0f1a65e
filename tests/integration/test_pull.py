# SPDX-License-Identifier: Apache-2.0
"""PullConsumer against a real nats-server: exactly-once flow, the outstanding cap, NAK delays, coalescing,
408 expiry cycles, 409 recovery, the silence watchdog and recovery from a nats-server restart."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js import api as js_api

from sie_sidecar.bus.attempts import observe_pulls
from sie_sidecar.bus.direct import DirectQueue, direct_delivery_supported
from sie_sidecar.bus.outbound import FramedWriter
from sie_sidecar.bus.pull import PullConsumer
from sie_sidecar.bus.topology import TopologySpec, ensure_topology, reconcile_forever
from sie_sidecar.telemetry import NATS_OPERATIONS, Registry
from sie_sidecar.wire._switch import USING_NATIVE

from .conftest import NatsServer

SPEC = TopologySpec(pool="default", machine_profile="rtx6000", bundle="sglang", worker_id="pod-0.svc")
SUBJECT = "sie.work.default.rtx6000.sglang.BAAI__bge-m3"


async def _publish(nc: Client, n: int, start: int = 0) -> None:
    """Core publishes (fast), then a flush; the stream stores them without per-message acks."""
    for i in range(start, start + n):
        await nc.publish(SUBJECT, str(i).encode())
    await nc.flush()


async def _wait_stored(js: JetStreamContext, n: int, timeout: float = 10.0) -> None:
    await _eventually(lambda: _stream_has(js, n), timeout)


async def _stream_has(js: JetStreamContext, n: int) -> bool:
    return (await js.stream_info(SPEC.pool_stream)).state.messages >= n


async def _eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def _consumer(nc: Client, **kwargs: Any) -> AsyncIterator[PullConsumer]:
    consumer = PullConsumer(nc, SPEC.pool_stream, SPEC.pool_durable, **kwargs)
    await consumer.start()
    try:
        yield consumer
    finally:
        await consumer.stop()


async def _drain(
    consumer: PullConsumer, seen: dict[int, Msg], until: int, timeout: float, quantum_s: float = 0.005
) -> None:
    """Take batches, ACK and settle them until `seen` holds `until` distinct stream sequences."""

    async def run() -> None:
        while len(seen) < until:
            batch = await consumer.next_batch(64, quantum_s)
            for msg in batch:
                seen[msg.metadata.sequence.stream] = msg
                await msg.ack()
            consumer.settled(len(batch))

    await asyncio.wait_for(run(), timeout)


@pytest.mark.parametrize(
    ("direct", "framed_requests"),
    [(True, True), (True, False), (False, False)],
    ids=["direct-framed", "direct", "callback"],
)
async def test_5000_messages_delivered_exactly_once_within_the_cap(
    nc: Client, direct: bool, framed_requests: bool
) -> None:
    """Both delivery paths: straight from nats-py's reader (default) and the callback fallback; pull
    requests through the connection's framed writer (as the app wires it) or `nc.publish`."""
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    total, cap = 5000, 64
    await _publish(nc, total)
    await _wait_stored(js, total)

    delivered: list[int] = []
    payloads: set[bytes] = set()
    max_seen_unsettled = 0
    in_flight: set[asyncio.Task[None]] = set()

    writer = FramedWriter(nc) if framed_requests else None
    async with _consumer(nc, batch=64, expires_s=2.0, max_outstanding=cap, direct=direct, writer=writer) as consumer:
        assert isinstance(consumer._sub._pending_queue, DirectQueue) is direct  # type: ignore[union-attr]

        async def handle(batch: list[Msg]) -> None:
            # Hold the batch briefly, as a dispatcher would, so the unsettled count presses on the cap.
            await asyncio.sleep(0.002)
            for msg in batch:
                await msg.ack()
            consumer.settled(len(batch))

        async def run() -> None:
            nonlocal max_seen_unsettled
            while len(delivered) < total:
                batch = await consumer.next_batch(32, 0.002)
                max_seen_unsettled = max(max_seen_unsettled, consumer.unsettled)
                assert consumer.unsettled + consumer.credit <= cap
                for msg in batch:
                    assert msg.metadata.num_delivered == 1
                    delivered.append(msg.metadata.sequence.stream)
                    payloads.add(msg.data)
                task = asyncio.create_task(handle(batch))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)

        await asyncio.wait_for(run(), 30)
        await asyncio.gather(*in_flight)
        assert consumer.high_water <= cap  # recorded in the subscription callback, at every delivery
        assert consumer.high_water > cap // 2  # the slow handler really pressed on the cap
        assert max_seen_unsettled <= cap
        assert consumer.stats.excess == 0
        assert consumer.stats.resets == 0
        assert consumer.unsettled == 0
        if direct:  # most deliveries took the Cython fast path, not nats-py's parser
            assert consumer._fast is not None and consumer._fast.messages > total // 2
        if writer is not None:  # every request went out through the writer, most straight to the socket
            assert writer.direct_writes + writer.queued_writes == consumer.stats.requests
            assert writer.direct_writes > 0

    assert len(delivered) == total
    assert len(set(delivered)) == total  # no duplicates
    assert payloads == {str(i).encode() for i in range(total)}
    await nc.flush()
    await _eventually(lambda: _stream_has_exactly(js, 0), 5)
    info = await js.consumer_info(SPEC.pool_stream, SPEC.pool_durable)
    assert info.num_ack_pending == 0
    assert info.num_redelivered == 0


async def _stream_has_exactly(js: JetStreamContext, n: int) -> bool:
    return (await js.stream_info(SPEC.pool_stream)).state.messages == n


async def test_outstanding_cap_holds_until_settled(nc: Client) -> None:
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    await _publish(nc, 50)
    await _wait_stored(js, 50)
    async with _consumer(nc, batch=64, expires_s=1.0, max_outstanding=10) as consumer:
        held: list[Msg] = []
        while len(held) < 10:
            held += await asyncio.wait_for(consumer.next_batch(64, 0.01), 5)
        assert len(held) == 10
        # No capacity left: nothing more arrives even across a request expiry.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(consumer.next_batch(64, 0.01), 1.5)
        assert (consumer.unsettled, consumer.credit, consumer.buffered) == (10, 0, 0)
        assert (await js.consumer_info(SPEC.pool_stream, SPEC.pool_durable)).num_ack_pending == 10

        for msg in held[:5]:
            await msg.ack()
        consumer.settled(5)
        more: list[Msg] = []
        while len(more) < 5:
            more += await asyncio.wait_for(consumer.next_batch(64, 0.01), 5)
        assert len(more) == 5
        assert consumer.unsettled == 10
        assert consumer.high_water == 10

        rest: dict[int, Msg] = {m.metadata.sequence.stream: m for m in held[5:] + more}
        for msg in rest.values():
            await msg.ack()
        consumer.settled(len(rest))
        await _drain(consumer, rest, until=45, timeout=10)
        assert consumer.high_water == 10
        assert consumer.stats.excess == 0


async def test_nak_with_delay_redelivers_later(nc: Client) -> None:
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    await _publish(nc, 1)
    async with _consumer(nc, batch=8, expires_s=1.0, max_outstanding=8) as consumer:
        [first] = await asyncio.wait_for(consumer.next_batch(8, 0), 5)
        loop = asyncio.get_running_loop()
        naked_at = loop.time()
        await first.nak(delay=0.5)
        consumer.settled(1)
        [again] = await asyncio.wait_for(consumer.next_batch(8, 0), 5)
        waited = loop.time() - naked_at
        assert again.metadata.sequence.stream == first.metadata.sequence.stream
        assert again.metadata.num_delivered == 2
        assert waited >= 0.4  # the server honoured the delay rather than redelivering at once
        await again.ack()
        consumer.settled(1)


async def test_coalescing_returns_multi_message_batches(nc: Client) -> None:
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    await _publish(nc, 100)
    await _wait_stored(js, 100)
    async with _consumer(nc, batch=64, expires_s=1.0, max_outstanding=64) as consumer:
        first = await asyncio.wait_for(consumer.next_batch(10, 0.05), 5)
        assert len(first) == 10  # capped by max_messages
        second = await asyncio.wait_for(consumer.next_batch(64, 0.05), 5)
        assert len(second) > 1
        for msg in first + second:
            await msg.ack()
        consumer.settled(len(first) + len(second))
        await _drain(consumer, {}, until=100 - len(first) - len(second), timeout=5)

        # A trickle: five messages 20 ms apart are coalesced into one batch within the quantum.
        async def trickle() -> None:
            for i in range(5):
                await nc.publish(SUBJECT, f"t{i}".encode())
                await nc.flush()
                await asyncio.sleep(0.02)

        producer = asyncio.create_task(trickle())
        batch = await asyncio.wait_for(consumer.next_batch(5, 2.0), 5)
        await producer
        assert [m.data for m in batch] == [f"t{i}".encode() for i in range(5)]
        for msg in batch:
            await msg.ack()
        consumer.settled(5)


async def test_a_trickle_short_of_a_full_batch_is_all_taken_at_the_quantum(nc: Client) -> None:
    """While coalescing, deliveries that cannot fill the batch do not wake it (issue 30); at the end of
    the quantum every one buffered meanwhile is in the batch, none left behind for the next."""
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    async with _consumer(nc, batch=64, expires_s=1.0, max_outstanding=64) as consumer:
        await asyncio.sleep(0.1)  # the first pull request is out

        async def trickle() -> None:
            for i in range(6):
                await nc.publish(SUBJECT, f"t{i}".encode())
                await nc.flush()
                await asyncio.sleep(0.02)

        producer = asyncio.create_task(trickle())
        # A quantum well past the trickle (~0.1 s here; a loaded CI host may take several times that).
        batch = await asyncio.wait_for(consumer.next_batch(64, 2.0), 10)
        await producer
        assert [m.data for m in batch] == [f"t{i}".encode() for i in range(6)]
        assert not consumer._buffer
        for msg in batch:
            await msg.ack()
        consumer.settled(len(batch))


async def test_a_settle_tops_the_credit_up_at_once_without_the_pump(nc: Client) -> None:
    """With the connection's framed writer, the settle that frees room sends the next pull request
    itself (no task wake-up per batch); the pump is not kicked for it."""
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    await _publish(nc, 64)
    await _wait_stored(js, 64)
    writer = FramedWriter(nc)
    async with _consumer(nc, batch=64, expires_s=2.0, max_outstanding=64, writer=writer) as consumer:
        batch = await asyncio.wait_for(consumer.next_batch(64, 0.5), 5)
        assert len(batch) == 64 and consumer.credit == 0
        for msg in batch:
            await msg.ack()
        await nc.flush()  # nothing queued in the client: the request may overtake nothing
        requests, writes = consumer.stats.requests, writer.direct_writes
        consumer._kick.clear()
        consumer.settled(64)
        assert consumer.stats.requests == requests + 1  # sent within the call
        assert writer.direct_writes == writes + 1
        assert consumer.credit == 64
        assert not consumer._kick.is_set()


async def test_nats_py_keeps_the_internals_direct_delivery_replaces(nc: Client) -> None:
    """Canary: a nats-py upgrade that drops `Subscription._pending_queue` / `_pending_size` fails here
    (the consumer would fall back to callbacks, correct but slower)."""
    sub = await nc.subscribe("canary.direct")
    try:
        assert direct_delivery_supported(sub)
    finally:
        await sub.unsubscribe()


async def test_stop_early_ends_coalescing_at_once_and_on_wake(nc: Client) -> None:
    """The idle bypass: an idle worker takes the first message without waiting out the quantum, and
    a busy one stops coalescing as soon as `wake()` reports that it went idle."""
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    async with _consumer(nc, batch=64, expires_s=1.0, max_outstanding=64) as consumer:
        loop = asyncio.get_running_loop()
        await _publish(nc, 1)
        started = loop.time()
        batch = await asyncio.wait_for(consumer.next_batch(64, 5.0, lambda: True), 5)
        assert len(batch) == 1 and loop.time() - started < 1.0  # not the 5 s quantum

        busy = True
        await _publish(nc, 1, start=1)
        started = loop.time()

        async def go_idle() -> None:
            nonlocal busy
            await asyncio.sleep(0.2)
            busy = False
            consumer.wake()

        idler = asyncio.create_task(go_idle())
        second = await asyncio.wait_for(consumer.next_batch(64, 5.0, lambda: not busy), 5)
        await idler
        assert len(second) == 1 and 0.15 < loop.time() - started < 1.0  # waited while busy, not longer
        for msg in batch + second:
            await msg.ack()
        consumer.settled(2)


async def test_request_expiry_keeps_the_pull_alive(nc: Client) -> None:
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    async with _consumer(nc, batch=16, expires_s=1.0, max_outstanding=16) as consumer:
        await asyncio.sleep(3.6)  # several expiry periods with no traffic
        assert consumer.stats.timeouts >= 2  # 408s freed the credit ...
        assert consumer.stats.requests >= 3  # ... and it was re-issued each time
        assert consumer.stats.heartbeats >= 2
        assert consumer.stats.resets == 0  # heartbeats kept the watchdog quiet
        await _eventually(lambda: _async_true(consumer.credit == 16), 2)  # topped up again after each 408
        await _publish(nc, 3)
        got: dict[int, Msg] = {}
        await _drain(consumer, got, until=3, timeout=2)
        assert len(got) == 3


async def test_deleted_consumer_409_then_recovery(nc: Client) -> None:
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    async with _consumer(nc, batch=16, expires_s=1.0, max_outstanding=16) as consumer:
        await _eventually(lambda: _waiting(js))
        await js.delete_consumer(SPEC.pool_stream, SPEC.pool_durable)
        await _eventually(lambda: _async_true(consumer.stats.conflicts >= 1), 5)
        registry = Registry()
        observe_pulls(registry, [consumer])
        registry.snapshot()  # the observers run at export
        ended = (("operation", "stream"), ("outcome", "error"), ("reason", "stream_ended"))
        assert registry.value(NATS_OPERATIONS, ended) >= 1  # §13: the ended pull stream is counted
        await ensure_topology(js, SPEC)  # what the reconciler does
        await _publish(nc, 20)
        got: dict[int, Msg] = {}
        await _drain(consumer, got, until=20, timeout=5)
        assert consumer.stats.resets >= 1


async def test_watchdog_reissues_after_silent_loss(nc: Client) -> None:
    """Pull requests that vanish without a status (as on some reconnects) are re-issued after ~2x expiry."""
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    # A responder that swallows pull requests stands in for a server that lost them silently.
    swallowed: list[Msg] = []

    async def swallow(msg: Msg) -> None:
        swallowed.append(msg)

    await nc.subscribe("test.blackhole", cb=swallow)
    consumer = PullConsumer(nc, SPEC.pool_stream, SPEC.pool_durable, batch=8, expires_s=1.0, max_outstanding=8)
    real_subject = consumer._next_subject
    consumer._next_subject = "test.blackhole"
    await consumer.start()
    try:
        await _eventually(lambda: _async_true(bool(swallowed)), 2)
        consumer._next_subject = real_subject  # from now on the re-issued requests reach the server
        await _eventually(lambda: _async_true(consumer.stats.watchdog_resets >= 1), 4)
        await _publish(nc, 5)
        got: dict[int, Msg] = {}
        await _drain(consumer, got, until=5, timeout=3)
    finally:
        await consumer.stop()


@dataclass(frozen=True)
class RestartCase:
    storage: str  # "file" or "memory"
    hard: bool  # SIGKILL instead of SIGTERM
    hook: bool  # the app's reconnected callback calls on_reconnected()


@pytest.mark.parametrize(
    "case",
    [
        RestartCase("file", hard=False, hook=True),
        RestartCase("memory", hard=False, hook=False),
        RestartCase("memory", hard=True, hook=True),
        RestartCase("memory", hard=True, hook=False),
    ],
    ids=lambda c: f"{c.storage}-{'kill' if c.hard else 'term'}-{'hook' if c.hook else 'nohook'}",
)
async def test_recovers_after_nats_server_restart(
    nc: Client, nats_server: NatsServer, reconnect_hooks: list[Callable[[], None]], case: RestartCase
) -> None:
    """Pull requests do not survive a reconnect (nats.py issue 504); the consumer must re-issue them.

    `file`: the stream and durable survive the restart. `memory` (production's default): the restart loses
    them too; as in the app, the slow reconciler re-creates the topology while the consumer keeps re-issuing
    (503 no-responders back-off) until the durable is back. `hook`: the app's reconnected callback calls
    `on_reconnected()`; without it the consumer notices the reconnect by itself. A graceful stop answers the
    waiting pulls with a 409 first; `hard` (SIGKILL) leaves only the reconnect to go by, and the test then
    also requires that recovery did not wait for the silence watchdog. File storage is restarted only
    gracefully: a killed file store may replay already-acked messages.
    """
    js = nc.jetstream()
    file_storage = case.storage == "file"
    spec = TopologySpec(
        "default",
        "rtx6000",
        "sglang",
        "pod-0.svc",
        storage=js_api.StorageType.FILE if file_storage else js_api.StorageType.MEMORY,
    )
    await ensure_topology(js, spec)
    stop = asyncio.Event()
    reconciler = None if file_storage else asyncio.create_task(reconcile_forever(js, spec, 0.3, stop))
    watchdog_s = 30.0 if case.hard else None  # hard kill: make a watchdog rescue show up as a timeout
    try:
        async with _consumer(nc, batch=32, expires_s=1.0, max_outstanding=32, watchdog_s=watchdog_s) as consumer:
            if case.hook:
                reconnect_hooks.append(consumer.on_reconnected)
            await _publish(nc, 50)
            got: dict[int, Msg] = {}
            await _drain(consumer, got, until=50, timeout=5)
            await nc.flush()

            await nats_server.restart(hard=case.hard)
            await _eventually(lambda: _async_true(nc.is_connected), 10)
            await _eventually(lambda: _has_consumer(js, spec), 10)
            for i in range(50, 150):  # after the restart; stored for sure (JetStream publish acks)
                await js.publish(SUBJECT, str(i).encode())

            after: dict[int, Msg] = {}
            await _drain(consumer, after, until=100, timeout=10)
            assert sorted(m.data for m in after.values()) == sorted(str(i).encode() for i in range(50, 150))
            assert consumer.stats.reconnect_resets >= 1
            assert consumer.stats.watchdog_resets == 0
            assert consumer.high_water <= 32
    finally:
        stop.set()
        if reconciler is not None:
            await asyncio.wait_for(reconciler, 2)


async def test_stop_naks_buffered_messages_and_ends_batches(nc: Client) -> None:
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    await _publish(nc, 5)
    consumer = PullConsumer(nc, SPEC.pool_stream, SPEC.pool_durable, batch=8, expires_s=1.0, max_outstanding=8)
    await consumer.start()
    await _eventually(lambda: _async_true(consumer.buffered == 5), 5)
    await consumer.stop()
    assert consumer.unsettled == 0
    assert await consumer.next_batch(8, 0.01) == []
    assert [b async for b in consumer.batches(8, 0.01)] == []
    # The NAKs make them available again at once (not after ack_wait): a second consumer gets all five.
    async with _consumer(nc, batch=8, expires_s=1.0, max_outstanding=8) as second:
        got: dict[int, Msg] = {}
        await _drain(second, got, until=5, timeout=3)
        assert all(m.metadata.num_delivered == 2 for m in got.values())


async def test_next_batch_is_cancel_safe(nc: Client) -> None:
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    async with _consumer(nc, batch=8, expires_s=1.0, max_outstanding=8) as consumer:
        await nc.publish(SUBJECT, b"only")
        await nc.flush()
        # Waits for more within a long quantum, then is cancelled: the message must not be lost.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(consumer.next_batch(8, 5.0), 0.5)
        assert consumer.buffered == 1
        [msg] = await asyncio.wait_for(consumer.next_batch(8, 0), 1)
        assert msg.data == b"only"
        await msg.ack()
        consumer.settled(1)


def test_rejects_bad_settings() -> None:
    nc = Client()
    for kwargs in ({"batch": 0}, {"max_outstanding": 0}, {"expires_s": 0}, {"expires_s": 1.0, "heartbeat_s": 0.6}):
        with pytest.raises(ValueError):
            PullConsumer(nc, "S", "D", **kwargs)


async def _waiting(js: JetStreamContext) -> bool:
    return bool((await js.consumer_info(SPEC.pool_stream, SPEC.pool_durable)).num_waiting)


async def _has_consumer(js: JetStreamContext, spec: TopologySpec) -> bool:
    try:
        await js.consumer_info(spec.pool_stream, spec.pool_durable)
    except NatsError:  # not found yet, or JetStream still starting after the restart
        return False
    return True


async def _async_true(value: bool) -> bool:
    return value


async def test_deliveries_after_stop_come_back_once_the_pull_requests_expired(nc: Client) -> None:
    """A message the server delivers after `stop()` (to a pull request still live on it) used to be
    NAKed with no delay: the server handed it straight back to that same request, 20 times in 15 ms,
    and its delivery budget was gone. It now waits out our requests and comes back once."""
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    exhausted: list[bytes] = []

    async def on_advisory(msg: Msg) -> None:
        exhausted.append(msg.data)

    await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>", cb=on_advisory)
    consumer = PullConsumer(nc, SPEC.pool_stream, SPEC.pool_durable, batch=8, expires_s=1.0, max_outstanding=8)
    await consumer.start()
    await _eventually(lambda: _async_true(consumer.stats.requests > 0), 5)
    await nc.flush()  # the pull request is on the server
    await consumer.stop()
    await _publish(nc, 3)  # delivered to the still-live request after stop()
    await _eventually(lambda: _async_true(consumer.stats.stale_naks == 3), 5)
    async with _consumer(nc, batch=8, expires_s=1.0, max_outstanding=8) as second:
        got: dict[int, Msg] = {}
        await _drain(second, got, until=3, timeout=5)
        assert [m.metadata.num_delivered for m in got.values()] == [2, 2, 2]
    assert exhausted == []


async def test_a_paused_consumer_pulls_nothing_and_hands_back_what_it_holds(nc: Client) -> None:
    """The readiness gate's lever: started paused, nothing is requested; paused later, the credit is
    given up, buffered messages go back with the delay, late ones too, and resume pulls again."""
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    consumer = PullConsumer(nc, SPEC.pool_stream, SPEC.pool_durable, batch=8, expires_s=1.0, max_outstanding=8)
    await consumer.start(paused="handshake pending")
    try:
        assert consumer.paused == "handshake pending"
        await _publish(nc, 3)
        await asyncio.sleep(0.3)  # an observation window: nothing may be requested in it
        assert (consumer.stats.requests, consumer.buffered) == (0, 0)
        consumer.resume()
        await _eventually(lambda: _async_true(consumer.buffered == 3), 5)
        consumer.pause("backend not ready", return_delay_s=0.5)
        await _eventually(lambda: _async_true(consumer.buffered == 0 and consumer.unsettled == 0), 5)
        assert consumer.credit == 0 and consumer.stats.paused_naks == 3
        requests = consumer.stats.requests
        await _publish(nc, 2, start=3)  # reach the retired inbox's live request: NAKed back, delayed
        await asyncio.sleep(0.3)
        assert (consumer.stats.requests, consumer.buffered) == (requests, 0)
        consumer.resume()
        got: dict[int, Msg] = {}
        await _drain(consumer, got, until=5, timeout=10)
        delivered = sorted(m.metadata.num_delivered for m in got.values())
        # The three handed back: twice. The late two: twice too if they met the retired request, else once.
        assert delivered[2:] == [2, 2, 2] and max(delivered) == 2
    finally:
        await consumer.stop()


@pytest.mark.parametrize("expires_s", [0.5, 30.0, 600.0])
def test_the_request_body_is_what_json_dumps_writes(expires_s: float) -> None:
    """The pull request body is encoded once and filled in per request: byte for byte `json.dumps`."""
    import json

    consumer = PullConsumer(Client(), SPEC.pool_stream, SPEC.pool_durable, expires_s=expires_s)
    for want in (1, 64, 256, 10_000):
        expected = json.dumps({"batch": want, **consumer._request_extra}, separators=(",", ":")).encode()
        assert consumer._request_body(want) == expected
        assert json.loads(consumer._request_body(want))["batch"] == want


async def test_only_a_sid_the_scan_delivers_is_tallied_there(nc: Client) -> None:
    """The scan counts a sid's delivery attempts only while that sid is registered with the fast
    path (and only with the compiled maker of runs); else its runs reach the consumer by callback,
    which counts them itself."""
    from sie_sidecar.bus.attempts import AttemptTally
    from sie_sidecar.bus.inbound import FastInbound

    fast = FastInbound.install(nc)
    assert fast is not None
    sid = 987_654
    assert not fast.tally(sid, AttemptTally()) and not fast.tallied(sid)  # not registered: callback delivery
    fast.register(sid, lambda run: None)
    assert fast.tally(sid, AttemptTally()) == USING_NATIVE and fast.tallied(sid) == USING_NATIVE
    assert not fast.tally(sid, None) and not fast.tallied(sid)
    fast.tally(sid, AttemptTally())
    fast.unregister(sid)
    assert not fast.tallied(sid)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "callback"])
async def test_receive_telemetry_is_recorded_as_deliveries_arrive(nc: Client, direct: bool) -> None:
    """§13's receive counts and delivery attempts are read when a run arrives (its ACK subjects
    still in the CPU's caches), before any batch is taken, and reach the registry at export; a
    redelivery counts as one."""
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    await _publish(nc, 12)
    await _wait_stored(js, 12)
    registry = Registry()
    first = (("operation", "receive"), ("outcome", "success"), ("reason", "first_delivery"))
    again = (("operation", "receive"), ("outcome", "success"), ("reason", "redelivery"))
    consumer = PullConsumer(
        nc, SPEC.pool_stream, SPEC.pool_durable, batch=16, expires_s=1.0, max_outstanding=16, direct=direct
    )
    consumer.telemetry = registry  # before start: the first run may arrive while start() awaits
    observe_pulls(registry, [consumer])

    def received(reason: tuple[tuple[str, str], ...]) -> float:
        registry.snapshot()  # the observers run at export
        return registry.value(NATS_OPERATIONS, reason)

    await consumer.start()
    try:
        # The fast path counts each run as it scans it (the compiled maker of runs); then the
        # consumer does not count it again.
        assert consumer._sub is not None
        sid = consumer._sub._id
        assert (consumer._fast is not None and consumer._fast.tallied(sid)) == (direct and USING_NATIVE)
        await _eventually(lambda: _async_true(consumer.stats.messages >= 12))
        assert received(first) == 12  # nothing taken yet
        batch = await consumer.next_batch(16, 0)
        assert len(batch) == 12 and received(first) == 12  # not counted again
        await batch[0].nak()
        for msg in batch[1:]:
            await msg.ack()
        consumer.settled(len(batch))
        await _eventually(lambda: _async_true(consumer.stats.messages >= 13))
        assert received(again) == 1 and received(first) == 12
        (back,) = await consumer.next_batch(16, 0)
        assert back.metadata.num_delivered == 2
        await back.ack()
        consumer.settled(1)
        await consumer._rotate("test")  # a new inbox: only the current one is counted as scanned
        assert consumer._sub is not None and consumer._sub._id != sid
        assert consumer._fast is None or not consumer._fast.tallied(sid)
        sid = consumer._sub._id
        assert (consumer._fast is not None and consumer._fast.tallied(sid)) == (direct and USING_NATIVE)
    finally:
        await consumer.stop()
    assert consumer._fast is None or not consumer._fast.tallied(sid)  # stopped: what arrives is handed back
