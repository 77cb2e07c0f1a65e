# SPDX-License-Identifier: Apache-2.0
"""Settlement rows that need a NATS failure at one exact moment (sidecar-behaviour §4.2): the real
dispatcher against the reference backend over its Unix socket, fed JetStream deliveries that a real
nats-server handed to real nats-py connections, every ACK, NAK and progress ACK watched on the wire
by a third connection subscribed to the stream's ACK subjects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from sie_sidecar import wire
from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer
from sie_sidecar.ipc.client import IpcClient
from sie_sidecar.pipeline.delivery import Settler
from sie_sidecar.pipeline.dispatcher import Dispatcher, DispatchSettings
from sie_sidecar.telemetry import NATS_OPERATIONS, Registry

from ..pipeline.memory import MemorySink
from .conftest import NatsServer
from .stack import BUNDLE, POOL, PROFILE, work_item

STREAM, DURABLE = "WORK_SETTLE", "settle"
COLD_MODEL = "org/cold"
NAK_DELAY_MS = 700


@dataclass
class AckWire:
    """Every settlement a worker connection published on the stream's ACK subjects, as the server
    received it: `(ack subject, payload)` in arrival order."""

    seen: list[tuple[str, bytes]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_settle(self, msg: Msg) -> None:
        self.seen.append((msg.subject, msg.data))
        self.arrived.set()

    async def until(self, count: int, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.seen) < count:
                self.arrived.clear()
                await self.arrived.wait()


@contextlib.asynccontextmanager
async def connection(server: NatsServer) -> AsyncIterator[Client]:
    nc = await nats.connect(server.url, max_reconnect_attempts=0)
    try:
        yield nc
    finally:
        await nc.close()


async def pulled(worker: Client, subject: str, count: int) -> list[Msg]:
    """`count` deliveries for this connection from the shared durable (its ACK subject is theirs)."""
    sub = await worker.jetstream().pull_subscribe(subject, durable=DURABLE, stream=STREAM)
    return await sub.fetch(count, timeout=5)


async def test_a_failed_progress_ack_naks_the_group_with_the_base_delay(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """§4.2 "Progress ACK fails for any item → NAK group *base*": a group of four deliveries whose
    model answers `loading_started`, one of them held by a connection that has since closed. Its
    progress ACK fails (nats-py refuses to publish on a closed connection), so the whole group is
    NAKed with the base delay at once instead of parked: the three deliveries of the open connection
    reach the server as `-NAK` with that delay and come back after it; the closed connection's NAK
    fails in turn and is counted as a failed settlement, its delivery left to ack_wait."""
    subject = wire.pool_work_subject(POOL, PROFILE, BUNDLE, COLD_MODEL)
    adapter = NullAdapter(dim=8, load_delay_s=3600.0)  # never ready: every answer is a loading one
    sock = str(tmp_path / "backend.sock")
    backend = BackendServer(adapter, sock, worker_id="backend-0")
    await backend.start()
    ipc = IpcClient(sock, pool_size=1, request_timeout_s=10.0)
    async with connection(nats_server) as gateway, connection(nats_server) as open_worker:
        js = gateway.jetstream()
        await js.add_stream(name=STREAM, subjects=[subject])
        await js.add_consumer(STREAM, durable_name=DURABLE, ack_policy="explicit", ack_wait=30, max_deliver=-1)
        wire_log = AckWire()
        await gateway.subscribe(f"$JS.ACK.{STREAM}.>", cb=wire_log.on_settle)
        await gateway.flush()
        for n in range(4):
            await js.publish(subject, msgpack.packb(work_item(model=COLD_MODEL, text=f"t{n}"), use_bin_type=True))
        closed_worker = await nats.connect(nats_server.url, max_reconnect_attempts=0)
        (lost,) = await pulled(closed_worker, subject, 1)
        kept = await pulled(open_worker, subject, 3)
        await closed_worker.close()  # its delivery's settlements can no longer be published

        settler = Settler()
        settler.telemetry = Registry()
        dispatcher = Dispatcher(
            DispatchSettings(worker_id="w-settle", nak_delay_ms=NAK_DELAY_MS),
            ipc,
            MemorySink(framed=True),
            settler,
        )
        try:
            await asyncio.wait_for(dispatcher.handle([lost, *kept]), 10)
            await wire_log.until(3)
            await open_worker.flush()
            await gateway.flush()
            # Nothing but the three NAKs, each with the base delay, on the open connection's deliveries.
            assert sorted(wire_log.seen) == sorted((m.reply, b'-NAK {"delay": 700000000}') for m in kept)
            assert [settle for settle in wire_log.seen if settle[0] == lost.reply] == []
            counts = settler.counts
            assert (counts.naked, counts.acked, counts.progress, counts.settle_errors) == (4, 0, 0, 2)

            def operations(operation: str, outcome: str, reason: str) -> float:
                attrs = (("operation", operation), ("outcome", outcome), ("reason", reason))
                return settler.telemetry.value(NATS_OPERATIONS, attrs) if settler.telemetry is not None else -1

            assert operations("progress", "error", "none") == 1
            assert operations("nak", "success", "retry") == 3
            assert operations("nak", "error", "retry") == 1
            assert adapter.batches == 0  # never past readiness
            # The server took the NAKs: the three come back after the delay (the lost one only at
            # ack_wait, 30 s away).
            again = await pulled(open_worker, subject, 3)
            assert sorted(m.metadata.sequence.stream for m in again) == sorted(m.metadata.sequence.stream for m in kept)
            assert {m.metadata.num_delivered for m in again} == {2}
            for m in again:
                await m.ack()
        finally:
            await dispatcher.close_schedulers(1.0)
            await ipc.close()
            await backend.close()
