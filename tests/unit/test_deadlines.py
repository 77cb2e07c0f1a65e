# SPDX-License-Identifier: Apache-2.0
"""Work deadlines (sidecar-behaviour §15.3): the lenient `deadline` field in both decoders and in the
in-place parse, the native batch functions against their twins (deliveries read in place, decoded,
edited, and the dataclass), the rules at their edges, and the lease book on a manual clock."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar import wire
from sie_sidecar._twins.deadlines import deadline_lease_holders as deadline_lease_holders_py
from sie_sidecar._twins.deadlines import deadline_split as deadline_split_py
from sie_sidecar._twins.deadlines import work_item_ages as work_item_ages_py
from sie_sidecar._twins.workitem import decode_work_item as decode_work_item_py
from sie_sidecar.pipeline.deadlines import DeadlineLeases, DeadlineRules
from sie_sidecar.pipeline.delivery import Delivery
from sie_sidecar.wire.workitem import decode_work_item

from .test_columns import Msg
from .test_lazy_delivery import _scanned
from .test_run_batch_body import BASE

native = pytest.mark.skipif(not wire.USING_NATIVE, reason="the native functions are the extension's")

NOW = 1_700_000_000.0
KINDS = ("lazy", "decoded", "edited", "dataclass")


def _payload(n: int, op: str, timestamp: Any, deadline: Any, with_deadline: bool = True) -> bytes:
    fields = {**BASE, "work_item_id": f"r{n}.0", "operation": op, "timestamp": timestamp}
    if with_deadline:
        fields["deadline"] = deadline
    return bytes(msgpack.packb(fields))


# ------------------------------------------------------------------------------------------ decoding


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (7, 7.0),
        (-3, -3.0),
        (1.25, 1.25),
        (2**64 - 1, float(2**64 - 1)),
        ("soon", None),
        (True, None),
        ({"at": 1}, None),
        ([1.0], None),
        (b"\x01", None),
    ],
)
def test_a_deadline_that_is_not_a_number_decodes_as_absent(value: Any, expected: float | None) -> None:
    """wire-protocol §7.2 lenient numbers: never an error, a non-number is absent."""
    payload = _payload(0, "encode", NOW, value)
    assert decode_work_item(payload).deadline == expected
    assert decode_work_item_py(payload).deadline == expected


def test_an_absent_deadline_is_none_and_a_float32_one_is_read() -> None:
    assert decode_work_item(_payload(0, "encode", NOW, None, with_deadline=False)).deadline is None
    packed = msgpack.packb({**BASE, "deadline": 1.5}, use_single_float=True)
    assert decode_work_item(packed).deadline == decode_work_item_py(packed).deadline == 1.5


@native
@pytest.mark.parametrize("value", [None, 5, NOW + 1.5, "x", True, {"a": [1, 2]}, [None], math.inf, math.nan])
def test_the_in_place_parse_reads_the_deadline_as_the_decoder_does(value: Any) -> None:
    """A delivery still read in place is judged by the value the decoder would give."""
    from sie_sidecar._native import deadline_split

    payload = _payload(0, "encode", NOW - 1, value)
    (lazy,) = _scanned([payload], make_run=True)
    decoded = Delivery(msg=Msg(0), worker_direct=False, item=decode_work_item(payload))
    got = deadline_split([lazy], NOW, 5.0, 180.0)
    want = deadline_split_py([decoded], NOW, 5.0, 180.0)
    assert got[2:] == want[2:] and len(got[1]) == len(want[1])


# ------------------------------------------------------------------------------------------ the rules


def _d(op: str = "encode", timestamp: float = NOW - 1, deadline: float | None = None) -> Delivery:
    fields = {**BASE, "operation": op, "timestamp": timestamp}
    if deadline is not None:
        fields["deadline"] = deadline
    return Delivery(msg=Msg(0), worker_direct=False, item=decode_work_item(msgpack.packb(fields)))


def test_usable_deadlines_at_their_edges() -> None:
    fresh = _d(deadline=NOW + 10)
    expired = _d(timestamp=NOW - 30, deadline=NOW - 6)  # 6 s late: past the 5 s skew
    within_skew = _d(timestamp=NOW - 30, deadline=NOW - 4)
    budget_too_long = _d(timestamp=NOW - 1, deadline=NOW - 1 + 181)
    before_timestamp = _d(timestamp=NOW, deadline=NOW - 1)
    no_timestamp = _d(timestamp=0.0, deadline=NOW + 1)
    generate = _d(op="generate", deadline=NOW - 100)
    absent = _d()
    ds = [fresh, expired, within_skew, budget_too_long, before_timestamp, no_timestamp, generate, absent]
    live, gone, usable, ignored, ahead, latest = deadline_split_py(ds, NOW, 5.0, 180.0)
    assert gone == [expired]
    assert live == [d for d in ds if d is not expired]
    assert (usable, ignored, ahead) == (2, 3, 0)
    assert latest == NOW + 10
    # Exactly at the budget is usable; a timestamp more than the skew ahead is observed.
    at_budget = _d(timestamp=NOW - 1, deadline=NOW - 1 + 180)
    ahead_of_us = _d(timestamp=NOW + 6, deadline=NOW + 20)
    assert deadline_split_py([at_budget, ahead_of_us], NOW, 5.0, 180.0)[2:] == (2, 0, 1, NOW - 1 + 180)


def test_nothing_expired_returns_the_same_list() -> None:
    ds = [_d(deadline=NOW + 10), _d()]
    assert deadline_split_py(ds, NOW, 5.0, 180.0)[0] is ds


def test_the_run_batch_wait_follows_the_latest_deadline_capped_at_the_budget() -> None:
    rules = DeadlineRules(skew_s=5.0, max_budget_s=180.0)
    assert rules.run_batch_timeout_s(60.0, None, NOW) == 60.0
    assert rules.run_batch_timeout_s(60.0, NOW + 30, NOW) == 60.0  # never shorter than the IPC timeout
    assert rules.run_batch_timeout_s(60.0, NOW + 100, NOW) == 100.0
    assert rules.run_batch_timeout_s(60.0, NOW + 900, NOW) == 180.0


def test_lease_horizons() -> None:
    d = _d(deadline=NOW + 10)
    enforce: dict[str, Any] = {"skew_s": 5.0, "max_budget_s": 180.0, "enforce": True, "cap": math.inf}
    assert deadline_lease_holders_py([d], NOW + 14, **enforce) == [d]
    assert deadline_lease_holders_py([d], NOW + 15, **enforce) == []
    lenient = {**enforce, "enforce": False}
    assert deadline_lease_holders_py([d], NOW + 194, **lenient) == [d]
    assert deadline_lease_holders_py([d], NOW + 195, **lenient) == []
    assert deadline_lease_holders_py([d], NOW + 50, **{**lenient, "cap": NOW + 50}) == []  # tombstone horizon
    d.settled = True
    assert deadline_lease_holders_py([d], NOW, **lenient) == []


def test_ages_skip_items_without_a_timestamp() -> None:
    ds = [_d(timestamp=NOW - 2.5), _d(timestamp=0.0), _d(timestamp=NOW + 3)]
    assert work_item_ages_py(ds, NOW) == [2.5, 0.0]


# ------------------------------------------------------------------------------------------ parity

TIMESTAMPS = [0.0, NOW - 1, NOW + 10, NOW - 500]
DEADLINES: list[Any] = [None, "late", NOW + 30, NOW - 2, NOW - 60, NOW + 1000, math.inf, -1.0, 0]
OPS = ["encode", "score", "generate"]


def _deliveries(plan: list[tuple[str, int, int, int, bool]]) -> list[Any]:
    out: list[Any] = []
    for n, (kind, op, ts, dl, settled) in enumerate(plan):
        payload = _payload(n, OPS[op], TIMESTAMPS[ts], DEADLINES[dl], with_deadline=dl != 0)
        if kind == "dataclass":
            d: Any = Delivery(msg=Msg(n), worker_direct=False, item=decode_work_item(payload))
        else:
            (d,) = _scanned([payload], make_run=True)
            if kind in ("decoded", "edited"):
                item = d.item
                if kind == "edited":
                    item.deadline = NOW + 3.0
        d.settled = settled
        out.append(d)
    return out


plans = st.lists(
    st.tuples(
        st.sampled_from(KINDS),
        st.integers(0, len(OPS) - 1),
        st.integers(0, len(TIMESTAMPS) - 1),
        st.integers(0, len(DEADLINES) - 1),
        st.booleans(),
    ),
    max_size=10,
)


def _names(ds: list[Any]) -> list[str]:
    return [d.item.work_item_id for d in ds]


@native
@given(plan=plans, skew=st.sampled_from([0.0, 5.0]), budget=st.sampled_from([60.0, 180.0]), enforce=st.booleans())
def test_the_native_functions_match_their_twins(plan: Any, skew: float, budget: float, enforce: bool) -> None:
    from sie_sidecar._native import deadline_lease_holders, deadline_split

    got = deadline_split(_deliveries(plan), NOW, skew, budget)
    want = deadline_split_py(_deliveries(plan), NOW, skew, budget)
    assert (_names(got[0]), _names(got[1]), *got[2:]) == (_names(want[0]), _names(want[1]), *want[2:])
    cap = NOW + 100
    got_holders = deadline_lease_holders(_deliveries(plan), NOW, skew, budget, enforce, cap)
    want_holders = deadline_lease_holders_py(_deliveries(plan), NOW, skew, budget, enforce, cap)
    assert _names(got_holders) == _names(want_holders)


@native
def test_the_native_split_keeps_the_list_when_nothing_expired() -> None:
    from sie_sidecar._native import deadline_split

    ds = _deliveries([("lazy", 0, 1, 2, False), ("dataclass", 0, 1, 0, False)])
    assert deadline_split(ds, NOW, 5.0, 180.0)[0] is ds


# ------------------------------------------------------------------------------------------ leases


class Clock:
    def __init__(self) -> None:
        self.wall, self.mono = NOW, 100.0

    def advance(self, s: float) -> None:
        self.wall += s
        self.mono += s


def _leases(clock: Clock, rules: DeadlineRules | None = None) -> tuple[DeadlineLeases, list[list[Any]]]:
    progressed: list[list[Any]] = []

    async def progress(ds: list[Any]) -> None:
        progressed.append(list(ds))

    book = DeadlineLeases(rules or DeadlineRules(), progress, wall=lambda: clock.wall, clock=lambda: clock.mono)
    return book, progressed


async def test_a_held_lease_is_progressed_once_it_went_five_seconds_without() -> None:
    clock = Clock()
    book, progressed = _leases(clock)
    a, b = _d(deadline=NOW + 60), _d(deadline=NOW + 60)
    book.hold([a, b])
    clock.advance(4.9)
    assert await book.tick() == 0
    clock.advance(0.2)
    assert await book.tick() == 2 and progressed == [[a, b]]
    clock.advance(3.0)
    assert await book.tick() == 0  # progressed 3 s ago
    a.settled = True
    clock.advance(2.5)
    assert await book.tick() == 1 and progressed[-1] == [b]
    b.settled = True
    clock.advance(0.1)
    await book.tick()
    assert len(book) == 0  # settled leases are dropped


async def test_a_lease_ends_at_its_horizon() -> None:
    clock = Clock()
    book, _ = _leases(clock, DeadlineRules(enforce=True, skew_s=5.0))
    d = _d(deadline=NOW + 8)  # enforcing: the lease runs until deadline + skew = NOW + 13
    book.hold([d])
    clock.advance(6)
    assert await book.tick() == 1
    clock.advance(6)
    assert await book.tick() == 1  # NOW + 12
    clock.advance(6)
    assert await book.tick() == 0 and len(book) == 0  # NOW + 18: past the horizon


async def test_leases_pause_while_paused_and_resume() -> None:
    clock = Clock()
    book, _ = _leases(clock)
    book.hold([_d(deadline=NOW + 60)])
    reason: list[str | None] = ["draining"]
    book.paused = lambda: reason[0]
    clock.advance(6)
    assert await book.tick() == 0 and book.paused_ticks == 1
    reason[0] = None
    assert await book.tick() == 1


async def test_settled_batches_leave_from_the_front_as_new_ones_come() -> None:
    clock = Clock()
    book, _ = _leases(clock)
    first = [_d(deadline=NOW + 60)]
    book.hold(first)
    first[0].settled = True
    book.hold([_d(deadline=NOW + 60)])
    assert len(book) == 1


async def test_settled_leases_are_swept_once_the_book_grows() -> None:
    """Settled deliveries are not kept until the next tick: at PRUNE_AT leases, `hold` sweeps every
    settled one (not only those at the front), so the book follows what is really held."""
    from sie_sidecar.pipeline.deadlines import PRUNE_AT

    clock = Clock()
    book, _ = _leases(clock)
    stuck = _d(deadline=NOW + 60)
    book.hold([stuck])  # held for the whole test: the front never empties
    for _ in range(3 * PRUNE_AT):
        batch = [_d(deadline=NOW + 60)]
        book.hold(batch)
        batch[0].settled = True
    assert len(book) <= PRUNE_AT + 1
    stuck.settled = True
    book.hold([_d(deadline=NOW + 60)])
    assert len(book) == 1


def test_local_rules_judge_nothing() -> None:
    assert DeadlineRules().judge and not DeadlineRules(judge=False).judge
