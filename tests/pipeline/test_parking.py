# SPDX-License-Identifier: Apache-2.0
"""Parked model groups (sidecar-behaviour §5.3, newer than v0.7.1) without NATS: every delivery
counted. A group whose model loads leaves its group slot and its pull permit; it is progress-ACKed
while it waits, NAKed at the redelivery envelope or at shutdown, served once the model is ready."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.ipc.types import ReadyResponse
from sie_sidecar.pipeline.dispatcher import SHUTDOWN_NAK_MS

from .memory import memory_pipeline
from .test_sequencing import _item, _msg


async def test_a_parked_group_is_naked_with_the_base_delay_at_its_deadline(tmp_path: Path) -> None:
    adapter = NullAdapter(dim=8, load_delay_s=3600.0)
    async with memory_pipeline(tmp_path, adapter=adapter, nak_delay_ms=700, parked_deadline_s=1.0) as p:
        msgs = [_msg(_item(f"r{i}", model="org/cold")) for i in range(3)]
        p.send(msgs)
        await asyncio.sleep(0.3)
        assert p.source.unsettled == 0  # parked: the pull permits went back at once
        assert all(m.settlements == [("progress", None)] for m in msgs)  # ACKed on the loading answer
        await p.until_settled(msgs, timeout=5)
        assert all(m.final == [("nak", 0.7)] for m in msgs)


async def test_a_parked_group_is_handed_back_at_shutdown(tmp_path: Path) -> None:
    adapter = NullAdapter(dim=8, load_delay_s=3600.0)
    async with memory_pipeline(tmp_path, adapter=adapter) as p:
        msgs = [_msg(_item(f"r{i}", model="org/cold")) for i in range(2)]
        p.send(msgs)
        await asyncio.sleep(0.3)
        p.stop.set()
        await asyncio.wait_for(p.dispatcher.join_parked(), 5)
        assert all(m.final == [("nak", SHUTDOWN_NAK_MS / 1000.0)] for m in msgs)


async def test_items_beyond_the_parked_capacity_go_back_and_the_rest_are_served(tmp_path: Path) -> None:
    adapter = NullAdapter(dim=8, load_delay_s=0.4)
    async with memory_pipeline(tmp_path, adapter=adapter, nak_delay_ms=300, fetch_budget=3) as p:
        msgs = [_msg(_item(f"r{i}", model="org/cold")) for i in range(5)]
        p.send(msgs)
        await p.until_settled(msgs, timeout=10)
        finals = sorted(m.final[0][0] for m in msgs)
        assert finals == ["ack", "ack", "ack", "nak", "nak"]  # capacity 3: two handed back at once
        assert all(m.final == [("nak", 0.3)] for m in msgs if m.final[0][0] == "nak")
        assert len(p.sink.replies) == 3


async def test_a_warm_model_is_not_held_up_by_loading_groups(tmp_path: Path) -> None:
    """Six loading models (more than the 4 group slots) and a warm one: the warm items are answered
    while every cold one still waits."""
    adapter = NullAdapter(dim=8, preloaded_models=["org/model-a"], load_delay_s=3.0)
    async with memory_pipeline(tmp_path, adapter=adapter) as p:
        cold = [_msg(_item(f"c{i}", model=f"org/cold-{i}")) for i in range(6)]
        p.send(cold)
        await asyncio.sleep(0.3)
        warm = [_msg(_item(f"w{i}")) for i in range(50)]
        p.send(warm)
        await p.until_settled(warm, timeout=2)
        assert not any(m.final for m in cold)
        await p.until_settled(cold, timeout=10)
        assert all(m.final == [("ack", None)] for m in cold + warm)


class HangingReady(NullAdapter):
    """A backend that hangs (not dies) inside EnsureModelReady once: SIGSTOPped, or wedged."""

    def __init__(self, hang_s: float) -> None:
        super().__init__(dim=8, preloaded_models=["org/model-a"])
        self.hang_s = hang_s

    async def ensure_ready(self, model_id: str) -> ReadyResponse:
        hang, self.hang_s = self.hang_s, 0.0
        await asyncio.sleep(hang)
        return await super().ensure_ready(model_id)


async def test_a_group_waiting_on_a_hung_ensure_model_ready_is_progress_acked(tmp_path: Path) -> None:
    """Law 3 (issue 15's backend_stall defect): while EnsureModelReady hangs, the group's leases are
    renewed each progress interval, so JetStream does not hand the items to another worker."""
    async with memory_pipeline(tmp_path, adapter=HangingReady(1.3), progress_after_s=0.4) as p:
        msgs = [_msg(_item(f"r{i}")) for i in range(3)]
        p.send(msgs)
        await p.until_settled(msgs, timeout=10)
        for m in msgs:
            progress = [s for s in m.settlements if s[0] == "progress"]
            assert len(progress) >= 2, m.settlements  # 0.4 s apart during the 1.3 s hang
            assert m.final == [("ack", None)]
