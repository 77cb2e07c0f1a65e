# SPDX-License-Identifier: Apache-2.0
"""An in-memory `Source` and reply sink: the pipeline driven without NATS, against the real reference
backend on a real Unix socket. Every delivery records how it was settled, so a test can count them."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from sie_sidecar import wire
from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer
from sie_sidecar.ipc.client import IpcClient
from sie_sidecar.pipeline.delivery import Settler
from sie_sidecar.pipeline.dispatcher import Dispatcher, DispatchSettings
from sie_sidecar.pipeline.feed import feed
from sie_sidecar.sched.quantum import LatencyWindow, QuantumController
from sie_sidecar.sched.scheduler import SchedulerConfig
from sie_sidecar.wire.types import Reply

_acks = itertools.count()


@dataclass
class MemoryMessage:
    """A delivery with its settlement log (`settlements` holds one entry per settle call)."""

    subject: str
    data: bytes
    reply: str = field(default_factory=lambda: f"$JS.ACK.mem.{next(_acks)}")
    settlements: list[tuple[str, float | None]] = field(default_factory=list)

    async def ack(self) -> None:
        self.settlements.append(("ack", None))

    async def nak(self, delay: int | float | None = None) -> None:
        self.settlements.append(("nak", delay))

    async def in_progress(self) -> None:
        self.settlements.append(("progress", None))

    @property
    def final(self) -> list[tuple[str, float | None]]:
        return [s for s in self.settlements if s[0] != "progress"]


class MemorySource:
    """A `Source` over a queue; capacity accounting like the pull consumer's (`unsettled`)."""

    def __init__(self, max_outstanding: int | None = None) -> None:
        """`max_outstanding`: hand out no more while this many are unsettled, as the pull consumer
        holds at most SIE_PULL_LOOP_MAX_OUTSTANDING (None: no bound)."""
        self._queue: deque[MemoryMessage] = deque()
        self._data = asyncio.Event()
        self._stopped = False
        self.unsettled = 0
        self.max_outstanding = max_outstanding

    def put(self, messages: Sequence[MemoryMessage]) -> None:
        self._queue.extend(messages)
        self._data.set()

    def stop(self) -> None:
        self._stopped = True
        self._data.set()

    async def next_batch(
        self, max_messages: int, quantum_s: float, stop_early: Callable[[], bool] | None = None
    ) -> list[MemoryMessage]:
        while not self._queue or (self.max_outstanding is not None and self.unsettled >= self.max_outstanding):
            if self._stopped:
                return []
            self._data.clear()
            await self._data.wait()
        n = min(max_messages, len(self._queue))
        if self.max_outstanding is not None:
            n = min(n, self.max_outstanding - self.unsettled)
        self.unsettled += n
        return [self._queue.popleft() for _ in range(n)]

    def settled(self, n: int) -> None:
        self.unsettled -= n
        if self.max_outstanding is not None:
            self._data.set()

    def wake(self) -> None:
        self._data.set()


class MemoryAcks:
    """The batched-ACK writer: ACKs by reply subject, as the NATS writer frames them."""

    def __init__(self) -> None:
        self.by_subject: dict[str, MemoryMessage] = {}

    async def ack_many(self, reply_subjects: Sequence[str]) -> None:
        for subject in reply_subjects:
            self.by_subject[subject].settlements.append(("ack", None))


class MemorySink:
    """A reply sink that decodes what it is given: natively framed `PUB` batches or `Reply` lists."""

    def __init__(self, *, framed: bool, acks: MemoryAcks | None = None) -> None:
        """`acks`: `+ACK` commands framed after the replies (one connection for both) go there."""
        self.framed = framed
        self.max_payload = 1 << 20
        self.replies: list[tuple[str, dict[str, Any]]] = []
        self._acks = acks

    async def publish_framed(self, replies: wire.FramedReplies) -> bool:
        buf, pos = bytes(replies.buffer), 0
        while pos < len(buf):
            end = buf.index(b"\r\n", pos)
            _, subject, size = buf[pos:end].split(b" ")
            start = end + 2
            payload = buf[start : start + int(size)]
            if payload == b"+ACK" and self._acks is not None and subject.decode() in self._acks.by_subject:
                self._acks.by_subject[subject.decode()].settlements.append(("ack", None))
            else:
                self.replies.append((subject.decode(), msgpack.unpackb(payload, raw=False)))
            pos = start + int(size) + 2
        return True

    async def publish_raw(self, subject: str, payload: bytes) -> bool:
        self.replies.append((subject, msgpack.unpackb(payload, raw=False)))
        return True

    async def publish_batch(self, replies: list[Reply]) -> list[bool]:
        for r in replies:
            self.replies.append((r.subject, msgpack.unpackb(wire.encode_work_result(r.result), raw=False)))
        return [True] * len(replies)


@dataclass
class MemoryPipeline:
    source: MemorySource
    sink: MemorySink
    acks: MemoryAcks
    dispatcher: Dispatcher
    settler: Settler
    adapter: NullAdapter
    #: The dispatcher's shutdown event (what SIGTERM sets).
    stop: asyncio.Event
    #: The dispatcher's IPC client (to the backend, or to the proxy at `ipc_socket`).
    ipc: IpcClient

    def send(self, messages: Sequence[MemoryMessage]) -> None:
        for m in messages:
            self.acks.by_subject[m.reply] = m
        self.source.put(messages)

    async def until_settled(self, messages: Sequence[MemoryMessage], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while any(not m.final for m in messages) or self.source.unsettled:
                await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def memory_pipeline(
    tmp_path: Path,
    *,
    framed: bool = True,
    adapter: NullAdapter | None = None,
    nak_delay_ms: int = 5000,
    acks_with_replies: bool = False,
    parked_deadline_s: float = 600.0,
    fetch_budget: int = 64,
    progress_after_s: float = 15.0,
    ipc_socket: str | None = None,
    ipc_timeout_s: float = 10.0,
) -> AsyncIterator[MemoryPipeline]:
    """The dispatcher fed by `feed()` from a memory source, talking to a real backend over a socket
    (`tmp_path/backend.sock`; the IPC client connects to `ipc_socket` instead when given: a proxy)."""
    adapter = adapter or NullAdapter(dim=8, preloaded_models=["org/model-a", "org/model-b"])
    sock = str(tmp_path / "backend.sock")
    backend = BackendServer(adapter, sock, worker_id="backend-0")
    await backend.start()
    ipc = IpcClient(ipc_socket or sock, pool_size=2, request_timeout_s=ipc_timeout_s)
    source, acks = MemorySource(), MemoryAcks()
    sink = MemorySink(framed=framed, acks=acks if acks_with_replies else None)
    settler = Settler(acks)
    stop = asyncio.Event()
    quantum = QuantumController(LatencyWindow(), min_ms=1, max_ms=5, target_p50_ms=10)
    dispatcher = Dispatcher(
        DispatchSettings(
            worker_id="w-mem",
            nak_delay_ms=nak_delay_ms,
            parked_deadline_s=parked_deadline_s,
            fetch_budget=fetch_budget,
            scheduler=SchedulerConfig(progress_after_s=progress_after_s),
        ),
        ipc,
        sink,
        settler,
        shutdown=stop,
        quantum=quantum,
        acks_with_replies=acks_with_replies,
    )
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.create_task(
        feed(source, dispatcher.handle, budget=64, inflight=2, stop=stop, tasks=tasks, quantum=quantum)
    )
    try:
        yield MemoryPipeline(source, sink, acks, dispatcher, settler, adapter, stop, ipc)
    finally:
        stop.set()
        source.stop()
        await asyncio.wait_for(loop, 10)
        await dispatcher.join_parked()
        await dispatcher.close_schedulers(1.0)
        await ipc.close()
        await backend.close()
