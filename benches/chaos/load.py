# SPDX-License-Identifier: Apache-2.0
"""The gateway stand-in: open-loop publishing of WorkItems and a reply collector that counts per item.

WorkItems are the load generator's (`sie_sidecar.tools.loadgen.build_work_item`: the v0.7.1 gateway's
keys and order), one item per request so the reply subject names the item. Publishes are core `HPUB`s
with a per-publish reply subject for the PubAck, as the load generator pipelines them; unlike it, a
publish whose PubAck is an error, or missing after `ACK_TIMEOUT_S`, is published again (at least once,
as a gateway would retry), with the work item id as `Nats-Msg-Id` so that JetStream stores a retried
item once (its duplicate window, 2 minutes, outlasts `GIVE_UP_S`). Retried items are marked so that a
duplicate they could still cause is attributed to the retry, not to the sidecar. The connection goes
to the first URL given (no shuffle), so the rig can keep the gateway off the node a fault hits.
Every answer is kept with its arrival time.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from sie_sidecar.tools.load_run import pub_ack_error
from sie_sidecar.tools.loadgen import LoadConfig, build_work_item, varied_texts

ACK_TIMEOUT_S = 5.0  # no PubAck this long after a publish: publish again
GIVE_UP_S = 90.0  # an item the stream has not accepted this long after its first publish is never accepted
RETRY_DELAY_S = 0.25  # the first retry's delay; it doubles per attempt up to RETRY_MAX_S
RETRY_MAX_S = 4.0
_SUCCESS = b"\xa7success\xc3"  # `"success": true` in a named-map WorkResult (wire-protocol §8.1)
_YIELD_EVERY = 32
#: Item texts: 20-120 words (seeded), so a batch's backend time varies with its tokens as real traffic's does.
TEXT_WORDS = (20, 120)


@dataclass
class Ledger:
    """What happened to every item, by index (request id `{prefix}-{index:08d}`, work item `<request>.0`)."""

    prefix: str
    count: int
    publish_t: list[float | None] = field(default_factory=list)  # first publish (seconds since t0)
    publishes: list[int] = field(default_factory=list)  # publish attempts
    acked: list[bool] = field(default_factory=list)  # a good PubAck came back
    #: Every answer: (arrival, seconds since t0; success; the answering sidecar's worker_id).
    answers: list[list[tuple[float, bool, str]]] = field(default_factory=list)
    unexpected: int = 0

    def __post_init__(self) -> None:
        self.publish_t = [None] * self.count
        self.publishes = [0] * self.count
        self.acked = [False] * self.count
        self.answers = [[] for _ in range(self.count)]

    def request_id(self, index: int) -> str:
        return f"{self.prefix}-{index:08d}"

    def work_item_id(self, index: int) -> str:
        return f"{self.request_id(index)}.0"

    def index_of(self, request_id: str) -> int | None:
        head, _, tail = request_id.rpartition("-")
        if head != self.prefix or not tail.isdigit():
            return None
        index = int(tail)
        return index if 0 <= index < self.count else None

    @property
    def answered(self) -> int:
        return sum(1 for a in self.answers if a)


class Gateway:
    """One NATS connection (every given URL, reconnecting for ever), the reply and PubAck inboxes, and
    the publishing of one ledger's items."""

    def __init__(self, urls: list[str], router_id: str, t0: float | None = None) -> None:
        self.urls = urls
        self.router_id = router_id
        self.t0 = time.perf_counter() if t0 is None else t0
        self.nc: Client | None = None
        self.ledgers: dict[str, Ledger] = {}
        self._ack_prefix = ""
        self._seq = 0
        self._waiting: dict[int, tuple[Ledger, int, float]] = {}  # PubAck seq -> (ledger, index, sent at)
        self._retry: list[tuple[float, int, Ledger, int]] = []  # heap: (due, seq, ledger, index)
        self._retry_seq = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._packer = msgpack.Packer(use_bin_type=True)
        self.client_errors: list[str] = []
        self.disconnects = 0
        self.gave_up: list[tuple[str, int]] = []  # (ledger prefix, index) never accepted by the stream
        self._texts = varied_texts(min_words=TEXT_WORDS[0], max_words=TEXT_WORDS[1])

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def connect(self) -> None:
        async def on_error(exc: Exception) -> None:
            if len(self.client_errors) < 50:
                self.client_errors.append(f"{self.now():.2f}s {exc.__class__.__name__}: {exc}")

        async def on_disconnect() -> None:
            self.disconnects += 1

        self.nc = await nats.connect(
            servers=self.urls,
            dont_randomize=True,  # the first URL: the rig's gateway node, which no fault hits
            connect_timeout=5,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.25,
            pending_size=64 * 1024 * 1024,
            error_cb=on_error,
            disconnected_cb=on_disconnect,
        )
        self._ack_prefix = self.nc.new_inbox()
        await self.nc.subscribe(
            f"_INBOX.{self.router_id}.>", cb=self._on_reply, pending_msgs_limit=0, pending_bytes_limit=0
        )
        await self.nc.subscribe(f"{self._ack_prefix}.*", cb=self._on_ack, pending_msgs_limit=0, pending_bytes_limit=0)
        await self.nc.flush()
        self._tasks = [asyncio.create_task(self._retry_loop()), asyncio.create_task(self._ack_watchdog())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()

    def ledger(self, prefix: str, count: int) -> Ledger:
        ledger = Ledger(prefix, count)
        self.ledgers[prefix] = ledger
        return ledger

    @property
    def unconfirmed(self) -> int:
        return len(self._waiting)

    # -- publishing --

    def config(self) -> LoadConfig:
        return LoadConfig(nats_url=self.urls[0], model="null/vectors", router_id=self.router_id, texts=self._texts)

    async def _publish(self, ledger: Ledger, index: int, config: LoadConfig) -> None:
        assert self.nc is not None
        item = build_work_item(
            config,
            request_id=ledger.request_id(index),
            item_index=0,
            total_items=1,
            text_index=index,
            timestamp=time.time(),
        )
        now = self.now()
        if ledger.publish_t[index] is None:
            ledger.publish_t[index] = now
        ledger.publishes[index] += 1
        self._seq += 1
        seq = self._seq
        self._waiting[seq] = (ledger, index, now)
        try:
            await self.nc.publish(
                config.subject,
                self._packer.pack(item),
                reply=f"{self._ack_prefix}.{seq}",
                headers={"Nats-Msg-Id": ledger.work_item_id(index)},  # a retry is stored once
            )
        except Exception as exc:  # outbound buffer full while disconnected, connection closed
            self._waiting.pop(seq, None)
            if len(self.client_errors) < 50:
                self.client_errors.append(f"{now:.2f}s publish: {exc.__class__.__name__}: {exc}")
            self._schedule_retry(ledger, index)

    async def publish_open_loop(
        self, ledger: Ledger, rate: float, on_progress: Callable[[int], None] | None = None
    ) -> float:
        """Item k leaves at start + k / rate (fixed interval; a late schedule is caught up in a burst).
        Returns the time of the last publish (seconds since t0)."""
        config = self.config()
        start = time.perf_counter()
        for index in range(ledger.count):
            if rate > 0:
                delay = start + index / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            await self._publish(ledger, index, config)
            if rate <= 0 and index % _YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if on_progress is not None:
                on_progress(index)
        assert self.nc is not None
        with contextlib.suppress(Exception):
            await self.nc.flush(timeout=5)
        return self.now()

    def _schedule_retry(self, ledger: Ledger, index: int) -> None:
        """Publish `index` again after a back-off that doubles per attempt (RETRY_DELAY_S .. RETRY_MAX_S):
        while a stream has no leader, PubAck errors come back at once, and a fixed short delay would
        spend an item's attempts in seconds."""
        attempts = max(1, ledger.publishes[index])
        delay = min(RETRY_MAX_S, RETRY_DELAY_S * 2 ** (attempts - 1))
        self._retry_seq += 1
        heapq.heappush(self._retry, (self.now() + delay, self._retry_seq, ledger, index))

    async def _retry_loop(self) -> None:
        """Publish again what is due; an item never accepted within GIVE_UP_S of its first publish is
        given up on (counted as never accepted)."""
        config = self.config()
        while True:
            now = self.now()
            if not self._retry or self._retry[0][0] > now:
                await asyncio.sleep(0.05)
                continue
            n = 0
            while self._retry and self._retry[0][0] <= now:
                _, _, ledger, index = heapq.heappop(self._retry)
                if ledger.acked[index] or ledger.answers[index]:
                    continue
                first = ledger.publish_t[index]
                if first is not None and now - first > GIVE_UP_S:
                    self.gave_up.append((ledger.prefix, index))
                    continue
                await self._publish(ledger, index, config)
                n += 1
                if n % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)

    async def _ack_watchdog(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = self.now()
            for seq, (ledger, index, sent) in list(self._waiting.items()):
                if now - sent > ACK_TIMEOUT_S:
                    del self._waiting[seq]
                    self._schedule_retry(ledger, index)

    # -- inboxes --

    async def _on_ack(self, msg: Msg) -> None:
        try:
            seq = int(msg.subject.rpartition(".")[2])
        except ValueError:
            return
        entry = self._waiting.pop(seq, None)
        if entry is None:
            return
        ledger, index, _ = entry
        if pub_ack_error(msg) is None:
            ledger.acked[index] = True
        else:
            self._schedule_retry(ledger, index)

    async def _on_reply(self, msg: Msg) -> None:
        now = self.now()
        request_id = msg.subject.rpartition(".")[2]
        prefix = request_id.rpartition("-")[0]
        ledger = self.ledgers.get(prefix)
        index = None if ledger is None else ledger.index_of(request_id)
        if ledger is None or index is None:
            for candidate in self.ledgers.values():
                candidate.unexpected += 1
                break
            return
        worker = "?"
        with contextlib.suppress(Exception):  # a WorkResult map; anything else still counts as an answer
            result = msgpack.unpackb(msg.data, raw=False, strict_map_key=False)
            worker = str(result.get("worker_id") or "?")
        ledger.answers[index].append((now, _SUCCESS in msg.data[:256], worker))


async def measure_capacity(gateway: Gateway, items: int, timeout_s: float = 120.0) -> float:
    """Publish `items` as fast as possible and return the answer rate between the 10th and 90th percent
    of answers (items/s): what the pool sustains with a full backlog."""
    ledger = gateway.ledger("cap", items)
    await gateway.publish_open_loop(ledger, 0.0)
    deadline = time.monotonic() + timeout_s
    while ledger.answered < items and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    firsts = sorted(a[0][0] for a in ledger.answers if a)
    if len(firsts) < 10:
        raise RuntimeError(f"capacity run: only {len(firsts)} of {items} answered")
    lo, hi = firsts[len(firsts) // 10], firsts[(len(firsts) * 9) // 10]
    return (len(firsts) * 0.8) / max(hi - lo, 1e-3)


__all__ = ["ACK_TIMEOUT_S", "Gateway", "Ledger", "measure_capacity"]
