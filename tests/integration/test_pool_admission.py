# SPDX-License-Identifier: Apache-2.0
"""Pool admission end to end (sidecar-behaviour §8, §4.1 row 11, §5.1): a real aiohttp gateway on
loopback, real NATS, the real sidecar and backend. Not admitted, the sidecar has no pull request
outstanding on either consumer, so no delivery attempt is spent; admitted, it serves; an item for a
pool it is not admitted to is NAKed with the base delay."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sie_sidecar import wire

from .conftest import NatsServer
from .gateway import Gateway, pool_entry, running_gateway
from .stack import BUNDLE, MODEL, PROFILE, WORKER, Stack, running_stack, work_item

NAMED = "gpu-a"


def env_for(gateway: Gateway, pool: str = NAMED, **extra: str) -> dict[str, str]:
    return {
        "SIE_POOL": pool,
        "SIE_GATEWAY_URL": gateway.url + "/",  # a trailing slash is tolerated
        "SIE_GATEWAY_API_KEY": "gw-secret",
        "SIE_POOL_ADMISSION_CHECK_INTERVAL_S": "1",
        "SIE_POOL_ADMISSION_PAUSE_S": "0.1",
        "SIE_SIDECAR_DEBUG_ENDPOINT": "1",
        **extra,
    }


async def publish(stack: Stack, n: int, *, pool: str = NAMED, direct: bool = False, **extra: Any) -> list[str]:
    subject = (
        wire.worker_direct_subject(pool, PROFILE, BUNDLE, MODEL, WORKER)
        if direct
        else wire.pool_work_subject(pool, PROFILE, BUNDLE, MODEL)
    )
    return [await stack.publish(work_item(text=f"t{i}", pool_name=pool, **extra), subject=subject) for i in range(n)]


async def delivered(stack: Stack, pool: str = NAMED) -> tuple[int, int]:
    """Deliveries so far on the pool consumer and on the worker-direct consumer."""
    pool_info = await stack.js.consumer_info(wire.pool_stream_name(pool), wire.pool_durable_name(pool, PROFILE, BUNDLE))
    direct = await stack.js.consumer_info(wire.worker_stream_name(WORKER), wire.worker_consumer_name(WORKER))
    return pool_info.delivered.consumer_seq, direct.delivered.consumer_seq


def answered(stack: Stack, ids: list[str]) -> bool:
    return all(len(stack.results_for(i)) == 1 for i in ids)


async def debug_state(stack: Stack) -> dict[str, Any]:
    url = f"http://127.0.0.1:{stack.settings.worker_probe_port}/debug/state"
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        state: dict[str, Any] = await r.json()
        return state


async def test_a_worker_not_assigned_pulls_nothing_until_the_gateway_assigns_it(
    nats_server: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sie_sidecar.pipeline.gate")
    async with running_gateway() as gateway:
        gateway.assign(NAMED, ["someone-else"], caps={PROFILE: 2})
        async with running_stack(nats_server, tmp_path, env=env_for(gateway)) as stack:
            ids = await publish(stack, 10) + await publish(stack, 5, direct=True)
            await asyncio.sleep(1.5)  # more than one poll and many gate checks: nothing may be delivered
            assert await delivered(stack) == (0, 0)
            state = await debug_state(stack)
            assert state["pool_admission"]["reason"] == "not_assigned" and state["pulling"] is True
            assert state["pool_admission"]["pull_allowed"] is False
            gateway.assign(NAMED, ["someone-else", WORKER.upper()], caps={PROFILE: 2})
            await stack.wait_for(lambda: answered(stack, ids), timeout=10)
            assert all(auth == "Bearer gw-secret" for _, auth in gateway.requests)
            assert (await debug_state(stack))["pool_admission"]["reason"] == "assigned"
    gate = [r.getMessage() for r in caplog.records if "pulling" in r.getMessage()]
    assert "not pulling: the pool is not admitted" in gate
    assert gate[-1] == "pulling: the backend is ready and the pool admitted"


async def test_the_first_poll_runs_before_any_pull(nats_server: NatsServer, tmp_path: Path) -> None:
    """Even the default pool (admitted by default) waits for the first answer: a gateway that takes
    1.5 s to answer its first poll sees nothing delivered before it."""
    async with running_gateway() as gateway:
        gateway.delay_s = 1.5
        gateway.assign("default", [WORKER])
        async with running_stack(nats_server, tmp_path, env=env_for(gateway, pool="default")) as stack:
            ids = await publish(stack, 3, pool="default")
            await asyncio.sleep(0.8)
            assert await delivered(stack, "default") == (0, 0) and len(gateway.requests) == 1
            await stack.wait_for(lambda: answered(stack, ids), timeout=10)


async def test_items_for_a_pool_not_admitted_are_naked_with_the_base_delay(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Admitted to its own pool, the worker serves items whose `admission_pool` is empty or its own;
    an item for a logical pool it is not assigned to is NAKed (base delay: a few deliveries per
    second, not a tight loop), and is served once the gateway lists the worker in that pool."""
    async with running_gateway() as gateway:
        gateway.assign(NAMED, [WORKER], caps={PROFILE: 1})
        env = env_for(gateway, SIE_NAK_DELAY_S="0.5")
        async with running_stack(nats_server, tmp_path, env=env) as stack:
            own = await publish(stack, 3) + await publish(stack, 2, admission_pool=" GPU-A ")
            tenant = await publish(stack, 2, admission_pool="tenant-x")
            await stack.wait_for(lambda: answered(stack, own))
            started = time.monotonic()
            await asyncio.sleep(1.6)
            assert not any(stack.results_for(i) for i in tenant)
            info = await stack.js.consumer_info(
                wire.pool_stream_name(NAMED), wire.pool_durable_name(NAMED, PROFILE, BUNDLE)
            )
            elapsed = time.monotonic() - started
            assert info.num_redelivered <= len(tenant)  # each NAKed item is redelivered, at its own pace
            assert info.delivered.consumer_seq - len(own) <= len(tenant) * (elapsed / 0.5 + 2)
            gateway.body = {
                "pools": [
                    pool_entry(NAMED, [WORKER], caps={PROFILE: 1}),
                    pool_entry("tenant-x", [WORKER], queue_pool=NAMED),
                ]
            }
            await stack.wait_for(lambda: answered(stack, tenant), timeout=10)
            state = await debug_state(stack)
            assert state["pool_admission"]["logical_pools"] == ["tenant-x"]


async def test_a_logical_assignment_alone_lets_the_worker_pull(nats_server: NatsServer, tmp_path: Path) -> None:
    """Physically out of GPU cap, but assigned to a logical pool queueing onto this one: the worker
    pulls, serves that pool's items, and NAKs its own pool's (physical decision: cap_exhausted)."""
    async with running_gateway() as gateway:
        gateway.body = [  # the bare-array form
            pool_entry(NAMED, [WORKER], caps={PROFILE: 0}),
            pool_entry("tenant-x", [WORKER], queue_pool=NAMED),
        ]
        async with running_stack(nats_server, tmp_path, env=env_for(gateway, SIE_NAK_DELAY_S="0.5")) as stack:
            tenant = await publish(stack, 3, admission_pool="tenant-x")
            own = await publish(stack, 1)
            await stack.wait_for(lambda: answered(stack, tenant))
            await asyncio.sleep(0.5)
            assert not stack.results_for(own[0])
            assert (await debug_state(stack))["pool_admission"]["reason"] == "cap_exhausted"


async def test_gateway_errors_keep_the_last_decision_for_the_stale_window_then_fail_closed(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    async with running_gateway() as gateway:
        gateway.assign(NAMED, [WORKER], caps={PROFILE: 1})
        # Pull requests live 1 s: those out when the gate closed expire soon after (NATS cannot take
        # one back; until then what they deliver is NAKed back past their life, once).
        env = env_for(gateway, SIE_POOL_ADMISSION_STALE_AFTER_S="2.5", SIE_NATS_PULL_EXPIRES_S="1")
        async with running_stack(nats_server, tmp_path, env=env) as stack:
            first = await publish(stack, 2)
            await stack.wait_for(lambda: answered(stack, first))
            gateway.status = 503
            await asyncio.sleep(1.2)  # an error inside the window: still pulling
            during = await publish(stack, 2)
            await stack.wait_for(lambda: answered(stack, during), timeout=3)
            state = await debug_state(stack)
            assert state["pool_admission"]["reason"] == "assigned" and state["pool_admission"]["errors"] >= 1
            deadline = time.monotonic() + 6
            while (await debug_state(stack))["pool_admission"]["pull_allowed"]:  # past the window: closed
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
            state = await debug_state(stack)
            assert state["pool_admission"]["reason"] == "status_error:HTTP 503"
            assert state["not_pulling_reason"] is None  # the backend is fine: admission alone holds the gate
            await asyncio.sleep(1.5)  # the gate paused the consumers; their last requests have expired
            seq = await delivered(stack)
            late = await publish(stack, 2)
            await asyncio.sleep(1.0)
            assert await delivered(stack) == seq  # nothing pulled while closed
            gateway.status = 200
            await stack.wait_for(lambda: answered(stack, late), timeout=10)


async def test_the_default_pool_keeps_pulling_when_the_gateway_is_unreachable(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Named pools fail closed on errors; `default` keeps pulling (with reason status_error)."""
    async with running_gateway() as gateway:
        url = gateway.url
    env = {
        "SIE_GATEWAY_URL": url,  # nothing listens there any more: connection refused
        "SIE_POOL_ADMISSION_CHECK_INTERVAL_S": "1",
        "SIE_SIDECAR_DEBUG_ENDPOINT": "1",
    }
    async with running_stack(nats_server, tmp_path, env=env) as stack:
        ids = await publish(stack, 3, pool="default")
        await stack.wait_for(lambda: answered(stack, ids))
        reason = (await debug_state(stack))["pool_admission"]["reason"]
        assert reason.startswith("status_error:transport: ")
        assert "127.0.0.1" not in reason  # the detail names the failure, not the URL


async def test_admission_disabled_polls_nothing(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_gateway() as gateway:
        gateway.assign(NAMED, ["someone-else"])
        env = env_for(gateway, SIE_POOL_ADMISSION_ENABLED="off")
        async with running_stack(nats_server, tmp_path, env=env) as stack:
            ids = await publish(stack, 3, admission_pool="anything")
            await stack.wait_for(lambda: answered(stack, ids))
            assert gateway.requests == [] and (await debug_state(stack))["pool_admission"] is None
