# SPDX-License-Identifier: Apache-2.0
"""`pipeline.columns` (issue 30): what the dispatcher reads across a batch in one native call gives exactly
what its Python twin gives, for deliveries still read in place, decoded ones (edited too) and the
`Delivery` dataclass; and the config gate over those hashes decides as the per-item gate did."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar import wire
from sie_sidecar._twins.columns import config_hashes as config_hashes_py
from sie_sidecar._twins.columns import request_latencies_ms as request_latencies_ms_py
from sie_sidecar._twins.columns import run_batch_columns as run_batch_columns_py
from sie_sidecar._twins.columns import unsettled as unsettled_py
from sie_sidecar.pipeline.config_gate import ConfigState
from sie_sidecar.pipeline.delivery import Delivery
from sie_sidecar.wire.workitem import decode_work_item

from .test_lazy_delivery import _scanned
from .test_run_batch_body import BASE

native = pytest.mark.skipif(not wire.USING_NATIVE, reason="the native columns are the extension's")

HASHES = ["", "", "cfg-a", "cfg-b"]
KINDS = ("lazy", "decoded", "edited", "dataclass")


class Msg:
    def __init__(self, n: int) -> None:
        self.subject, self.data, self.reply = "sie.work.x", b"", f"$JS.ACK.s.c.1.{n}.{n}.0.0"

    async def ack(self) -> None: ...
    async def nak(self, delay: int | float | None = None) -> None: ...
    async def in_progress(self) -> None: ...


def _payload(n: int, config_hash: str, **fields: Any) -> bytes:
    return bytes(msgpack.packb({**BASE, "work_item_id": f"r{n}.0", "bundle_config_hash": config_hash, **fields}))


def _deliveries(
    plan: list[tuple[str, int, float, bool]], each: Sequence[dict[str, Any]] = (), **fields: Any
) -> list[Any]:
    """One delivery per (kind, hash index, fetch ms, tokens) of `plan`, made fresh each call; `fields`
    are set in every WorkItem, `each[n]` in the n-th."""
    out: list[Any] = []
    for n, (kind, h, ms, tokens) in enumerate(plan):
        payload = _payload(n, HASHES[h], **fields, **(each[n] if n < len(each) else {}))
        if kind == "dataclass":
            d: Any = Delivery(msg=Msg(n), worker_direct=False, item=decode_work_item(payload))
        else:
            (d,) = _scanned([payload], make_run=True)
            if kind in ("decoded", "edited"):
                item = d.item  # decoded from now on: the WorkItem is the truth
                if kind == "edited":
                    item.bundle_config_hash = HASHES[(h + 1) % len(HASHES)]
        d.payload_fetch_ms = ms
        d.prepared_tokens = {"input_ids": [[n]]} if tokens else None
        out.append(d)
    return out


plans = st.lists(
    st.tuples(st.sampled_from(KINDS), st.integers(0, len(HASHES) - 1), st.sampled_from([0.0, 1.5]), st.booleans()),
    max_size=12,
)


def _ids(values: list[Any] | None) -> Any:
    """Items compared by what they are: a delivery read in place by its work item id."""
    if values is None:
        return None
    return [v.work_item_id if hasattr(v, "work_item_id") else repr(v) for v in values]


@native
@given(plan=plans)
def test_config_hashes_match_the_twin(plan: list[tuple[str, int, float, bool]]) -> None:
    from sie_sidecar._native import config_hashes

    assert config_hashes(_deliveries(plan)) == config_hashes_py(_deliveries(plan))


@native
@given(plan=plans, op=st.sampled_from(["encode", "score", "extract"]))
def test_run_batch_columns_match_the_twin(plan: list[tuple[str, int, float, bool]], op: str) -> None:
    from sie_sidecar._native import run_batch_columns

    got = run_batch_columns(_deliveries(plan), op)
    want = run_batch_columns_py(_deliveries(plan), op)
    assert len(got[0]) == len(want[0]) == len(plan)
    assert [type(i).__name__ for i in got[0]] == [type(i).__name__ for i in want[0]]
    assert [wire_item_id(i) for i in got[0]] == [wire_item_id(i) for i in want[0]]
    assert got[1:] == want[1:]


def _implementations() -> list[Any]:
    """`run_batch_columns` of the extension (where built) and of the twin."""
    found: list[Any] = [pytest.param(run_batch_columns_py, id="twin")]
    if wire.USING_NATIVE:
        from sie_sidecar._native import run_batch_columns

        found.append(pytest.param(run_batch_columns, id="native"))
    return found


@pytest.mark.parametrize("columns", _implementations())
@pytest.mark.parametrize("kind", KINDS)
def test_the_columns_call_records_each_items_work_item_age_now(columns: Any, kind: str) -> None:
    """With metrics on the ages are recorded by the call that reads the items (§5.6, issue 32), at
    the wall clock of that call, and the columns are the same as without."""
    from sie_sidecar.telemetry import Registry

    histogram = Registry().histogram("age", (), (1.0, 2e9))
    plan = [(kind, 0, 0.0, False)] * 3
    timestamp = 1.5  # every item is about 56 years old
    ds = _deliveries(plan, timestamp=timestamp)
    before = time.time()
    got = columns(ds, "score", histogram)
    after = time.time()
    assert histogram.count == 3 and list(histogram.buckets) == [0, 3, 0]
    assert 3 * (before - timestamp) <= histogram.sum <= 3 * (after - timestamp)
    plain = columns(_deliveries(plan, timestamp=timestamp), "score", None)
    assert [wire_item_id(i) for i in got[0]] == [wire_item_id(i) for i in plain[0]] and got[1:] == plain[1:]
    assert histogram.count == 3  # None: nothing recorded


#: Each item's timestamp: absent, not positive (not recorded), or seconds from now (ahead: age 0).
STAMPS = (None, 0.0, -3.0, "+100", "-5", "-30", "-120")


@native
@given(plan=plans, picks=st.lists(st.integers(0, len(STAMPS) - 1), min_size=12, max_size=12))
def test_the_columns_call_records_the_ages_the_twin_records(
    plan: list[tuple[str, int, float, bool]], picks: list[int]
) -> None:
    """The work-item ages the compiled call records (§5.6) are the twin's, item by item: skipped
    without a positive timestamp, never negative, seconds from the timestamp to the call."""
    from sie_sidecar._native import run_batch_columns
    from sie_sidecar.telemetry import Registry

    now = time.time()
    each: list[dict[str, Any]] = []
    for p in picks:
        stamp = STAMPS[p]
        each.append({} if stamp is None else {"timestamp": now + float(stamp) if isinstance(stamp, str) else stamp})
    bounds = (0.5, 1.0, 60.0)  # every age sits seconds away from a bound: the calls' clocks differ by µs
    native_ages, twin_ages = Registry().histogram("a", (), bounds), Registry().histogram("b", (), bounds)
    run_batch_columns(_deliveries(plan, each), "encode", native_ages)
    run_batch_columns_py(_deliveries(plan, each), "encode", twin_ages)
    assert native_ages.count == twin_ages.count
    assert list(native_ages.buckets) == list(twin_ages.buckets)
    assert native_ages.sum == pytest.approx(twin_ages.sum, abs=0.5)
    offsets = [float(s) for s in (STAMPS[p] for p in picks[: len(plan)]) if isinstance(s, str)]
    assert twin_ages.count == len(offsets)
    assert twin_ages.sum == pytest.approx(sum(max(0.0, -offset) for offset in offsets), abs=0.5)


CONTEXTS = (
    "",
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
    "not a context",
)


@pytest.mark.parametrize("columns", _implementations())
@given(plan=plans, picks=st.lists(st.integers(0, len(CONTEXTS) - 1), min_size=12, max_size=12))
def test_the_columns_call_gathers_the_items_distinct_contexts(
    columns: Any, plan: list[tuple[str, int, float, bool]], picks: list[int]
) -> None:
    """Tracing on, the call that reads the items also gathers their distinct non-empty trace
    contexts, in order (the batch span's parent and links, §5.4): what the tracer reads from the
    items themselves, and the columns are the same as without."""
    from sie_sidecar.otel.tracing import Sampler, SpanBuffer
    from sie_sidecar.wire.batch_spans import BatchTracer

    if columns is run_batch_columns_py:  # the twin's items are WorkItems (no delivery read in place)
        plan = [("decoded" if kind == "lazy" else kind, *rest) for kind, *rest in plan]  # type: ignore[misc]
    each = [{"traceparent": CONTEXTS[p]} for p in picks]
    contexts: list[str] = []
    got = columns(_deliveries(plan, each), "score", None, contexts)
    assert contexts == [c for c in dict.fromkeys(CONTEXTS[p] for p in picks[: len(plan)]) if c]
    plain = columns(_deliveries(plan, each), "score", None)
    assert [wire_item_id(i) for i in got[0]] == [wire_item_id(i) for i in plain[0]] and got[1:] == plain[1:]
    buffer = SpanBuffer()
    tracer = BatchTracer(Sampler("always_on"), buffer)
    for traceparents in (got[0], contexts):
        span = tracer.start_batch("m", "score", len(got[0]), 1, traceparents)
        assert span is not None
        span.end()
    from_items, from_contexts = buffer.take()
    assert from_contexts.parent_span_id == from_items.parent_span_id
    assert from_contexts.links == from_items.links
    if from_items.parent_span_id:
        assert from_contexts.trace_id == from_items.trace_id


@native
def test_contexts_are_appended_as_the_batch_has_them_in_both_implementations() -> None:
    """A list that already holds contexts gets the batch's distinct ones appended, the same by the
    compiled call and the twin (the dispatcher passes an empty list)."""
    from sie_sidecar._native import run_batch_columns

    each = [{"traceparent": CONTEXTS[p]} for p in (1, 2, 1, 0)]
    plan = [("decoded", 0, 0.0, False)] * 4
    got: list[str] = [CONTEXTS[1]]
    want: list[str] = [CONTEXTS[1]]
    run_batch_columns(_deliveries(plan, each), "score", None, got)
    run_batch_columns_py(_deliveries(plan, each), "score", None, want)
    assert got == want == [CONTEXTS[1], CONTEXTS[1], CONTEXTS[2]]


def wire_item_id(item: Any) -> str:
    """A RunBatch writer input's work item id: an undecoded delivery's, or its WorkItem's."""
    return str(item.work_item_id) if hasattr(item, "work_item_id") else str(item.item.work_item_id)


def test_columns_are_none_where_every_entry_is_the_default() -> None:
    """What lets the writer skip the column: no fetch time, no tokens, no audio anywhere."""
    ds = [Delivery(msg=Msg(n), worker_direct=False, item=decode_work_item(_payload(n, ""))) for n in range(3)]
    items, fetch_ms, tokens, audio = run_batch_columns_py(ds, "encode")
    assert len(items) == 3 and (fetch_ms, tokens, audio) == (None, None, None)
    ds[1].payload_fetch_ms = 2.0
    assert run_batch_columns_py(ds, "encode")[1] == [0.0, 2.0, 0.0]


@native
@given(
    rids=st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=16),
    data=st.data(),
)
def test_request_latencies_match_the_twin(rids: list[str], data: st.DataObject) -> None:
    from sie_sidecar._native import request_latencies_ms

    enqueued = data.draw(st.lists(st.floats(0, 10, allow_nan=False), min_size=len(rids), max_size=len(rids)))
    succeeded = data.draw(st.lists(st.sampled_from(["a", "b", "c", "e"]), unique=True))
    finished = data.draw(st.floats(0, 12, allow_nan=False))
    assert request_latencies_ms(rids, enqueued, succeeded, finished) == request_latencies_ms_py(
        rids, enqueued, succeeded, finished
    )


def test_a_request_latency_runs_from_its_first_item() -> None:
    got = request_latencies_ms_py(["a", "b", "a"], [1.0, 2.0, 0.5], {"b": None, "a": None, "z": None}, 3.0)
    assert got == [1000.0, 2000.0]  # b from 2.0; a from its first item (1.0, not 0.5); z not in the batch


@given(plan=plans, current=st.sampled_from(HASHES))
def test_the_gate_over_distinct_hashes_decides_as_the_item_gate(
    plan: list[tuple[str, int, float, bool]], current: str
) -> None:
    """Pinned, legacy-only or refused, and `on_refused` called exactly when the item gate calls it."""
    from sie_sidecar.pipeline.columns import config_hashes

    def state() -> tuple[ConfigState, list[int]]:
        calls: list[int] = []
        s = ConfigState()
        s._hash = current
        s.on_refused = lambda: calls.append(1)
        return s, calls

    by_items, item_calls = state()
    by_hashes, hash_calls = state()
    ds = _deliveries(plan)
    assert by_hashes.gate_hashes(config_hashes(ds)) == by_items.gate(d.wire_item for d in ds)
    assert hash_calls == item_calls


@native
def test_percentile_window_extend_is_push_in_order() -> None:
    from sie_sidecar._native import PercentileWindow
    from sie_sidecar._twins.controller import PercentileWindow as Twin

    for cls in (PercentileWindow, Twin):
        one, many = cls(4), cls(4)
        values = [3.0, float("nan"), 1.0, 2.0, 5.0, 4.0]
        for v in values:
            one.push(v)
        assert many.extend(values) == 5  # NaN is dropped
        assert many.values() == one.values() == [1.0, 2.0, 5.0, 4.0]


@native
def test_equal_request_ids_that_are_distinct_objects_are_one_request() -> None:
    """Each item's request id is its own str object (the framer makes them): equal text is one request."""
    from sie_sidecar._native import request_latencies_ms

    parts = ["req", "-", "1"]
    a, b = "".join(parts), "".join(parts)
    assert a == b and a is not b
    assert request_latencies_ms([a, b], [1.0, 0.5], ["".join(parts)], 2.0) == [1000.0]


@native
@given(plan=plans, settled=st.lists(st.booleans(), max_size=12))
def test_unsettled_matches_the_twin(plan: list[tuple[str, int, float, bool]], settled: list[bool]) -> None:
    """The deliveries left to settle, in order; the very list when none was settled (no copy)."""
    from sie_sidecar._native import unsettled

    def batch() -> list[Any]:
        ds = _deliveries(plan)
        for d, s in zip(ds, settled, strict=False):
            d.settled = s
        return ds

    native_in, twin_in = batch(), batch()
    native_out, twin_out = unsettled(native_in), unsettled_py(twin_in)
    assert [native_in.index(d) for d in native_out] == [twin_in.index(d) for d in twin_out]
    assert (native_out is native_in) == (twin_out is twin_in) == (not any(d.settled for d in twin_in))
