# SPDX-License-Identifier: Apache-2.0
"""ensure_topology against a real nats-server: names (TV-S4), settings (§2.2/§2.3), reconcile and clean-up (TV-S7)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import APIError, NotFoundError

from sie_sidecar.bus.topology import TopologySpec, ensure_topology, reconcile_forever

# TV-S4 lane: pool `default`, profile `rtx6000`, bundle `sglang`, worker `pod-0.svc`.
SPEC = TopologySpec(pool="default", machine_profile="rtx6000", bundle="sglang", worker_id="pod-0.svc")
POOL_STREAM = "WORK_POOL_default"
POOL_DURABLE = "default_rtx6000_sglang"
POOL_FILTER = "sie.work.default.rtx6000.sglang.*"
WORKER_STREAM = "WORK_WORKER_pod-0_dot_svc"
WORKER_CONSUMER = "gen-pod-0_dot_svc"
WORKER_FILTER = "sie.work.default.rtx6000.sglang.*.pod-0_dot_svc"


async def _consumer_names(js: JetStreamContext, stream: str) -> set[str]:
    return {ci.name for ci in await js.consumers_info(stream)}


async def _create_pool_stream(js: JetStreamContext) -> None:
    await js.add_stream(
        name=POOL_STREAM,
        subjects=["sie.work.default.*.*.*"],
        retention=js_api.RetentionPolicy.WORK_QUEUE,
        storage=js_api.StorageType.MEMORY,
    )


async def _add_durable(js: JetStreamContext, name: str, filter_subject: str | None, **extra: Any) -> None:
    await js.add_consumer(
        POOL_STREAM,
        js_api.ConsumerConfig(
            durable_name=name, ack_policy=js_api.AckPolicy.EXPLICIT, filter_subject=filter_subject, **extra
        ),
    )


async def test_creates_names_and_settings(nc: Client) -> None:
    js = nc.jetstream()
    await ensure_topology(js, SPEC)

    pool = (await js.stream_info(POOL_STREAM)).config
    assert pool.subjects == ["sie.work.default.*.*.*"]
    assert pool.retention == js_api.RetentionPolicy.WORK_QUEUE
    assert pool.storage == js_api.StorageType.MEMORY
    assert pool.discard == js_api.DiscardPolicy.NEW
    assert pool.max_msgs == 100_000
    assert pool.max_age == 1800
    assert pool.num_replicas == 1

    durable = await js.consumer_info(POOL_STREAM, POOL_DURABLE)
    assert durable.config.filter_subject == POOL_FILTER
    assert not durable.config.filter_subjects
    assert durable.config.ack_policy == js_api.AckPolicy.EXPLICIT
    assert durable.config.ack_wait == 30
    assert durable.config.max_deliver == 20
    assert durable.config.max_ack_pending == 1000
    assert durable.config.deliver_subject is None  # pull consumer

    worker = (await js.stream_info(WORKER_STREAM)).config
    assert worker.subjects == [WORKER_FILTER]
    assert worker.retention == js_api.RetentionPolicy.WORK_QUEUE
    assert worker.storage == js_api.StorageType.MEMORY
    assert worker.discard == js_api.DiscardPolicy.NEW
    assert worker.max_msgs == 100_000
    assert worker.max_age == 6000  # max(1800, 300 s x 20)
    assert worker.num_replicas == 1

    gen = await js.consumer_info(WORKER_STREAM, WORKER_CONSUMER)
    assert gen.config.filter_subject == WORKER_FILTER
    assert gen.config.ack_wait == 300
    assert gen.config.max_deliver == 20
    assert gen.config.max_ack_pending == 1000
    assert await _consumer_names(js, POOL_STREAM) == {POOL_DURABLE}
    assert await _consumer_names(js, WORKER_STREAM) == {WORKER_CONSUMER}


@pytest.mark.parametrize(("max_age", "max_deliver", "worker_age"), [(60.0, 3, 900.0), (7200.0, 20, 7200.0)])
async def test_tunables(nc: Client, max_age: float, max_deliver: int, worker_age: float) -> None:
    js = nc.jetstream()
    spec = TopologySpec("l4", "l4-spot", "default", "w-1", stream_max_age_s=max_age, max_deliver=max_deliver)
    await ensure_topology(js, spec)
    assert (await js.stream_info("WORK_POOL_l4")).config.max_age == max_age
    assert (await js.stream_info("WORK_WORKER_w-1")).config.max_age == worker_age
    assert (await js.consumer_info("WORK_POOL_l4", "l4_l4-spot_default")).config.max_deliver == max_deliver


async def test_second_ensure_is_idempotent(nc: Client, caplog: pytest.LogCaptureFixture) -> None:
    js = nc.jetstream()
    await ensure_topology(js, SPEC)
    before = {
        "pool": await js.stream_info(POOL_STREAM),
        "durable": await js.consumer_info(POOL_STREAM, POOL_DURABLE),
        "gen": await js.consumer_info(WORKER_STREAM, WORKER_CONSUMER),
    }
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sie_sidecar.bus.topology"):
        await ensure_topology(js, SPEC)
    assert not caplog.records  # nothing created, reconciled, deleted or warned about
    assert (await js.stream_info(POOL_STREAM)).config == before["pool"].config
    assert (await js.consumer_info(POOL_STREAM, POOL_DURABLE)).created == before["durable"].created
    assert (await js.consumer_info(WORKER_STREAM, WORKER_CONSUMER)).created == before["gen"].created


async def test_existing_stream_subjects_and_max_age_reconciled(nc: Client, caplog: pytest.LogCaptureFixture) -> None:
    js = nc.jetstream()
    await js.add_stream(
        name=POOL_STREAM,
        subjects=["sie.work.default.rtx6000.*.*", "sie.legacy.default"],
        retention=js_api.RetentionPolicy.WORK_QUEUE,
        storage=js_api.StorageType.FILE,
        max_age=60,
        max_msgs=5,
    )
    with caplog.at_level(logging.WARNING, logger="sie_sidecar.bus.topology"):
        await ensure_topology(js, SPEC)
    cfg = (await js.stream_info(POOL_STREAM)).config
    assert cfg.subjects == ["sie.work.default.*.*.*"]
    assert cfg.max_age == 1800
    # v0.7.1 reconciles only those two; storage is never changed in place (warned), the rest is left alone.
    assert cfg.storage == js_api.StorageType.FILE
    assert cfg.max_msgs == 5
    assert any("storage" in r.getMessage() for r in caplog.records)
    assert cfg.discard == js_api.DiscardPolicy.NEW  # newer than v0.7.1: forced to New in place


async def test_stale_overlapping_durable_deleted_and_disjoint_kept(nc: Client) -> None:
    js = nc.jetstream()
    await _create_pool_stream(js)
    # TV-S7: `...sglang.BAAI__bge-m3` overlaps `...sglang.*`; `...l4.sglang.*` does not.
    await _add_durable(js, "old-lane-durable", "sie.work.default.rtx6000.sglang.BAAI__bge-m3")
    await _add_durable(js, "other-profile", "sie.work.default.l4.sglang.*")
    await _add_durable(js, "other-bundle", "sie.work.default.rtx6000.default.*")
    await ensure_topology(js, SPEC)
    assert await _consumer_names(js, POOL_STREAM) == {POOL_DURABLE, "other-profile", "other-bundle"}


async def test_unfiltered_and_multi_filter_stale_consumers_deleted(nc: Client) -> None:
    js = nc.jetstream()
    await _create_pool_stream(js)
    await _add_durable(js, "unfiltered", None)
    await ensure_topology(js, SPEC)
    assert await _consumer_names(js, POOL_STREAM) == {POOL_DURABLE}

    await js.delete_consumer(POOL_STREAM, POOL_DURABLE)
    await js.add_consumer(
        POOL_STREAM,
        js_api.ConsumerConfig(
            durable_name="multi",
            ack_policy=js_api.AckPolicy.EXPLICIT,
            filter_subjects=["sie.work.default.l4.sglang.*", "sie.work.default.rtx6000.sglang.m"],
        ),
    )
    await ensure_topology(js, SPEC)
    assert await _consumer_names(js, POOL_STREAM) == {POOL_DURABLE}


async def test_conservative_cleanup_keeps_active_durable(nc: Client) -> None:
    js = nc.jetstream()
    spec = TopologySpec("default", "rtx6000", "sglang", "pod-0.svc", conservative_cleanup=True)
    await _create_pool_stream(js)
    await _add_durable(js, "idle-stale", "sie.work.default.rtx6000.sglang.idle")
    await _add_durable(js, "active-stale", "sie.work.default.rtx6000.sglang.busy")
    # A waiting pull makes `active-stale` active (num_waiting > 0).
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    body = json.dumps({"batch": 1, "expires": 1_000_000_000}).encode()
    await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{POOL_STREAM}.active-stale", body, reply=inbox)
    await nc.flush()
    # JetStream registers the pull asynchronously after the PUB is processed: wait for it (bounded).
    async with asyncio.timeout(5):
        while (await js.consumer_info(POOL_STREAM, "active-stale")).num_waiting != 1:
            await asyncio.sleep(0.01)

    # The kept consumer still overlaps ours, so the WorkQueue stream refuses our durable: ensure fails (fatal at
    # startup, retried by the reconciler) and the active consumer survives.
    with pytest.raises(APIError):
        await ensure_topology(js, spec)
    assert await _consumer_names(js, POOL_STREAM) == {"active-stale"}

    # Once its pull has expired it is idle, and the next ensure (the reconciler's) removes it.
    await sub.next_msg(timeout=3)  # the 408 for the expired request
    await sub.unsubscribe()
    await ensure_topology(js, spec)
    assert await _consumer_names(js, POOL_STREAM) == {POOL_DURABLE}


async def test_changed_filter_is_updated_in_place(nc: Client) -> None:
    js = nc.jetstream()
    await _create_pool_stream(js)
    await _add_durable(js, POOL_DURABLE, "sie.work.default.rtx6000.sglang.BAAI__bge-m3", ack_wait=30.0)
    created = (await js.consumer_info(POOL_STREAM, POOL_DURABLE)).created
    await ensure_topology(js, SPEC)
    info = await js.consumer_info(POOL_STREAM, POOL_DURABLE)
    assert info.config.filter_subject == POOL_FILTER
    assert not info.config.filter_subjects
    assert info.created == created  # updated, not recreated


async def test_multi_filter_durable_is_updated_to_single_filter(nc: Client) -> None:
    js = nc.jetstream()
    await _create_pool_stream(js)
    await js.add_consumer(
        POOL_STREAM,
        js_api.ConsumerConfig(
            durable_name=POOL_DURABLE,
            ack_policy=js_api.AckPolicy.EXPLICIT,
            filter_subjects=[POOL_FILTER, "sie.work.default.l4.sglang.*"],
        ),
    )
    await ensure_topology(js, SPEC)
    info = await js.consumer_info(POOL_STREAM, POOL_DURABLE)
    assert info.config.filter_subject == POOL_FILTER
    assert not info.config.filter_subjects


async def test_failed_update_deletes_and_recreates(nc: Client) -> None:
    js = nc.jetstream()
    await _create_pool_stream(js)
    # A push consumer cannot be updated into a pull consumer, so the update fails.
    await _add_durable(js, POOL_DURABLE, "sie.work.default.rtx6000.sglang.x", deliver_subject="legacy.push")
    await ensure_topology(js, SPEC)
    info = await js.consumer_info(POOL_STREAM, POOL_DURABLE)
    assert info.config.deliver_subject is None
    assert info.config.filter_subject == POOL_FILTER
    assert info.config.ack_wait == 30


async def test_pool_consumer_setting_mismatch_is_only_warned(nc: Client, caplog: pytest.LogCaptureFixture) -> None:
    js = nc.jetstream()
    await _create_pool_stream(js)
    await _add_durable(js, POOL_DURABLE, POOL_FILTER, ack_wait=10.0, max_deliver=5, max_ack_pending=7)
    with caplog.at_level(logging.WARNING, logger="sie_sidecar.bus.topology"):
        await ensure_topology(js, SPEC)
    cfg = (await js.consumer_info(POOL_STREAM, POOL_DURABLE)).config
    assert (cfg.ack_wait, cfg.max_deliver, cfg.max_ack_pending) == (10, 5, 7)
    warned = [r for r in caplog.records if "settings differ" in r.getMessage()]
    assert len(warned) == 1
    assert sorted(warned[0].__dict__["fields"]) == ["ack_wait", "max_ack_pending", "max_deliver"]


async def test_reconcile_forever_heals_and_stops(nc: Client) -> None:
    js = nc.jetstream()
    stop = asyncio.Event()
    await reconcile_forever(js, SPEC, 0, stop)  # interval 0 disables: returns at once
    with pytest.raises(NotFoundError):
        await js.stream_info(POOL_STREAM)

    task = asyncio.create_task(reconcile_forever(js, SPEC, 0.1, stop))
    try:
        await _eventually(lambda: _exists(js, POOL_STREAM, POOL_DURABLE))
        await js.delete_consumer(POOL_STREAM, POOL_DURABLE)
        await js.delete_stream(WORKER_STREAM)
        await _eventually(lambda: _exists(js, POOL_STREAM, POOL_DURABLE))
        await _eventually(lambda: _exists(js, WORKER_STREAM, WORKER_CONSUMER))
    finally:
        stop.set()
        await asyncio.wait_for(task, 2)


async def _exists(js: JetStreamContext, stream: str, consumer: str) -> bool:
    try:
        await js.consumer_info(stream, consumer)
    except NotFoundError:
        return False
    return True


async def _eventually(check: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_replicas_over_one_on_a_single_server_stop_the_ensure_with_the_servers_reason(nc: Client) -> None:
    js = nc.jetstream()
    spec = TopologySpec(pool="default", machine_profile="rtx6000", bundle="sglang", worker_id="pod-0.svc", replicas=3)
    with pytest.raises(APIError, match="replicas"):
        await ensure_topology(js, spec)
