# SPDX-License-Identifier: Apache-2.0
"""The settler's batch paths: capacity goes back once per source and batch, and a delivery is never
settled twice (sidecar-behaviour §4)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar._twins.delivery import finish_deliveries as finish_deliveries_py
from sie_sidecar.pipeline.delivery import Delivery, Settler


class Msg:
    def __init__(self, n: int) -> None:
        self.subject = "sie.work.x"
        self.data = b""
        self.reply = f"$JS.ACK.s.c.1.{n}.{n}.0.0"

    async def ack(self) -> None: ...
    async def nak(self, delay: int | float | None = None) -> None: ...
    async def in_progress(self) -> None: ...


class Writer:
    def __init__(self) -> None:
        self.writes: list[list[str]] = []

    async def ack_many(self, reply_subjects: Sequence[str]) -> None:
        self.writes.append(list(reply_subjects))


def deliveries(n: int, release: list[list[int]]) -> list[Delivery]:
    return [Delivery(msg=Msg(i), worker_direct=False, release=release[i % len(release)].append) for i in range(n)]


async def test_ack_many_releases_once_per_source_and_writes_once() -> None:
    a: list[int] = []
    b: list[int] = []
    ds = [*deliveries(3, [a]), *deliveries(2, [b]), *deliveries(1, [a])]
    writer = Writer()
    settler = Settler(writer)
    await settler.ack_many(ds)
    assert (a, b) == ([3, 1], [2])  # runs of the same source: one release each
    assert writer.writes == [[d.msg.reply for d in ds]]
    assert settler.counts.acked == 6 and all(d.settled for d in ds)


async def test_acks_framed_with_the_replies_settle_without_a_write(caplog: pytest.LogCaptureFixture) -> None:
    released: list[int] = []
    ds = deliveries(4, [released])
    writer = Writer()
    settler = Settler(writer)
    ds[1].settled = True  # settled earlier (e.g. NAKed): never counted or released again
    with caplog.at_level(logging.ERROR):
        settler.acked_with_replies(ds)
    assert writer.writes == [] and released == [3]  # one release for the three settled now
    assert settler.counts.acked == 3
    assert "settled twice" in caplog.text


@given(
    plan=st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.booleans()), max_size=16),
)
def test_bulk_settlement_matches_its_twin(plan: list[tuple[int, bool, bool]]) -> None:
    """`_native.finish_deliveries` (one call per batch, both kinds of delivery) and the loop it
    replaces settle the same deliveries, report the same repeats and release the same counts
    in the same order. `plan`: (source, lazy kind, already settled) per delivery."""
    from sie_sidecar import wire

    if not wire.USING_NATIVE:
        pytest.skip("the native settlement is the extension's")

    def batch(sink: list[tuple[int, int]]) -> list[Any]:
        def record(source: int, count: int) -> None:
            sink.append((source, count))

        sources = {s: functools.partial(record, s) for s in range(3)}  # one callable per source
        out: list[Any] = []
        for n, (source, lazy, settled) in enumerate(plan):
            release = sources.get(source)
            if lazy:
                (d,) = _scanned(n)
                d.release = release
            else:
                d = Delivery(msg=Msg(n), worker_direct=False, release=release)
            d.settled = settled
            out.append(d)
        return out

    native_sink: list[tuple[int, int]] = []
    twin_sink: list[tuple[int, int]] = []
    native_batch, twin_batch = batch(native_sink), batch(twin_sink)
    native_done = Settler()._finish_many(native_batch)
    twin_done = Settler._settle(twin_batch, finish_deliveries_py)
    assert [native_batch.index(d) for d in native_done] == [twin_batch.index(d) for d in twin_done]
    assert native_sink == twin_sink
    assert all(d.settled for d in native_batch) and all(d.settled for d in twin_batch)


def _scanned(n: int) -> list[Any]:
    """One delivery as the inbound scanner makes it (a native `LazyDelivery`)."""
    from nats.aio.msg import Msg as NatsMsg

    from sie_sidecar._native import deliveries_of_run
    from sie_sidecar._native.wire import scan_direct_msgs
    from sie_sidecar.wire.workitem import WorkItem

    got: list[Any] = []
    frame = b"MSG sie.work.x 1 $JS.ACK.s.c.1.%d.%d.0.0 0\r\n\r\n" % (n + 1, n + 1)
    scan_direct_msgs(
        bytearray(frame), {1: got.extend}, None, NatsMsg, functools.partial(deliveries_of_run, item_cls=WorkItem)
    )
    return got
