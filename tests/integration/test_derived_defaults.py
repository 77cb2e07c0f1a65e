# SPDX-License-Identifier: Apache-2.0
"""Defaults that need no tuning (docs/operations.md, "derived defaults"): with the count cap and the
pull-ahead unset, a backend reporting `batch_budget` 64 gets batches of up to 64 and room for four
of them in flight (256 messages per consumer); set explicitly, both stay where they were put. Real
nats-server, the reference backend over its Unix socket."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from sie_sidecar.backend.null import NullAdapter

from .conftest import NatsServer
from .stack import MODEL, Stack, running_stack, work_item

ITEMS = 256


async def _peak_ack_pending(stack: Stack, ids: list[str], timeout: float = 30.0) -> int:
    """The most un-ACKed pool messages the server reported while the items are answered (its
    view: ACKs already sent but not yet processed still count)."""
    peak = 0
    deadline = time.monotonic() + timeout
    while len({r["work_item_id"] for r in stack.replies} & set(ids)) < len(ids):
        assert time.monotonic() < deadline, "items not answered in time"
        info = await stack.pool_consumer()
        peak = max(peak, info.num_ack_pending)
        await asyncio.sleep(0.01)
    return peak


async def _run(nats_server: NatsServer, tmp_path: Path, env: dict[str, str]) -> tuple[int, NullAdapter]:
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_budget=64, batch_delay_s=0.15)
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
        ids = [f"d{i}" for i in range(ITEMS)]
        for i in ids:
            await stack.publish(work_item(text=i) | {"work_item_id": i})
        peak = await _peak_ack_pending(stack, ids)
        await stack.settled_pool()
        assert sorted(r["work_item_id"] for r in stack.replies if r["work_item_id"] in ids) == sorted(ids)
        return peak, adapter


async def test_the_batch_budget_sets_the_count_cap_and_the_pull_ahead(nats_server: NatsServer, tmp_path: Path) -> None:
    peak, adapter = await _run(nats_server, tmp_path, {})
    assert adapter.items == ITEMS
    assert adapter.batches <= ITEMS // 24, adapter.batches  # v0.7.1's cap of 12 would need at least 22 batches
    assert peak > 2 * 64, peak  # far more than one pull's worth held while the backend is busy (derived: 256)


async def test_explicit_settings_keep_the_v071_count_cap_and_pull_ahead(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    env = {"SIE_BATCHER_MAX_BATCH_REQUESTS": "12", "SIE_PULL_LOOP_MAX_OUTSTANDING": "64"}
    peak, adapter = await _run(nats_server, tmp_path, env)
    assert adapter.items == ITEMS
    assert adapter.batches >= ITEMS // 12, adapter.batches
    # The sidecar holds at most 64; the server's count runs a little behind the ACKs it has queued,
    # so it may show up to one more pull request's worth (32) on top.
    assert peak <= 64 + 32, peak
