# SPDX-License-Identifier: Apache-2.0
"""The per-model scheduler (scheduler-and-prep §3.6, §5): FCFS over formers, the pipeline bound,
waves of drains, the idle bypass and the final drain at shutdown."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sie_sidecar.sched.scheduler import Formed, ModelScheduler, SchedulerConfig


class Recorder:
    """A dispatch function that records batches and can be held open to fill the pipeline."""

    def __init__(self, hold_s: float = 0.0, reports_ms: float | None = None) -> None:
        self.batches: list[Formed[str]] = []
        self.hold_s = hold_s
        self.reports_ms = reports_ms  # the inference_ms it reports (just-in-time dispatch learns from it)
        self.running = 0
        self.most_running = 0
        self.gate: asyncio.Event | None = None

    async def __call__(self, formed: Formed[str]) -> float | None:
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.hold_s:
                await asyncio.sleep(self.hold_s)
            self.batches.append(formed)
        finally:
            self.running -= 1
        return self.reports_ms


async def settle(scheduler: ModelScheduler[Any], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not scheduler.idle():
            await asyncio.sleep(0.002)


async def test_an_idle_worker_flushes_a_lone_item_at_once() -> None:
    rec = Recorder()
    # Windows far longer than any stall: with the defaults (5 ms coalesce), a loaded host that ran
    # the scheduler's loop 5 ms after the submit found the coalesce trigger due first (a flake).
    config = SchedulerConfig(coalesce_ms=1000.0, max_batch_wait_ms=1000.0)
    s: ModelScheduler[str] = ModelScheduler("m", rec, config)
    s.submit("encode", "", ["a"], [1])
    await settle(s)
    assert [(b.items, b.reason, b.role) for b in rec.batches] == [(["a"], "idle_bypass", "primary")]


async def test_without_the_idle_bypass_a_lone_item_waits_for_the_coalesce_window() -> None:
    rec = Recorder()
    # The coalesce window (5 ms) ends long before the wait (1 s): a loaded host that wakes the loop
    # late still finds only the coalesce trigger due (with the default 15 ms wait, a 15 ms stall made
    # both due and the former reported "timeout").
    config = SchedulerConfig(idle_bypass=False, coalesce_ms=5.0, max_batch_wait_ms=1000.0)
    s: ModelScheduler[str] = ModelScheduler("m", rec, config)
    loop = asyncio.get_running_loop()
    started = loop.time()
    s.submit("encode", "", ["a"], [1])
    await settle(s)
    assert rec.batches[0].reason == "coalesce"
    assert loop.time() - started >= 0.005


async def test_keys_never_mix_and_score_ignores_the_lora() -> None:
    rec = Recorder()
    s: ModelScheduler[str] = ModelScheduler("m", rec, SchedulerConfig(idle_bypass=False))
    s.submit("encode", "", ["e0", "e1"], [1, 1])
    s.submit("encode", "lora-a", ["a0"], [1])
    s.submit("score", "lora-a", ["s0"], [1])
    s.submit("score", "", ["s1"], [1])
    await settle(s)
    by_key = {(b.op, b.lora): sorted(b.items) for b in rec.batches}
    assert by_key == {("encode", ""): ["e0", "e1"], ("encode", "lora-a"): ["a0"], ("score", ""): ["s0", "s1"]}


async def test_the_pipeline_bound_holds_and_the_backlog_leaves_as_a_wave_of_drains() -> None:
    rec = Recorder()
    rec.gate = asyncio.Event()
    s: ModelScheduler[str] = ModelScheduler("m", rec, SchedulerConfig(pipeline_depth=2, max_batch_requests=4))
    s.submit("encode", "", ["first"], [1])
    await asyncio.sleep(0.01)  # the first batch holds one slot
    s.submit("encode", "", [f"x{i}" for i in range(10)], [1] * 10)
    await asyncio.sleep(0.05)
    assert rec.running == 2  # never more than the depth, however much is pending
    rec.gate.set()
    await settle(s)
    assert rec.most_running == 2
    assert Counter(b.role for b in rec.batches)["drain"] >= 1
    assert sorted(i for b in rec.batches for i in b.items) == sorted(["first", *(f"x{i}" for i in range(10))])
    assert all(len(b.items) <= 4 for b in rec.batches)


async def test_fcfs_serves_the_oldest_key_first() -> None:
    rec = Recorder()
    s: ModelScheduler[str] = ModelScheduler("m", rec, SchedulerConfig(idle_bypass=False, pipeline_depth=1))
    s.submit("extract", "", ["old"], [1])
    await asyncio.sleep(0.001)
    s.submit("encode", "", ["new"], [1])
    await settle(s)
    assert [b.items for b in rec.batches] == [["old"], ["new"]]


async def test_on_idle_fires_once_everything_finished() -> None:
    rec = Recorder(hold_s=0.01)
    calls: list[bool] = []
    s: ModelScheduler[str] = ModelScheduler("m", rec, on_idle=lambda: calls.append(s.idle()))
    s.submit("encode", "", ["a", "b", "c"], [1, 1, 1])
    await settle(s)
    assert calls and all(calls)


async def test_close_flushes_pending_work_and_returns_what_did_not_fit_the_deadline() -> None:
    rec = Recorder()
    s: ModelScheduler[str] = ModelScheduler(
        "m", rec, SchedulerConfig(idle_bypass=False, max_batch_wait_ms=1000.0, coalesce_ms=1000.0)
    )
    s.submit("encode", "", ["a", "b"], [1, 1])
    assert await s.close() == []
    assert sorted(i for b in rec.batches for i in b.items) == ["a", "b"]
    with pytest.raises(RuntimeError, match="closing"):
        s.submit("encode", "", ["late"], [1])

    stuck = Recorder()
    stuck.gate = asyncio.Event()  # never opens: the batch in flight outlives the deadline
    s2: ModelScheduler[str] = ModelScheduler("m", stuck, SchedulerConfig(pipeline_depth=1, max_batch_requests=1))
    s2.submit("encode", "", ["x", "y", "z"], [1, 1, 1])
    await asyncio.sleep(0.01)
    left = await s2.close(deadline_s=0.05)
    assert sorted(left) == ["y", "z"]


async def test_update_limits_wakes_a_queue_that_became_flushable() -> None:
    rec = Recorder()
    s: ModelScheduler[str] = ModelScheduler(
        "m", rec, SchedulerConfig(idle_bypass=False, max_batch_wait_ms=10_000.0, coalesce_ms=10_000.0)
    )
    s.submit("encode", "", ["a", "b"], [300, 300])
    await asyncio.sleep(0.02)
    assert rec.batches == []
    s.update_limits(500, 10_000.0)
    await settle(s)
    assert rec.batches[0].reason == "cost_cap"


@settings(max_examples=40, deadline=None)
@given(
    groups=st.lists(
        st.tuples(st.sampled_from(["encode", "score", "extract"]), st.sampled_from(["", "l1"]), st.integers(1, 20)),
        min_size=1,
        max_size=12,
    ),
    depth=st.integers(1, 3),
    requests=st.integers(1, 16),
    timed=st.booleans(),
)
def test_every_item_is_dispatched_once_within_the_caps(
    groups: list[tuple[str, str, int]], depth: int, requests: int, timed: bool
) -> None:
    """`timed`: the backend reports inference times, so just-in-time dispatch holds batches too."""

    async def run() -> None:
        rec = Recorder(hold_s=0.002, reports_ms=2.0) if timed else Recorder()
        s: ModelScheduler[str] = ModelScheduler(
            "m", rec, SchedulerConfig(pipeline_depth=depth, max_batch_requests=requests, max_batch_cost=40)
        )
        expected = []
        for g, (op, lora, n) in enumerate(groups):
            items = [f"{g}.{i}" for i in range(n)]
            costs = [(i % 7) + 1 for i in range(n)]
            expected += items
            s.submit(op, lora, items, costs)
            await asyncio.sleep(0)
        await settle(s)
        got = [i for b in rec.batches for i in b.items]
        assert sorted(got) == sorted(expected)
        assert rec.most_running <= depth
        for b in rec.batches:
            assert 1 <= len(b.items) <= requests
            assert len(b.items) == 1 or b.total_cost <= 40
            groups_in_batch = {int(i.split(".")[0]) for i in b.items}
            keys = {(groups[g][0], "" if groups[g][0] == "score" else groups[g][1]) for g in groups_in_batch}
            assert keys == {(b.op, b.lora)}

    asyncio.run(run())


async def test_pending_work_leaves_as_soon_as_the_backend_goes_idle() -> None:
    """Work-conserving bypass: while a batch runs, new items wait (the triggers decide); the moment
    nothing is in flight they go, long before the 1 s wait would have fired."""
    rec = Recorder()
    rec.gate = asyncio.Event()
    s: ModelScheduler[str] = ModelScheduler(
        "m", rec, SchedulerConfig(max_batch_wait_ms=1000.0, coalesce_ms=1000.0, pipeline_depth=2)
    )
    s.submit("encode", "", ["f1", "f2"], [1, 1])  # two items: v0.7.1's "was idle" rule does not apply after it
    await asyncio.sleep(0.01)
    s.submit("encode", "", ["a", "b"], [1, 1])
    await asyncio.sleep(0.05)
    assert rec.running == 1 and s.pending == 2  # a slot is free, but the backend is busy: they wait
    loop = asyncio.get_running_loop()
    started = loop.time()
    rec.gate.set()
    await settle(s)
    assert loop.time() - started < 0.5
    assert [b.items for b in rec.batches] == [["f1", "f2"], ["a", "b"]]
    assert rec.batches[1].reason == "idle_bypass"


async def test_a_dispatch_width_sends_extract_items_alone_on_their_own_slots() -> None:
    """Newer than v0.7.1 (§5): width > 1 grows the depth and splits extract batches into single items;
    other operations keep their batches."""
    rec = Recorder()
    rec.gate = asyncio.Event()
    s: ModelScheduler[str] = ModelScheduler("m", rec, SchedulerConfig(pipeline_depth=2, idle_bypass=False))
    s.widen(4)
    assert s.depth == 4
    s.widen(3)  # never shrinks
    assert s.depth == 4
    s.submit("extract", "", ["x0", "x1", "x2"], [1, 1, 1])
    await asyncio.sleep(0.03)
    assert rec.running == 3  # three single-item RunBatches in flight at once
    rec.gate.set()
    s.submit("encode", "", ["e0", "e1"], [1, 1])
    await settle(s)
    sizes = sorted((b.op, len(b.items)) for b in rec.batches)
    assert sizes == [("encode", 2), ("extract", 1), ("extract", 1), ("extract", 1)]
    assert [b.role for b in rec.batches if b.op == "extract"].count("primary") == 1


async def test_without_a_width_extract_batches_stay_whole() -> None:
    rec = Recorder()
    s: ModelScheduler[str] = ModelScheduler("m", rec, SchedulerConfig(idle_bypass=False))
    s.widen(None)
    s.widen(1)
    s.submit("extract", "", ["x0", "x1"], [1, 1])
    await settle(s)
    assert [len(b.items) for b in rec.batches] == [2] and s.depth == 2


# -- just-in-time dispatch (our extension) --------------------------------------------------------


class Device:
    """A simulated device behind the backend's queue: one batch at a time for a + b x cost seconds,
    reporting that time as `inference_ms`, and recording how long each batch queued for it."""

    def __init__(self, a_s: float, b_s: float = 0.0) -> None:
        self.a_s, self.b_s = a_s, b_s
        self.lock = asyncio.Lock()
        self.queued_s: list[float] = []
        self.batches: list[Formed[float]] = []
        self.finished_at: list[float] = []

    async def __call__(self, formed: Formed[float]) -> float:
        loop = asyncio.get_running_loop()
        sent = loop.time()
        async with self.lock:
            self.queued_s.append(loop.time() - sent)
            service = self.a_s + self.b_s * formed.total_cost
            await asyncio.sleep(service)
        self.batches.append(formed)
        self.finished_at.append(loop.time())
        return service * 1000.0


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer whenever nothing is ready to run.

    The just-in-time test compares queue waits of a few ms; on wall time, a loaded host (the full
    suite on two cores) stretched them past its bounds now and then. Here only the scheduler's and
    the simulated device's own timers move time, so the run is the same on any host. Only for
    timer-driven code: nothing here waits on real I/O."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0

    def time(self) -> float:
        return self._now

    def _run_once(self) -> None:
        ready: Any = getattr(self, "_ready")  # noqa: B009 - CPython's base loop internals
        scheduled: Any = getattr(self, "_scheduled")  # noqa: B009
        if not ready and scheduled:
            self._now = max(self._now, scheduled[0].when())
        super()._run_once()  # type: ignore[misc]


def run_virtual(coro: Any) -> Any:
    """Run `coro` to completion on a fresh `VirtualTimeLoop`."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


async def run_load(jit: bool) -> tuple[Device, ModelScheduler[float]]:
    """Ten lone items (the device idles between them), then one item every 3 ms for 0.45 s while
    each batch takes 30 ms: the device is always busy and a second batch is always waiting."""
    device = Device(0.030)
    loop = asyncio.get_running_loop()
    s: ModelScheduler[float] = ModelScheduler(
        "m",
        device,
        SchedulerConfig(max_batch_wait_ms=5.0, max_batch_requests=64, jit_dispatch=jit),
        clock=loop.time,
    )
    for _ in range(10):
        s.submit("encode", "", [loop.time()], [1])
        await asyncio.sleep(0.045)
    await settle(s)
    for _ in range(150):
        s.submit("encode", "", [loop.time()], [1])
        await asyncio.sleep(0.003)
    await settle(s)
    await s.close(1.0)  # no task left pending when the loop closes
    return device, s


def busy_phase(device: Device) -> tuple[list[float], list[float]]:
    """Queue waits and item latencies (submit -> batch finished) of the busy phase's batches."""
    queued = device.queued_s[10:]
    latencies = [
        done - at for b, done in zip(device.batches[10:], device.finished_at[10:], strict=True) for at in b.items
    ]
    return queued, latencies


def test_just_in_time_dispatch_sends_the_next_batch_as_the_device_frees() -> None:
    """Without it a triggered batch sits in the backend's queue for most of the running batch's
    time; with it, it goes just before the device frees, carrying the items that arrived meanwhile.
    On virtual time: the outcome depends on the scheduler's timers only, not the host's load."""
    held, s_held = run_virtual(run_load(jit=True))
    eager, s_eager = run_virtual(run_load(jit=False))
    for device in (held, eager):  # every item once, nothing lost
        assert sorted(at for b in device.batches for at in b.items) == sorted(
            {at for b in device.batches for at in b.items}
        )
        assert sum(len(b.items) for b in device.batches) == 160
    assert s_held.jit_holds > 0 and s_held.jit_releases > 0
    assert s_eager.jit_holds == 0
    queued_held, latency_held = busy_phase(held)
    queued_eager, latency_eager = busy_phase(eager)
    median = sorted(queued_held)[len(queued_held) // 2]
    median_eager = sorted(queued_eager)[len(queued_eager) // 2]
    assert median < 0.010
    assert median_eager > 0.015
    # Fewer, fuller batches and a lower mean latency for the same items.
    assert len(held.batches) <= len(eager.batches)
    assert sum(latency_held) / len(latency_held) < sum(latency_eager) / len(latency_eager)


async def test_a_full_former_is_not_held_for_the_device() -> None:
    device = Device(0.040)
    s: ModelScheduler[float] = ModelScheduler("m", device, SchedulerConfig(max_batch_requests=4))
    loop = asyncio.get_running_loop()
    for _ in range(10):  # teach the estimate (each batch alone)
        s.submit("encode", "", [loop.time()], [1])
        await asyncio.sleep(0.05)
    await settle(s)
    s.submit("encode", "", [loop.time()], [1])  # goes alone; the device is now busy for 40 ms
    await asyncio.sleep(0.005)
    s.submit("encode", "", [loop.time() for _ in range(4)], [1] * 4)  # a full batch: sent at once
    await asyncio.sleep(0.015)
    assert len(device.batches) == 10 and device.lock.locked()
    assert s.in_flight == 2  # the full batch is already queued behind the running one
    await settle(s)
    assert [len(b.items) for b in device.batches[10:]] == [1, 4]


async def test_no_hold_without_reported_inference_times_or_with_a_dispatch_width() -> None:
    rec = Recorder(hold_s=0.02)  # reports nothing: no estimate, the triggers decide
    s: ModelScheduler[str] = ModelScheduler("m", rec)
    for n in range(30):
        s.submit("encode", "", [f"i{n}"], [1])
        await asyncio.sleep(0.004)
    await settle(s)
    assert s.jit_holds == 0
    device = Device(0.02)
    wide: ModelScheduler[float] = ModelScheduler("m", device)
    wide.widen(2)  # a continuous-batching backend runs batches side by side: never held
    loop = asyncio.get_running_loop()
    for _ in range(30):
        wide.submit("encode", "", [loop.time()], [1])
        await asyncio.sleep(0.004)
    await settle(wide)
    assert wide.jit_holds == 0 and sum(len(b.items) for b in device.batches) == 30


async def test_a_costly_item_goes_into_the_next_batch_once_it_waited_past_the_bound() -> None:
    """Cost-ascending packing passes the costliest item over while cheaper ones keep arriving; past
    `max_item_wait_s` it goes next whatever its cost (issue 9: it used to wait out ack_wait)."""
    loop = asyncio.get_running_loop()
    sent: list[tuple[list[str], str, float]] = []

    async def dispatch(formed: Formed[str]) -> None:
        sent.append((formed.items, formed.reason, loop.time()))
        await asyncio.sleep(0.01)

    config = SchedulerConfig(pipeline_depth=1, max_batch_requests=2, idle_bypass=False, max_item_wait_s=0.1)
    s: ModelScheduler[str] = ModelScheduler("m", dispatch, config)
    s.submit("encode", "", ["costly"], [1000])
    submitted = loop.time()
    for n in range(100):  # 3 cheap items per 10 ms batch of 2: a backlog that never clears
        s.submit("encode", "", [f"c{n}a", f"c{n}b", f"c{n}c"], [1, 1, 1])
        await asyncio.sleep(0.01)
        if any("costly" in items for items, _, _ in sent):
            break
    (batch,) = [(items, reason, at) for items, reason, at in sent if "costly" in items]
    assert batch[1] == "aged" and batch[2] - submitted < 0.5  # not after the whole second of backlog
    assert batch[0][0] == "costly"  # the oldest first
    assert s.aged_items >= 1
    await s.close(1.0)


async def test_held_items_are_progress_acked_each_progress_after_s() -> None:
    """Nothing held, pending or in flight, goes half an ack_wait without a progress ACK (law 3)."""
    now = [0.0]
    kept: list[str] = []

    async def keepalive(items: list[str]) -> None:
        kept.extend(items)

    rec = Recorder()
    rec.gate = asyncio.Event()  # the batch in flight does not finish until the gate opens
    config = SchedulerConfig(pipeline_depth=1, max_batch_requests=1, progress_after_s=0.1, max_item_wait_s=0)
    s: ModelScheduler[str] = ModelScheduler("m", rec, config, clock=lambda: now[0], keepalive=keepalive)
    s.submit("encode", "", ["a", "b", "c"], [1, 1, 1])
    async with asyncio.timeout(5):
        while s.in_flight != 1:
            await asyncio.sleep(0.001)
    for t in (0.05, 0.1, 0.15, 0.2):  # the ticker runs too; together they ACK each item once per 0.1 s
        now[0] = t
        await s.progress_held(t)
    assert Counter(kept) == {"a": 2, "b": 2, "c": 2}
    rec.gate.set()
    await settle(s)
    now[0] = 1.0
    assert await s.progress_held(1.0) == 0  # settled work is never progress-ACKed
    await s.close(1.0)


async def test_the_backends_batch_budget_caps_every_formed_batch() -> None:
    """`batch_budget` is "max work items per dispatch" (wire-protocol §3): consecutive groups of two
    must not merge into one bigger batch (they did, 3 and 4 items, once pulls were capped at it)."""
    rec = Recorder()
    rec.gate = asyncio.Event()
    s: ModelScheduler[str] = ModelScheduler("m", rec, SchedulerConfig(idle_bypass=False, max_batch_wait_ms=50.0))
    s.submit("encode", "", ["early0", "early1", "early2"], [1, 1, 1])  # a live former, built before the cap
    s.cap_requests(2)
    for i in range(3):
        s.submit("encode", "", [f"a{i}", f"b{i}"], [1, 1])
    rec.gate.set()
    await settle(s)
    sizes = [len(b.items) for b in rec.batches]
    assert max(sizes) <= 2 and sum(sizes) == 9
    assert sorted(i for b in rec.batches for i in b.items) == sorted(
        ["early0", "early1", "early2", "a0", "b0", "a1", "b1", "a2", "b2"]
    )
    s.cap_requests(None)  # no budget reported: back to max_batch_requests
    s.submit("encode", "", [f"c{i}" for i in range(5)], [1] * 5)
    await settle(s)
    assert len(rec.batches[-1].items) == 5
    await s.close(0.5)


async def test_a_count_cap_derived_from_the_batch_budget_follows_it_up_and_down() -> None:
    """`requests_from_budget` (SIE_BATCHER_MAX_BATCH_REQUESTS unset): the backend's batch budget is
    the count cap, above v0.7.1's 12 too; without a budget the configured 12 applies again."""
    rec = Recorder()
    config = SchedulerConfig(idle_bypass=False, max_batch_wait_ms=20.0, requests_from_budget=True)
    s: ModelScheduler[str] = ModelScheduler("m", rec, config)
    s.cap_requests(40)
    assert s.max_requests == 40
    s.submit("encode", "", [f"a{i}" for i in range(40)], [1] * 40)
    await settle(s)
    assert [len(b.items) for b in rec.batches] == [40]
    s.cap_requests(None)
    assert s.max_requests == 12
    s.submit("encode", "", [f"b{i}" for i in range(24)], [1] * 24)
    await settle(s)
    assert [len(b.items) for b in rec.batches[1:]] == [12, 12]
    pinned: ModelScheduler[str] = ModelScheduler("p", Recorder(), SchedulerConfig(max_batch_requests=12))
    pinned.cap_requests(40)
    assert pinned.max_requests == 12  # an explicit count cap is only ever lowered by the budget
    await s.close(0.5)
    await pinned.close(0.5)


async def test_pending_cost_follows_what_is_queued() -> None:
    """The per-model pending cost child placement weighs (scheduler-and-prep §5): up at enqueue, down
    when a batch leaves the scheduler, and down to 0 for what close() hands back."""
    rec = Recorder()
    rec.gate = asyncio.Event()
    config = SchedulerConfig(pipeline_depth=1, max_batch_requests=2, coalesce_ms=1000.0, max_batch_wait_ms=1000.0)
    s: ModelScheduler[str] = ModelScheduler("m", rec, config)
    cost = {"a": 5, "b": 7, "c": 11, "d": 13}
    s.submit("encode", "", list(cost), list(cost.values()))
    assert s.pending_cost == 36
    await asyncio.sleep(0.05)  # the first batch (2 items) left for the held dispatch
    in_flight = [item for formed in s._running.values() for item in formed.items]
    assert len(in_flight) == 2 and s.pending_cost == 36 - sum(cost[i] for i in in_flight)
    left = await s.close(0.0)
    rec.gate.set()
    assert sorted(left + in_flight) == sorted(cost) and s.pending_cost == 0


async def test_a_runs_alone_item_goes_by_itself_even_when_it_aged() -> None:
    """§3.5 (newer than v0.7.1): a runs-alone item never shares a batch, in the former or among the
    items taken out for waiting too long."""
    rec = Recorder()
    config = SchedulerConfig(coalesce_ms=1000.0, max_batch_wait_ms=1000.0, idle_bypass=False, max_item_wait_s=0.05)
    s: ModelScheduler[str] = ModelScheduler("m", rec, config)
    s.submit("extract", "", ["a", "long", "b"], [5, 240, 8], alone=[False, True, False])
    await settle(s)
    batches = [b.items for b in rec.batches]
    assert ["long"] in batches and sorted(i for b in batches for i in b) == ["a", "b", "long"]
    assert all(len(b) == 1 for b in batches if "long" in b)


def test_runs_alone_is_long_prepared_audio() -> None:
    from sie_sidecar.sched.costs import runs_alone

    assert not runs_alone(None) and not runs_alone({"sample_count": 480_000})
    assert runs_alone({"sample_count": 480_001}) and not runs_alone({"sample_count": True})
