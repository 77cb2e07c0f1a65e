# SPDX-License-Identifier: Apache-2.0
"""Cold loads do not block warm models (sidecar-behaviour §5.3, the parking rule newer than v0.7.1).

Tried with 10,000 items for 10,000 distinct models against a backend that answers `loading_started`
for each new model, only 36 were answered in 65 s: each loading group held one of the 4 model-group
slots through its sleep. A loading group is now parked (its own task, no group slot, a parked-item
permit instead of its pull permit), so warm models keep flowing while others load."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from sie_sidecar import wire
from sie_sidecar.backend.null import NullAdapter

from .conftest import NatsServer
from .stack import BUNDLE, MODEL, POOL, PROFILE, Stack, running_stack, work_item

COLD = [f"org/cold-{i}" for i in range(8)]  # twice the 4 group slots


def answered(stack: Stack, ids: list[str]) -> bool:
    return all(len(stack.results_for(i)) == 1 for i in ids)


async def publish_to(stack: Stack, model: str, n: int) -> list[str]:
    subject = wire.pool_work_subject(POOL, PROFILE, BUNDLE, model)
    return [await stack.publish(work_item(model=model, text=f"{model} {i}"), subject=subject) for i in range(n)]


async def test_a_warm_model_serves_at_full_rate_while_others_load(nats_server: NatsServer, tmp_path: Path) -> None:
    """Eight models load for 6 s; the warm model's 300 items, published after them, are all
    answered long before any cold model is ready, and then every cold item is answered once on its
    first delivery (progress-ACKed while parked, never NAKed)."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], load_delay_s=6.0)
    env = {"SIE_MAX_CONCURRENT_BATCHES": "4"}
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
        cold = [w for model in COLD for w in await publish_to(stack, model, 3)]
        await stack.wait_for(lambda: len(adapter._loading) == len(COLD), timeout=5)  # all parked, loading
        started = time.monotonic()
        warm = await publish_to(stack, MODEL, 300)
        await stack.wait_for(lambda: answered(stack, warm), timeout=5)
        warm_s = time.monotonic() - started
        assert not any(stack.results_for(w) for w in cold)  # still loading
        assert warm_s < 4.0, f"the warm model waited {warm_s:.1f} s behind loading groups"
        await stack.wait_for(lambda: answered(stack, cold), timeout=20)
        await stack.settled_pool()
        assert all(stack.results_for(w)[0]["success"] for w in cold)
        assert (await stack.pool_consumer()).delivered.consumer_seq == len(cold) + len(warm)  # no redelivery


async def test_parked_items_beyond_the_parked_capacity_are_naked(nats_server: NatsServer, tmp_path: Path) -> None:
    """The parked-item capacity is the fetch budget: with a budget of 4, the items of a third loading
    model go back (base delay, so a few deliveries a second at most, not a tight loop) until a parked
    group is served and frees capacity; then they are served too."""
    adapter = NullAdapter(dim=8, load_delay_s=1.5)
    env = {"SIE_NATS_FETCH_BUDGET": "4", "SIE_NAK_DELAY_S": "0.5"}
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
        started = time.monotonic()
        ids = [w for model in COLD[:3] for w in await publish_to(stack, model, 2)]
        await stack.wait_for(lambda: answered(stack, ids), timeout=20)
        elapsed = time.monotonic() - started
        await stack.settled_pool()
        handed_back = (await stack.pool_consumer()).delivered.consumer_seq - len(ids)
        assert 1 <= handed_back <= 2 * (elapsed / 0.5 + 1)  # the two overflow items, once per base delay
        assert stack.max_deliveries == []


async def test_shutdown_hands_parked_groups_back_promptly(nats_server: NatsServer, tmp_path: Path) -> None:
    adapter = NullAdapter(dim=8, load_delay_s=3600.0)
    async with running_stack(nats_server, tmp_path, adapter=adapter) as stack:
        await publish_to(stack, COLD[0], 2)
        await stack.wait_for(lambda: len(adapter._loading) == 1, timeout=5)
        started = time.monotonic()
        stack.stop.set()
        assert await asyncio.wait_for(stack.task, 30) == 0
        assert time.monotonic() - started < 10.0
        stream = await stack.js.stream_info(wire.pool_stream_name(POOL))
        assert stream.state.messages == 2  # NAKed back, not ACKed: they wait for the next worker
