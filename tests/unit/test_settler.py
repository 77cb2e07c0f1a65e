# SPDX-License-Identifier: Apache-2.0
"""The settler's batch paths: capacity goes back once per source and batch, and a delivery is never
settled twice (sidecar-behaviour §4)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

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
