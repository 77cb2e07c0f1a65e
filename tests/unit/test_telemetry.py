# SPDX-License-Identifier: Apache-2.0
"""The telemetry registry, what the schedulers record into it, and the health heartbeat's load
fields and saturation hysteresis computed from it (sidecar-behaviour §10, §13)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar import wire
from sie_sidecar._twins.histogram import BatchInstruments as TwinBatchInstruments
from sie_sidecar._twins.histogram import Histogram as PyHistogram
from sie_sidecar.bus.health import HealthIdentity, HealthReporter, Saturation
from sie_sidecar.pipeline.readiness import Readiness
from sie_sidecar.sched.scheduler import Formed, ModelScheduler, SchedulerConfig
from sie_sidecar.telemetry import (
    BATCH_FILL_RATIO,
    GPU_SLOTS,
    INFLIGHT_BATCHES,
    PENDING_COST,
    PENDING_ITEMS,
    QUEUE_DEPTH,
    SATURATED,
    ModelCatalog,
    QueueDepth,
    Registry,
)
from sie_sidecar.telemetry.lane_metrics import LaneMetrics
from sie_sidecar.telemetry.registry import Histogram
from sie_sidecar.wire.histogram import BatchInstruments as NativeBatchInstruments

# --- the registry ----------------------------------------------------------------------------------


def test_instruments_are_keyed_by_name_and_attributes() -> None:
    r = Registry()
    a = r.counter("requests", (("method", "ping"),))
    assert r.counter("requests", (("method", "ping"),)) is a  # looked up once, recorded into cheaply
    b = r.counter("requests", (("method", "run_batch"),))
    a.add()
    a.add(2)
    b.add(5)
    r.add("requests", 1, (("method", "ping"),))
    assert r.value("requests", (("method", "ping"),)) == 4 and r.value("requests", (("method", "run_batch"),)) == 5
    assert r.total("requests") == 9
    assert r.value("never recorded") == 0 and r.total("never recorded") == 0
    with pytest.raises(ValueError, match="cannot decrease"):
        a.add(-1)


def test_gauges_are_set_or_moved_by_deltas() -> None:
    r = Registry()
    g = r.gauge("depth")
    g.add(10)
    g.add(-3)
    assert r.value("depth") == 7
    r.set("depth", 2)
    assert g.value == 2


def test_histograms_count_into_buckets() -> None:
    r = Registry()
    h = r.histogram("size", (("operation", "encode"),), bounds=(1, 4, 16))
    for v in (1, 2, 4, 5, 100):
        h.record(v)
    assert h.buckets == [1, 2, 1, 1]  # <=1, (1,4], (4,16], >16
    assert (h.count, h.sum, h.min, h.max) == (5, 112, 1, 100)
    r.record("latency", 0.5)  # default bounds
    assert r.value("latency") == 0.5
    empty = r.histogram("empty")
    assert (empty.count, empty.min, empty.max) == (0, math.inf, -math.inf)
    with pytest.raises(ValueError, match="increasing"):
        r.histogram("bad", bounds=(4, 1))


finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)


@given(
    values=st.lists(st.one_of(finite, st.sampled_from([0.0, 1.0, 4.0, 16.0, 0.0005, 0.001])), max_size=80),
    bounds=st.lists(finite, min_size=1, max_size=12, unique=True).map(sorted).map(tuple),
    before=st.lists(finite, max_size=5),
)
def test_record_many_is_record_per_value(values: list[float], bounds: tuple[float, ...], before: list[float]) -> None:
    """A batch recorded at once (sorted, a bisect per bucket reached) lands exactly where one
    `record` per value would, on bounds and between them, on top of earlier observations."""
    one, many = Histogram("h", (), bounds), Histogram("h", (), bounds)
    for v in before:
        one.record(v)
        many.record(v)
    for v in values:
        one.record(v)
    many.record_many(iter(values))  # any iterable: the scheduler passes a map
    assert many.buckets == one.buckets and many.count == one.count
    assert (many.min, many.max) == (one.min, one.max)
    assert many.sum == pytest.approx(one.sum, rel=1e-9, abs=1e-6)


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("record"), finite),
        st.tuples(st.just("record_n"), finite, st.integers(-2, 5)),
        st.tuples(st.just("record_many"), st.lists(finite, max_size=70)),
    ),
    max_size=12,
)


@pytest.mark.skipif(not wire.USING_NATIVE, reason="the compiled histogram")
@given(ops=_ops, bounds=st.lists(finite, max_size=12, unique=True).map(sorted).map(tuple))
def test_the_compiled_histogram_and_its_twin_agree(ops: list[tuple[Any, ...]], bounds: tuple[float, ...]) -> None:
    """The registry's compiled histogram bins, counts and bounds as the twin does, for every way a
    stage records (the sum up to float rounding: the twin adds a batch with `math.fsum`)."""
    native, twin = Histogram("h", (("k", "v"),), bounds), PyHistogram("h", (("k", "v"),), bounds)
    assert not isinstance(native, PyHistogram)  # the compiled one
    for op, *args in ops:
        assert getattr(native, op)(*args) == getattr(twin, op)(*args)
    assert (native.name, native.attrs, native.kind, native.bounds) == (twin.name, twin.attrs, twin.kind, twin.bounds)
    assert (native.buckets, native.count, native.min, native.max) == (twin.buckets, twin.count, twin.min, twin.max)
    assert native.sum == pytest.approx(twin.sum, rel=1e-9, abs=1e-6)


_batch = st.tuples(
    st.lists(finite, max_size=70),  # enqueue times
    finite,  # taken at
    st.integers(0, 1000),  # items
    st.integers(0, 10**6),  # cost
    finite,  # dispatched
    st.one_of(st.none(), finite),  # answered (None: the backend never did)
)


def _five(kind: type[Any], bounds: tuple[float, ...]) -> list[Any]:
    return [kind(name, (("k", "v"),), bounds) for name in ("queue", "size", "cost", "wait", "total")]


@pytest.mark.skipif(not wire.USING_NATIVE, reason="the compiled instruments")
@given(batches=st.lists(_batch, max_size=8), bounds=st.lists(finite, max_size=12, unique=True).map(sorted).map(tuple))
def test_the_compiled_batch_instruments_and_their_twin_agree(
    batches: list[tuple[Any, ...]], bounds: tuple[float, ...]
) -> None:
    """A lane's one call a batch records into its five histograms as the twin does, and returns the
    same oldest enqueue time."""
    natives, twins = _five(Histogram, bounds), _five(PyHistogram, bounds)
    native, twin = NativeBatchInstruments(*natives), TwinBatchInstruments(*twins)
    for batch in batches:
        assert native.record(*batch) == twin.record(*batch)
    for n, t in zip(natives, twins, strict=True):
        assert (n.buckets, n.count, n.min, n.max) == (t.buckets, t.count, t.min, t.max)
        assert n.sum == pytest.approx(t.sum, rel=1e-9, abs=1e-6)


@pytest.mark.parametrize("kind", [Histogram, PyHistogram])
def test_batch_instruments_record_queue_times_always_and_the_rest_when_answered(kind: type[PyHistogram]) -> None:
    bounds = (0.5, 1.0, 2.0, 4.0, 8.0)
    queue, size, cost, wait, total = hs = _five(kind, bounds)
    instruments: Any = NativeBatchInstruments if kind is not PyHistogram else TwinBatchInstruments
    record = instruments(*hs).record
    assert record([10.0, 9.0, 9.5], 11.0, 3, 30, 12.0) == 9.0  # refused: queue times only
    assert queue.count == 3 and queue.sum == pytest.approx(1.0 + 2.0 + 1.5)
    assert (size.count, cost.count, wait.count, total.count) == (0, 0, 0, 0)
    assert record([20.0, 19.0], 21.0, 2, 40, 22.0, 24.0) == 19.0  # answered
    assert queue.count == 5 and (size.sum, cost.sum) == (2.0, 40.0)
    assert (wait.sum, total.sum) == (3.0, 5.0)  # the oldest item's enqueue -> dispatched, -> answered
    assert record([], 30.0, 0, 0, 31.0, 32.0) is None  # no items: the waits count from the dispatch
    assert (wait.max, total.max) == (3.0, 5.0) and (wait.min, total.min) == (0.0, 1.0)


@pytest.mark.parametrize("kind", [Histogram, PyHistogram])
def test_histograms_refuse_bad_bounds_and_values(kind: type[PyHistogram]) -> None:
    with pytest.raises(ValueError, match="h bounds must be strictly increasing"):
        kind("h", (), (1.0, 1.0))
    h = kind("h", (), (1.0,))
    with pytest.raises(TypeError):
        h.record_many(["1.0"])  # type: ignore[list-item]
    h.record_n(2.0, 0)
    assert h.count == 0


def test_one_name_has_one_kind() -> None:
    r = Registry()
    r.gauge("x")
    with pytest.raises(ValueError, match="gauge"):
        r.counter("x")
    with pytest.raises(ValueError, match="gauge"):
        r.histogram("x", (("a", "b"),))  # a new attribute set does not change the kind either


def test_snapshot_lists_every_instrument() -> None:
    r = Registry()
    r.add("c", 3)
    r.set("g", -1, (("state", "ready"),))
    r.histogram("h", bounds=(1.0,)).record(2.0)
    points = {(p.name, p.attrs): p for p in r.snapshot()}
    assert points[("c", ())].value == 3 and points[("c", ())].kind == "counter"
    assert points[("g", (("state", "ready"),))].value == -1
    h = points[("h", ())]
    assert (h.kind, h.count, h.buckets, h.bounds, h.value) == ("histogram", 1, (0, 1), (1.0,), 2.0)
    assert {i.name for i in r} == {"c", "g", "h"}


# --- what the scheduler records -------------------------------------------------------------------


class Held:
    """A dispatch function that holds every batch until released, and says when one arrived."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.batches: list[Formed[str]] = []

    async def __call__(self, formed: Formed[str]) -> None:
        self.batches.append(formed)
        self.entered.set()
        await self.release.wait()


def _load(r: Registry) -> tuple[float, float, float]:
    return r.value(PENDING_ITEMS), r.value(PENDING_COST), r.value(INFLIGHT_BATCHES)


async def test_the_scheduler_records_queued_items_their_cost_and_batches_in_flight() -> None:
    r = Registry()
    held = Held()
    config = SchedulerConfig(pipeline_depth=1, max_batch_requests=4)
    s: ModelScheduler[str] = ModelScheduler("m", held, config, telemetry=r)
    other: ModelScheduler[str] = ModelScheduler("n", held, config, telemetry=r)
    s.submit("encode", "", [f"a{i}" for i in range(10)], [3] * 10)
    async with asyncio.timeout(5):
        await held.entered.wait()  # the first batch (4 items, count cap) is in flight, the slot is taken
    assert len(held.batches[0].items) == 4
    assert _load(r) == (6, 18, 1)
    other.submit("score", "", ["b0", "b1"], [5, 7])
    assert _load(r) == (8, 30, 1)  # every scheduler moves the same gauges
    held.release.set()
    async with asyncio.timeout(5):
        while not (s.idle() and other.idle()):
            await asyncio.sleep(0.002)
    assert _load(r) == (0, 0, 0)
    assert sum(len(b.items) for b in held.batches) == 12


async def test_close_takes_what_is_left_off_the_gauges() -> None:
    r = Registry()
    held = Held()
    s: ModelScheduler[str] = ModelScheduler(
        "m", held, SchedulerConfig(pipeline_depth=1, max_batch_requests=2), telemetry=r
    )
    s.submit("encode", "", ["a", "b", "c", "d", "e"], [1, 2, 3, 4, 5])
    async with asyncio.timeout(5):
        await held.entered.wait()
    assert _load(r) == (3, 12, 1)
    left = await s.close(deadline_s=0.05)  # the held batch never finishes: nothing more is sent
    assert sorted(left) == ["c", "d", "e"]
    assert _load(r) == (0, 0, 1)  # the held batch is still running
    held.release.set()
    async with asyncio.timeout(5):
        while s.in_flight:
            await asyncio.sleep(0.002)
    assert _load(r) == (0, 0, 0)


async def test_with_metrics_the_scheduler_notes_each_batch_fill_and_take_time_and_its_depth_is_read() -> None:
    """Per batch the scheduler only stores (the cost fill by flush reason, the take time on the
    batch); the queue depth is the scheduler's own count, read when a snapshot is taken."""
    r = Registry()
    catalog = ModelCatalog(["m"])
    metrics = LaneMetrics(r, catalog, QueueDepth(r, catalog, QUEUE_DEPTH), "m")
    held = Held()
    now = [100.0]
    config = SchedulerConfig(pipeline_depth=1, max_batch_requests=4, max_batch_cost=40)
    s: ModelScheduler[str] = ModelScheduler("m", held, config, telemetry=r, metrics=metrics, clock=lambda: now[0])
    plain: ModelScheduler[str] = ModelScheduler("p", held, config, telemetry=r)
    s.submit("encode", "", [f"a{i}" for i in range(10)], [3] * 10)
    async with asyncio.timeout(5):
        await held.entered.wait()
    (first,) = held.batches
    assert first.taken_at == 100.0 and first.enqueued_at == [100.0] * 4
    assert metrics.fills == {("encode", first.reason): 12 / 40}
    encode = (("operation", "encode"), ("model", "m"), ("profile", "default"))
    assert r.value(QUEUE_DEPTH, encode) == 0  # nothing recorded as items move
    r.snapshot()
    assert r.value(QUEUE_DEPTH, encode) == 6
    fill = (*encode, ("flush.reason", first.reason))
    assert r.value(BATCH_FILL_RATIO, fill) == 0.3
    held.release.set()
    async with asyncio.timeout(5):
        while not s.idle():
            await asyncio.sleep(0.002)
    r.snapshot()
    assert r.value(QUEUE_DEPTH, encode) == 0  # an operation seen stays on the gauge, at 0
    plain.submit("encode", "", ["b"], [1])
    async with asyncio.timeout(5):
        while not plain.idle():
            await asyncio.sleep(0.002)
    assert held.batches[-1].taken_at is None  # metrics off: no clock read, nothing stored


# --- the heartbeat's load fields and saturation ---------------------------------------------------


def test_saturation_enters_at_90_percent_and_leaves_below_70() -> None:
    sat = Saturation(max_concurrent_batches=4)  # one ready slot: capacity 4
    steps = [(2, False), (3, False), (4, True), (3, True), (2, False), (3, False), (4, True), (10, True)]
    assert [(load, sat.update(load, 1)) for load, _ in steps] == steps
    assert sat.update(10, 0) is False  # no ready slot: never saturated, and the state resets
    assert sat.update(3, 1) is False
    ten = Saturation(max_concurrent_batches=5)  # two slots: capacity 10; 9 enters, 7 stays, 6 leaves
    assert [ten.update(load, 2) for load in (8, 9, 7, 6, 7)] == [False, True, True, False, False]
    assert Saturation(max_concurrent_batches=0).update(1, 1) is True  # capacity is at least 1


def _ready(children: int = 1) -> Readiness:
    readiness = Readiness(ping_interval_ms=60_000)
    readiness.last_ping_ok = time.monotonic()
    readiness.ready_children = children
    return readiness


def _beat(reporter: HealthReporter, **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(reporter.payload("h", **kw))
    return body


def test_the_heartbeat_reports_the_registry_and_the_hysteresis() -> None:
    r = Registry()
    reporter = HealthReporter(HealthIdentity("w", "cpu", "p", "b"), _ready(), r, max_concurrent_batches=4)
    load = ("queue_depth", "pending_cost", "inflight_batches", "saturated")
    assert [_beat(reporter)[k] for k in load] == [0, 0, 0, False]
    r.gauge(PENDING_ITEMS).add(2)
    r.gauge(PENDING_COST).add(700)
    r.gauge(INFLIGHT_BATCHES).add(1)
    assert [_beat(reporter)[k] for k in load] == [2, 700, 1, False]  # load 3 of capacity 4: 75 %
    r.gauge(INFLIGHT_BATCHES).add(1)
    assert [_beat(reporter)[k] for k in load] == [2, 700, 2, True]  # 100 % >= 90 %
    r.gauge(PENDING_ITEMS).add(-1)
    assert _beat(reporter)["saturated"] is True  # 75 % >= 70 %: still saturated
    assert r.value(SATURATED) == 1
    r.gauge(PENDING_ITEMS).add(-1)
    assert _beat(reporter)["saturated"] is False  # 50 % < 70 %
    assert r.value(SATURATED) == 0
    assert (r.value(GPU_SLOTS, (("state", "total"),)), r.value(GPU_SLOTS, (("state", "ready"),))) == (1, 1)
    r.gauge(PENDING_ITEMS).add(10)
    tomb = _beat(reporter, terminated=True)
    assert (tomb["terminated"], tomb["ready_gpu_slots"], tomb["queue_depth"], tomb["saturated"]) == (True, 0, 10, False)


def test_not_ready_is_never_saturated() -> None:
    r = Registry()
    r.gauge(PENDING_ITEMS).add(100)
    reporter = HealthReporter(HealthIdentity("w", "cpu", "p", "b"), Readiness(), r)  # handshake pending
    beat = _beat(reporter)
    assert (beat["ready"], beat["ready_gpu_slots"], beat["queue_depth"], beat["saturated"]) == (False, 0, 100, False)
