# SPDX-License-Identifier: Apache-2.0
"""Intake for a whole pulled batch (`Intake.verdicts`) gives every message the verdict the
per-message rules (`Intake.verdict`, sidecar-behaviour §4.1) give it, groups the accepted ones by
model in arrival order, and never loses or duplicates one."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from sie_sidecar import wire
from sie_sidecar.pipeline.intake import ACCEPT, NAK, Intake


class Msg:
    def __init__(self, subject: str, data: bytes) -> None:
        self.subject, self.data, self.reply = subject, data, "$JS.ACK.x"

    async def ack(self) -> None: ...
    async def nak(self, delay: int | float | None = None) -> None: ...
    async def in_progress(self) -> None: ...


SUBJECTS = [
    wire.pool_work_subject("default", "cpu", "b", "org/m-a"),
    wire.pool_work_subject("default", "cpu", "b", "org/m-b"),
    wire.worker_direct_subject("default", "cpu", "b", "org/m-a", "w-1"),
    "sie.work.bad",
    "not.a.work.subject",
]


def item(i: int, *, model: str, reply: str, router: str, operation: str) -> dict[str, Any]:
    return {
        "work_item_id": f"r{i}.0",
        "request_id": f"r{i}",
        "item_index": 0,
        "total_items": 1,
        "operation": operation,
        "model_id": model,
        "pool_name": "default",
        "machine_profile": "cpu",
        "reply_subject": reply,
        "router_id": router,
    }


@st.composite
def messages(draw: st.DrawFn) -> list[Msg]:
    out = []
    for i in range(draw(st.integers(0, 20))):
        subject = draw(st.sampled_from(SUBJECTS))
        kind = draw(st.sampled_from(["good", "good", "good", "junk", "unsafe", "cancelled", "other-model"]))
        if kind == "junk":
            out.append(Msg(subject, draw(st.binary(max_size=12))))
            continue
        model = "org/m-a" if kind != "other-model" else "org/elsewhere"
        reply = {"unsafe": "_INBOX.a b", "good": f"_INBOX.gw.{i}"}.get(kind, f"_INBOX.gw.{i}")
        router = "gw-cancel" if kind == "cancelled" else "gw"
        op = draw(st.sampled_from(["encode", "score", "generate"]))
        out.append(Msg(subject, msgpack.packb(item(i, model=model, reply=reply, router=router, operation=op))))
    return out


@given(batch=messages(), cancel=st.booleans())
def test_batch_intake_matches_the_per_message_rules(batch: list[Msg], cancel: bool) -> None:
    intake = Intake()
    if cancel:
        for i in range(20):
            intake.tombstones.record("gw-cancel", f"r{i}")
    released: list[int] = []
    release = released.append
    expected: dict[str, list[Any]] = {}
    expected_naks, expected_drops = [], []
    for msg in batch:
        d, verdict = Intake(intake.tombstones, intake.batch_tombstones).verdict(msg, release)
        if verdict is ACCEPT:
            expected.setdefault(d.model, []).append((msg, d.worker_direct, d.item))
        elif verdict is NAK:
            expected_naks.append(msg)
        else:
            expected_drops.append(msg)
    groups, naks, drops = intake.verdicts(batch, release)
    got = {m: [(d.msg, d.worker_direct, d.item) for d in ds] for m, ds in groups.items()}
    assert got == expected
    assert [d.msg for d in naks] == expected_naks and [d.msg for d in drops] == expected_drops
    assert all(d.release == release and not d.settled for ds in groups.values() for d in ds)
    assert all(d.model == m and d.item is not None and d.item.model_id == m for m, ds in groups.items() for d in ds)
