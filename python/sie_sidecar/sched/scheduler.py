# SPDX-License-Identifier: Apache-2.0
"""One model's scheduler: batch formers per (operation, LoRA), FCFS across them, and the drain loop
that feeds a bounded pipeline of backend calls (scheduler-and-prep §3.6, §5).

Python touches batches here, not items: a group of deliveries is submitted with one native call, and
each formed batch comes back as one list of handles. The loop follows §5: reserve a pipeline slot
before extracting (so pending work stays mutable while the pipeline is full), flush a primary batch
(with the idle bypass when the worker was idle), then drain what was pending for the same key when
the next slot opens, as a wave.

Two deliberate differences from v0.7.1:

- The idle bypass also applies whenever no batch of this model is in flight (and the loop is woken
  when the last one finishes), not only after a wave of single items. v0.7.1 would hold a batch for
  its wait (15 ms and up) while the backend sits idle; here the triggers only decide while the
  backend is busy, which is when coalescing pays.
- Just-in-time dispatch (`SIE_BATCHER_JIT_DISPATCH_ENABLED`, on by default): while a batch is in
  flight, the next one is sent when the device is estimated to free (`DeviceClock`), not when a
  slot opens or a former's wait runs out, so it does not wait in the backend's queue while newer
  items miss it. A former that reaches its count or cost cap still goes at once, and a backend
  that runs batches concurrently (dispatch width over 1) is never held.

Two guarantees v0.7.1 lacks (issue 9, laws 3 and 4). No item starves: the former packs every
batch cost-ascending, so under a steady backlog the costliest items were passed over until
JetStream's ack_wait ran out and they ran twice; an item pending longer than `max_item_wait_s` now
goes into the next batch whatever its cost (the scheduler takes such items out of the former once
per batch, not per item, and packs them oldest first). And nothing held goes without a lease: every
item pending or in flight for `progress_after_s` (half the consumer's ack_wait) is progress-ACKed
through `keepalive`, and again each `progress_after_s` after that.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Generic, Literal, Protocol, TypeVar

from ..config.groups import MAX_ITEM_WAIT_S, SchedulerConfig
from ..telemetry import INFLIGHT_BATCHES, PENDING_COST, PENDING_ITEMS, Registry
from ..telemetry.lane_metrics import LaneMetrics
from .batcher import Batcher
from .device_clock import DeviceClock

log = logging.getLogger(__name__)

T = TypeVar("T")
Role = Literal["primary", "drain"]
Key = tuple[str, str]  # (operation, LoRA key; "" is the base weights)

FINAL_DRAIN_POLL_S: Final = 0.025
#: Flush reasons that mean the batch is as big as it may get: just-in-time dispatch never holds it.
_FULL: Final = frozenset({"cost_cap", "count_cap", "single_oversize"})
#: The flush reason of a batch of items that waited past `max_item_wait_s`.
AGED: Final = "aged"
#: Progress-ACK sweeps per `progress_after_s` (so a lease is renewed at most a quarter late).
_KEEPALIVE_TICKS: Final = 4


class FormedBatch(Protocol):
    """What a former hands out (`sched.batcher.FormedBatch`), or an aged batch the scheduler took."""

    @property
    def ids(self) -> list[int]: ...
    @property
    def total_cost(self) -> int: ...
    @property
    def reason(self) -> str: ...
    def __len__(self) -> int: ...


@dataclass(frozen=True, slots=True)
class AgedBatch:
    """Items that waited past `max_item_wait_s`, taken out of their former oldest first (reason `aged`)."""

    ids: list[int]
    total_cost: int
    reason: str

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(slots=True)
class Formed(Generic[T]):
    """A batch handed to the dispatch function: items in packing order, their cost and why."""

    op: str
    lora: str
    items: list[T]
    total_cost: int
    reason: str
    role: Role
    enqueued_at: list[float] = field(default_factory=list)
    #: When the batch left its former (metrics on only: each item's queue time ends here).
    taken_at: float | None = None
    #: When the keepalive last progress-ACKed this batch's items (None: not yet).
    progressed_at: float | None = None


#: Runs one batch; may return the backend's `inference_ms` for it (the device-time estimate's input).
Dispatch = Callable[[Formed[T]], Awaitable[float | None]]
#: Progress-ACKs held items (their lease would otherwise run out and JetStream redeliver them).
Keepalive = Callable[[list[T]], Awaitable[None]]


class ModelScheduler(Generic[T]):
    """Batches one model's items and runs at most `pipeline_depth` dispatches at a time."""

    def __init__(
        self,
        model: str,
        dispatch: Dispatch[T],
        config: SchedulerConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_idle: Callable[[], None] | None = None,
        telemetry: Registry | None = None,
        keepalive: Keepalive[T] | None = None,
        metrics: LaneMetrics | None = None,
    ) -> None:
        """`telemetry`: the worker's registry; every scheduler moves the same three gauges (queued
        items, their cost, batches in flight) by deltas, once per group or batch. `metrics` (when
        enabled): the model's §13 queue instruments: it reads this scheduler's depth at snapshot
        time, and the scheduler writes each batch's cost fill and take time."""
        self.model = model
        self.config = config or SchedulerConfig()
        self._dispatch = dispatch
        self._clock = clock
        self._on_idle = on_idle
        self._keepalive = keepalive if self.config.progress_after_s > 0 else None
        self._formers: dict[Key, Batcher] = {}
        #: Every pending item by handle, and its arrival (two dicts: no tuple per item); insertion
        #: order is arrival order.
        self._items: dict[int, T] = {}
        self._arrivals: dict[int, float] = {}
        #: Items taken out of their former for waiting too long, oldest first (see the module docstring).
        self._aged: dict[Key, deque[int]] = {}
        self._aged_count = 0
        self._caps: dict[int, int] = {}  # hard caps of the items that have one
        self._lone_items: set[int] = set()  # pending items that never share a batch
        self._progressed: dict[int, float] = {}  # pending items the keepalive progress-ACKed, and when
        self._running: dict[int, Formed[T]] = {}  # batches in flight by send token
        self._keepalive_task: asyncio.Task[None] | None = None
        self._ids = itertools.count()
        self._new_item = asyncio.Event()
        self._depth = max(1, self.config.pipeline_depth)
        self._slots = asyncio.Semaphore(self._depth)
        self._width = 1  # the backend's dispatch width (descriptor.max_concurrent_dispatch)
        self._max_requests = self.config.max_batch_requests  # follows the backend's batch_budget
        #: The caps in force (the controller's, via `update_limits`): a former created later starts
        #: with these, not with the configured initial ones (§4.6: new batchers copy the config).
        self._cost_cap = self.config.max_batch_cost
        self._wait_ms = self.config.max_batch_wait_ms
        self._costs: dict[int, int] = {}
        #: The cost of what is pending here (child placement weighs it, scheduler-and-prep §5).
        self.pending_cost = 0
        self._in_flight: set[asyncio.Task[None]] = set()
        self._device = DeviceClock()
        self._sent = itertools.count()
        self._closing = False
        self._loop_task: asyncio.Task[None] | None = None
        registry = telemetry if telemetry is not None else Registry()
        self._queued = registry.gauge(PENDING_ITEMS)
        self._queued_cost = registry.gauge(PENDING_COST)
        self._inflight_gauge = registry.gauge(INFLIGHT_BATCHES)
        self.metrics: LaneMetrics | None = None
        if metrics is not None:
            self.attach_metrics(metrics)
        #: Formed batches by flush reason (telemetry and tests).
        self.flushes: dict[str, int] = {}
        #: Batches held for the device (just-in-time dispatch), and those sent because it was about to free.
        self.jit_holds = 0
        self.jit_releases = 0
        #: Items forced into a batch for waiting past `max_item_wait_s`, and progress-ACKs requested.
        self.aged_items = 0
        self.progress_acks = 0

    def attach_metrics(self, metrics: LaneMetrics) -> None:
        """Record into `metrics` from now on (at construction, or mid-run when recording is turned on
        at the first state read, telemetry/switch.py); the depth is read, so what is queued now counts."""
        if self.metrics is not None:
            return
        metrics.watch_queue(self.pending_by_operation)
        self.metrics = metrics

    # -- state ---------------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        return len(self._items)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def idle(self) -> bool:
        """Nothing pending and nothing running."""
        return not self._items and not self._in_flight

    def pending_by_operation(self) -> dict[str, int]:
        """Items queued here per operation (every LoRA, aged ones included; 0 for an operation seen
        but empty now): the depth gauge's reading."""
        pending: dict[str, int] = {}
        for groups in (self._formers, self._aged):
            for (op, _), queued in groups.items():
                pending[op] = pending.get(op, 0) + len(queued)
        return pending

    def pending_for(self, op: str, lora: str = "") -> int:
        former = self._formers.get((op, lora))
        aged = self._aged.get((op, lora))
        return (0 if former is None else len(former)) + (0 if aged is None else len(aged))

    # -- submit --------------------------------------------------------------------------------------

    def submit(
        self,
        op: str,
        lora: str,
        items: Sequence[T],
        costs: Sequence[int],
        hard_caps: Sequence[int | None] | None = None,
        *,
        alone: Sequence[bool] | None = None,
    ) -> None:
        """Queue a group of one (op, LoRA) with their costs; one native call for the whole group.

        `hard_caps` (one per item, None for none) lower the cap of any batch the item is pending
        with, e.g. 720,000 ms for extract items carrying decoded audio (§2.3). `alone` (one per
        item; newer than v0.7.1): the item never shares a batch (long-form audio, §2.3, §3.5)."""
        if self._closing:
            raise RuntimeError("scheduler is closing")
        if (
            len(items) != len(costs)
            or (hard_caps is not None and len(hard_caps) != len(items))
            or (alone is not None and len(alone) != len(items))
        ):
            raise ValueError("items, costs, hard_caps and alone must have the same length")
        if not items:
            return
        key = (op, "" if op == "score" else lora)  # score always runs on the base weights (§1.1)
        former = self._formers.get(key)
        if former is None:
            former = self._formers[key] = self._new_former(self._cost_cap, self._wait_ms)
        now = self._clock()
        first = next(self._ids)
        ids = list(range(first, first + len(items)))
        self._ids = itertools.count(first + len(items))
        self._items.update(zip(ids, items, strict=True))
        self._arrivals.update(zip(ids, itertools.repeat(now)))
        self._costs.update(zip(ids, costs, strict=True))
        if hard_caps is not None:
            for i, cap in zip(ids, hard_caps, strict=True):
                if cap is not None:
                    self._caps[i] = cap
        if alone is not None:
            self._lone_items.update(i for i, lone in zip(ids, alone, strict=True) if lone)
        former.submit_many(
            ids,
            list(costs),
            now,
            None if hard_caps is None else list(hard_caps),
            None if alone is None else list(alone),
        )
        self._queued.add(len(ids))
        added = sum(costs)
        self.pending_cost += added
        self._queued_cost.add(added)
        self._new_item.set()
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run(), name=f"scheduler:{self.model}")
        if self._keepalive is not None and self._keepalive_task is None:
            self._keepalive_task = asyncio.create_task(self._keep_alive(), name=f"keepalive:{self.model}")

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def max_requests(self) -> int:
        """The count cap formed batches have now (after `cap_requests`)."""
        return self._max_requests

    def widen(self, width: int | None) -> None:
        """The backend's dispatch width (newer than v0.7.1, §5): depth = max(configured depth, width),
        width clamped to [1, 1024], and it only ever grows for a running scheduler; with a width over
        1, extract items are sent one per RunBatch, each on its own pipeline slot."""
        if not width or width <= self._width:
            return
        self._width = min(1024, width)
        grown = max(self._depth, self._width)
        for _ in range(grown - self._depth):
            self._slots.release()
        self._depth = grown

    def cap_requests(self, batch_budget: int | None) -> None:
        """The backend's `batch_budget` ("max work items per dispatch for this model", wire-protocol
        §3): no formed batch carries more items than that. With `requests_from_budget` the budget is
        the count cap; otherwise the cap is also at most `max_batch_requests`. Live formers are
        rebuilt with the new cap, their items kept with their arrival times and costs."""
        c = self.config
        if not batch_budget:
            cap = c.max_batch_requests
        else:
            cap = batch_budget if c.requests_from_budget else min(c.max_batch_requests, batch_budget)
        if cap == self._max_requests:
            return
        self._max_requests = cap
        for key, former in list(self._formers.items()):
            rebuilt = self._new_former(former.max_batch_cost, former.max_batch_wait_ms)
            self._resubmit(rebuilt, former.drain_all())
            self._formers[key] = rebuilt
        self._new_item.set()

    def _new_former(self, max_batch_cost: int, max_batch_wait_ms: float) -> Batcher:
        """A former with these caps, the current request cap and the configured coalescing."""
        c = self.config
        return Batcher(
            max_batch_cost=max_batch_cost,
            max_batch_requests=self._max_requests,
            max_batch_wait_ms=max_batch_wait_ms,
            coalesce_ms=c.coalesce_ms,
            coalesce_ratio=c.coalesce_ratio,
        )

    def _resubmit(self, former: Batcher, ids: list[int]) -> None:
        """Put pending items (in arrival order) into `former` with their own arrival times, costs and caps."""
        arrivals = self._arrivals
        start = 0
        for end in range(1, len(ids) + 1):
            if end == len(ids) or arrivals[ids[end]] != arrivals[ids[start]]:
                run = ids[start:end]
                caps = [self._caps.get(i) for i in run] if self._caps else None
                lone = [i in self._lone_items for i in run] if self._lone_items else None
                former.submit_many(run, [self._costs.get(i, 1) for i in run], arrivals[run[0]], caps, lone)
                start = end

    def update_limits(self, max_batch_cost: int, max_batch_wait_ms: float) -> None:
        """Push the controller's new caps into every former and keep them for formers created later
        (and wake the loop if one became flushable)."""
        self._cost_cap, self._wait_ms = max_batch_cost, max_batch_wait_ms
        now = self._clock()
        if any(f.update_limits(max_batch_cost, max_batch_wait_ms, now) for f in self._formers.values()):
            self._new_item.set()

    # -- the drain loop (§5) -------------------------------------------------------------------------

    def _oldest(self) -> tuple[Key, Batcher] | None:
        best: tuple[Key, Batcher] | None = None
        best_head = 0.0
        for key, former in self._formers.items():
            head = former.head_arrival
            if head is not None and (best is None or head < best_head):
                best, best_head = (key, former), head
        return best

    # -- aging (no item starves) ---------------------------------------------------------------------

    def _sweep_aged(self, now: float) -> bool:
        """Take every item pending longer than `max_item_wait_s` out of its former (one check of each
        former's oldest arrival per call, i.e. per batch); True when aged items are waiting."""
        bound = self.config.max_item_wait_s
        if bound > 0:
            cutoff = now - bound
            for key, former in self._formers.items():
                head = former.head_arrival
                if head is not None and head <= cutoff:
                    self._age_out(key, former, cutoff)
        return self._aged_count > 0

    def _age_out(self, key: Key, former: Batcher, cutoff: float) -> None:
        """Move the items that arrived by `cutoff` to the aged queue, oldest first; the younger ones go
        back into the former with their own arrival times (so their triggers are unchanged)."""
        ids = former.drain_all()  # arrival order
        arrivals = self._arrivals
        split = 0
        while split < len(ids) and arrivals[ids[split]] <= cutoff:
            split += 1
        queue = self._aged.setdefault(key, deque())
        queue.extend(ids[:split])
        self._aged_count += split
        self.aged_items += split
        self._resubmit(former, ids[split:])
        log.debug("items waited too long; they go next", extra={"model": self.model, "op": key[0], "items": split})

    def _aged_batch(self, now: float) -> tuple[Key, FormedBatch] | None:
        """The next batch of aged items (oldest first, within the former's count and cost caps), or None."""
        if not self._sweep_aged(now):
            return None
        key = min((k for k, q in self._aged.items() if q), key=lambda k: self._arrivals[self._aged[k][0]])
        queue, former = self._aged[key], self._formers[key]
        limit, cap = max(1, former.max_batch_requests), former.max_batch_cost
        ids: list[int] = []
        cost = 0
        while queue and len(ids) < limit:
            i = queue[0]
            if ids and i in self._lone_items:
                break  # a runs-alone item never shares, aged or not
            c = self._costs.get(i, 1)
            item_cap = self._caps.get(i) if self._caps else None
            new_cap = cap if item_cap is None else min(cap, item_cap)
            if ids and cost + c > new_cap:
                break
            ids.append(queue.popleft())
            cost, cap = cost + c, new_cap
            if i in self._lone_items:
                break
        self._aged_count -= len(ids)
        return key, AgedBatch(ids, cost, AGED)

    async def _consume_next(self, immediate: bool) -> tuple[Key, FormedBatch] | None:
        """FCFS: commit to the former with the oldest pending item and wait for its trigger (items
        that waited past `max_item_wait_s` go first, at once)."""
        held = False  # a triggered batch is being held for the device (counted once)
        while True:
            self._new_item.clear()
            aged = self._aged_batch(self._clock())
            if aged is not None:
                return aged
            pick = self._oldest()
            if pick is None:
                if self._closing:
                    return None
                await self._new_item.wait()
                continue
            key, former = pick
            now = self._clock()
            # Work-conserving: nothing in flight means the backend is idle, so waiting only adds latency.
            bypass = immediate or (self.config.idle_bypass and not self._in_flight)
            release = None if bypass else self._release_at()
            if release is not None:
                if now >= release:  # the device is about to free: whatever is pending goes now
                    batch = former.try_get_batch(now, True)
                    if batch is not None:
                        self.jit_releases += 1
                        return key, batch
                elif (reason := former.flush_reason(now, False)) not in _FULL:  # hold: it would only queue
                    if not held and reason is not None:
                        self.jit_holds += 1
                        held = True
                    await self._wait_for_news(release - now)
                    continue
            batch = former.try_get_batch(now, bypass)
            if batch is not None:
                return key, batch
            wait_ms = former.time_until_next_trigger_ms(now)
            if wait_ms is not None and wait_ms <= 0:
                continue
            await self._wait_for_news(None if wait_ms is None else wait_ms / 1000.0)

    def _release_at(self) -> float | None:
        """Just-in-time dispatch: when the next batch should go (None: at once / by the triggers)."""
        if not self.config.jit_dispatch or self._width > 1 or not self._in_flight:
            return None
        return self._device.release_at()

    async def _wait_for_news(self, timeout_s: float | None) -> None:
        """Until a new item, a finished batch or `timeout_s` (None: no limit), whichever comes first."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(None if timeout_s is None else max(0.0, timeout_s)):
                await self._new_item.wait()

    async def _hold_for_device(self, former: Batcher) -> None:
        """Before a wave's drain: while the device is busy and the former is not full, wait for the
        just-in-time release (or for the backend to go idle)."""
        held = False
        while not self._closing:
            release = self._release_at()
            now = self._clock()
            if release is None or now >= release or former.flush_reason(now, False) in _FULL:
                if held and release is not None and now >= release:
                    self.jit_releases += 1
                return
            if not held and len(former):
                self.jit_holds += 1
                held = True
            self._new_item.clear()
            await self._wait_for_news(release - now)

    def _take(self, key: Key, batch: FormedBatch, role: Role) -> Formed[T]:
        self.flushes[batch.reason] = self.flushes.get(batch.reason, 0) + 1
        costs = self._costs
        ids = batch.ids
        taken_cost = sum(map(costs.pop, ids, itertools.repeat(0)))  # the items' own costs: no drift
        if self._caps:
            for i in ids:
                self._caps.pop(i, None)
        if self._lone_items:
            self._lone_items.difference_update(ids)
        if self._progressed:
            for i in ids:
                self._progressed.pop(i, None)
        items = list(map(self._items.pop, ids))
        enqueued_at = list(map(self._arrivals.pop, ids))
        self._queued.add(-len(items))
        self.pending_cost = max(0, self.pending_cost - taken_cost)
        self._queued_cost.add(-taken_cost)
        taken_at: float | None = None
        metrics = self.metrics
        if metrics is not None:
            former = self._formers.get(key)
            cap = batch.total_cost if former is None else former.max_batch_cost
            if cap > 0:
                metrics.fills[key[0], batch.reason] = batch.total_cost / cap
            taken_at = self._clock()
        return Formed(
            op=key[0],
            lora=key[1],
            items=items,
            total_cost=batch.total_cost,
            reason=batch.reason,
            role=role,
            enqueued_at=enqueued_at,
            taken_at=taken_at,
        )

    def _alone(self, key: Key, batch: FormedBatch) -> bool:
        return key[0] == "extract" and self._width > 1 and len(batch.ids) > 1

    def _singles(self, key: Key, batch: FormedBatch, role: Role) -> list[Formed[T]]:
        """One Formed per item (items-alone dispatch); the first keeps the role, the rest are drains."""
        costs = [self._costs.get(i, 1) for i in batch.ids]
        whole = self._take(key, batch, role)
        return [
            Formed(key[0], key[1], [item], cost, batch.reason, role if n == 0 else "drain", [at], whole.taken_at)
            for n, (item, at, cost) in enumerate(zip(whole.items, whole.enqueued_at, costs, strict=True))
        ]

    def _spawn(self, key: Key, batch: FormedBatch, role: Role) -> None:
        """Run one batch as a task holding a pipeline slot (released when it finishes)."""
        self._start(self._take(key, batch, role))

    def _start(self, formed: Formed[T], *, holds_slot: bool = True) -> None:
        alone = not self._in_flight
        token = next(self._sent)
        self._running[token] = formed
        self._device.sent(token, self._clock(), formed.total_cost)
        task = asyncio.create_task(self._run_dispatch(formed, token, alone, holds_slot=holds_slot))
        self._in_flight.add(task)
        self._inflight_gauge.add(1)
        task.add_done_callback(self._finished)

    async def _run_dispatch(self, formed: Formed[T], token: int, alone: bool, *, holds_slot: bool = True) -> None:
        inference_ms: float | None = None
        try:
            reported = await self._dispatch(formed)
            inference_ms = reported if isinstance(reported, float | int) else None
        except Exception:  # the dispatch function settles its own items; this only keeps the loop alive
            log.exception("batch dispatch failed", extra={"model": self.model, "items": len(formed.items)})
        finally:
            self._running.pop(token, None)
            self._device.done(token, self._clock(), inference_ms, alone=alone)
            if holds_slot:
                self._slots.release()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._inflight_gauge.add(-1)
        if not self._in_flight or (self.config.jit_dispatch and self._items):
            self._new_item.set()  # the backend went idle (or the device estimate moved): look again
        if self._on_idle is not None and self.idle():
            self._on_idle()

    async def _run(self) -> None:
        held = 0  # pipeline slots this loop holds and has not handed to a batch task

        async def reserve() -> None:
            nonlocal held
            await self._slots.acquire()
            held += 1

        async def spawn(key: Key, batch: FormedBatch, role: Role) -> None:
            nonlocal held
            if not self._alone(key, batch):
                self._spawn(key, batch, role)  # the slot now belongs to the batch task
                held -= 1
                return
            singles = self._singles(key, batch, role)
            for n, single in enumerate(singles):
                if n > 0:
                    try:
                        await reserve()  # each item of an items-alone batch takes its own slot
                    except asyncio.CancelledError:  # shutdown won the wait: the rest runs as one batch
                        rest = singles[n:]
                        self._start(
                            Formed(
                                key[0],
                                key[1],
                                [f.items[0] for f in rest],
                                sum(f.total_cost for f in rest),
                                batch.reason,
                                "drain",
                                [f.enqueued_at[0] for f in rest],
                                single.taken_at,
                            ),
                            holds_slot=False,
                        )
                        raise
                self._start(single)
                held -= 1

        was_idle = True
        try:
            while not self._closing:
                await reserve()
                got = await self._consume_next(was_idle and self.config.idle_bypass)
                if got is None:
                    return
                key, batch = got
                n0 = len(batch.ids)
                await spawn(key, batch, "primary")
                await reserve()  # the continuation slot: the wave is sized when it opens
                former = self._formers[key]
                await self._hold_for_device(former)
                budget = len(former)
                drained = False
                while budget > 0:
                    if self._sweep_aged(self._clock()):
                        break  # items waited too long: they go first, as the next primary batch
                    more = former.try_drain_up_to(budget)
                    if more is None or not more.ids:
                        break
                    budget -= len(more.ids)
                    drained = True
                    await spawn(key, more, "drain")
                    if budget > 0:
                        await reserve()
                if held:
                    self._slots.release()
                    held -= 1
                was_idle = not drained and n0 <= 1
        finally:
            for _ in range(held):
                self._slots.release()

    # -- leases (nothing held goes without a progress ACK) ------------------------------------------------

    async def _keep_alive(self) -> None:
        after = self.config.progress_after_s
        while True:
            await asyncio.sleep(after / _KEEPALIVE_TICKS)
            try:
                await self.progress_held(self._clock())
            except Exception:  # the keepalive settles nothing; a failure only costs this sweep
                log.exception("progress sweep failed", extra={"model": self.model})

    async def progress_held(self, now: float) -> int:
        """Progress-ACK every item pending or in flight for `progress_after_s` without one; returns how
        many. Pending items are scanned in arrival order only as far as the held ones reach."""
        if self._keepalive is None:
            return 0
        cutoff = now - self.config.progress_after_s
        due: list[T] = []
        progressed = self._progressed
        items = self._items
        for i, at in self._arrivals.items():
            if at > cutoff:
                break
            if progressed.get(i, at) <= cutoff:
                due.append(items[i])
                progressed[i] = now
        for formed in self._running.values():
            since = formed.progressed_at
            if since is None:
                since = min(formed.enqueued_at, default=now)
            if since <= cutoff:
                due.extend(formed.items)
                formed.progressed_at = now
        if due:
            self.progress_acks += len(due)
            await self._keepalive(due)
        return len(due)

    # -- shutdown ------------------------------------------------------------------------------------

    async def close(self, deadline_s: float | None = None) -> list[T]:
        """Stop the loop, wait for in-flight batches, flush what is pending until the deadline, and
        return whatever is left (the caller NAKs it so it comes back at once)."""
        self._closing = True
        self._new_item.set()
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        deadline = self._clock() + (self.config.drain_deadline_s if deadline_s is None else deadline_s)
        for _ in range(self._depth):  # quiesce: every slot back means nothing is in flight
            remaining = deadline - self._clock()
            if remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._slots.acquire()
        while self._items and self._clock() < deadline:  # the pipeline is quiet: one batch at a time
            got = self._aged_batch(self._clock())
            if got is None:
                pick = self._oldest()
                if pick is None:
                    break
                key, former = pick
                drained = former.try_drain_up_to(len(former))
                if drained is None:
                    await asyncio.sleep(FINAL_DRAIN_POLL_S)
                    continue
                batch: FormedBatch = drained
            else:
                key, batch = got
            formed = self._take(key, batch, "primary")
            token = next(self._sent)
            self._running[token] = formed  # kept alive by the keepalive like any batch in flight
            self._inflight_gauge.add(1)
            try:
                async with asyncio.timeout(max(0.001, deadline - self._clock())):
                    await self._dispatch(formed)
            except Exception:
                log.exception("final drain batch failed", extra={"model": self.model, "items": len(formed.items)})
            finally:
                self._running.pop(token, None)
                self._inflight_gauge.add(-1)
        if self._in_flight:  # e.g. the rest of an items-alone batch started outside the pipeline
            await asyncio.wait(set(self._in_flight), timeout=max(0.001, deadline - self._clock()))
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive_task
            self._keepalive_task = None
        groups = [(key, list(queue)) for key, queue in self._aged.items()]
        self._aged.clear()
        self._aged_count = 0
        groups += [(key, former.drain_all()) for key, former in self._formers.items()]
        left = [i for _, ids in groups for i in ids]
        self._queued.add(-len(left))
        left_cost = sum(self._costs.pop(i, 0) for i in left)
        self.pending_cost = max(0, self.pending_cost - left_cost)
        self._queued_cost.add(-left_cost)
        for i in left:
            self._arrivals.pop(i, None)
        self._lone_items.clear()
        self._caps.clear()
        return [self._items.pop(i) for i in left]


__all__ = ["AGED", "MAX_ITEM_WAIT_S", "Formed", "Keepalive", "ModelScheduler", "SchedulerConfig"]
