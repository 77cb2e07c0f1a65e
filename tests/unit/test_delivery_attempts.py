# SPDX-License-Identifier: Apache-2.0
"""Delivery attempts read from JetStream ACK subjects: the native core and its twin agree, a tally
takes what its runs read, and the recording counts first deliveries and redeliveries
(sidecar-behaviour §13)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar import _native
from sie_sidecar.bus.attempts import AttemptTally, record_counts
from sie_sidecar.telemetry import NATS_DELIVERY_ATTEMPTS, NATS_OPERATIONS, Registry
from sie_sidecar.wire._switch import twin

_twin = twin("attempts")


@dataclass
class Msg:
    reply: object


def v1(delivered: str) -> str:
    return f"$JS.ACK.WORK.w1.{delivered}.10.7.1700000000000000000.4"


def v2(delivered: str) -> str:
    return f"$JS.ACK.hub.HASH.WORK.w1.{delivered}.10.7.1700000000000000000.4.tok"


def test_both_forms_and_junk() -> None:
    messages = [Msg(v1("1")), Msg(v2("3")), Msg(v1("3")), Msg(None), Msg("_INBOX.a"), Msg(v1("x")), Msg(v1("1"))]
    expected = ([(1, 2), (3, 2)], 3)
    assert _native.delivery_attempts(messages) == expected
    assert _twin.delivery_attempts(messages) == expected


tokens = st.one_of(
    st.integers(0, 2**65).map(str),
    st.text(alphabet="0123456789x-+. ", max_size=6),
)
subjects = st.one_of(
    tokens.map(v1),
    tokens.map(v2),
    st.lists(st.text(alphabet="ab1.", max_size=4), max_size=14).map(lambda ts: "$JS.ACK." + ".".join(ts)),
    st.text(max_size=30),
    st.none(),
)


@given(st.lists(subjects, max_size=12))
def test_native_and_twin_agree(replies: list[str | None]) -> None:
    messages = [Msg(r) for r in replies]
    assert _native.delivery_attempts(messages) == _twin.delivery_attempts(messages)


@given(st.lists(st.lists(subjects, max_size=8), max_size=5), st.integers(0, 5))
def test_a_tally_takes_what_its_runs_read_since_the_last_take(runs: list[list[str | None]], take_after: int) -> None:
    """A consumer tallies each run as it arrives and the export takes the sum: the same counts as
    reading every delivery at once, native and twin alike, and nothing twice."""
    for tally in (_native.AttemptTally(), _twin.AttemptTally()):
        before = [Msg(r) for run in runs[:take_after] for r in run]
        after = [Msg(r) for run in runs[take_after:] for r in run]
        for run in runs[:take_after]:
            tally.add([Msg(r) for r in run])
        assert tally.take() == _native.delivery_attempts(before)
        for run in runs[take_after:]:
            tally.add([Msg(r) for r in run])
        assert tally.take() == _native.delivery_attempts(after)
        assert tally.take() == ([], 0)


def record_receive(registry: Registry, messages: list[Msg]) -> None:
    """The runtime's path: a consumer's tally takes the run, the export records what it took."""
    tally = AttemptTally()
    tally.add(messages)
    record_counts(registry, *tally.take())


def test_a_batch_records_attempts_and_receive_reasons() -> None:
    registry = Registry()
    record_receive(registry, [Msg(v1("1")), Msg(v1("1")), Msg(v1("4")), Msg("_INBOX.x")])
    first = registry.histogram(NATS_DELIVERY_ATTEMPTS, (("redelivered", "false"),))
    again = registry.histogram(NATS_DELIVERY_ATTEMPTS, (("redelivered", "true"),))
    assert (first.count, first.sum) == (2, 2.0)
    assert (again.count, again.sum) == (1, 4.0)
    received = {
        dict(i.attrs)["reason"]: registry.value(NATS_OPERATIONS, i.attrs) for i in registry if i.name == NATS_OPERATIONS
    }
    assert received == {"first_delivery": 2, "redelivery": 1, "metadata_unavailable": 1}


def test_only_the_series_a_batch_touches_exist() -> None:
    """The receive instruments are looked up once, but made when first recorded into: a run of first
    deliveries exports no empty `redelivered=true` histogram and no zero redelivery counter."""
    registry = Registry()
    record_receive(registry, [Msg(v1("1")), Msg(v1("1"))])
    record_receive(registry, [Msg(v1("1"))])
    series = {(i.name, i.attrs) for i in registry}
    assert series == {
        (NATS_DELIVERY_ATTEMPTS, (("redelivered", "false"),)),
        (NATS_OPERATIONS, (("operation", "receive"), ("outcome", "success"), ("reason", "first_delivery"))),
    }
    assert registry.value(NATS_OPERATIONS, next(a for n, a in series if n == NATS_OPERATIONS)) == 3
    first = registry.histogram(NATS_DELIVERY_ATTEMPTS, (("redelivered", "false"),))
    assert (first.count, first.sum, first.buckets[0]) == (3, 3.0, 3)  # the first-deliveries-only path
