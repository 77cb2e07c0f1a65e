# SPDX-License-Identifier: Apache-2.0
"""Probes and the NATS health heartbeat (sidecar-behaviour §10) on a running sidecar."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import nats

from sie_sidecar import wire
from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.pipeline.readiness import Readiness
from sie_sidecar.runtime import gc as runtime_gc

from .conftest import NatsServer
from .stack import BUNDLE, MODEL, POOL, PROFILE, WORKER, running_stack, work_item

HEALTH_KEYS = [
    "name",
    "ready",
    "terminated",
    "gpu_count",
    "total_gpu_slots",
    "ready_gpu_slots",
    "machine_profile",
    "pool_name",
    "bundle",
    "bundle_config_hash",
    "loaded_models",
    "loading_models",
    "queue_depth",
    "pending_cost",
    "inflight_batches",
    "saturated",
]


async def test_probes_answer_as_the_spec_says(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path) as stack:
        base = f"http://127.0.0.1:{stack.settings.worker_probe_port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/healthz") as r:
                assert (r.status, await r.text(), r.headers["Content-Type"]) == (200, "ok", "text/plain; charset=utf-8")
            deadline = time.monotonic() + 10
            while True:  # ready once the first backend Ping succeeded
                async with http.get(f"{base}/readyz") as r:
                    if r.status == 200:
                        assert await r.text() == "ok"
                        break
                    assert r.status == 503 and (await r.text()).startswith("not ready: ")
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            async with http.get(f"{base}/metrics") as r:
                assert (r.status, await r.text()) == (404, "not found")


async def test_debug_state_shows_each_model_when_enabled(nats_server: NatsServer, tmp_path: Path) -> None:
    """Issue 11: `GET /debug/state` (SIE_SIDECAR_DEBUG_ENDPOINT=1) shows per model the readiness,
    tokenizer mode, batch budget, controller knobs, queue depth and batches in flight."""
    async with running_stack(nats_server, tmp_path, env={"SIE_SIDECAR_DEBUG_ENDPOINT": "1"}) as stack:
        wid = await stack.publish(work_item(text="hello"))
        await stack.wait_for(lambda: len(stack.results_for(wid)) == 1)
        url = f"http://127.0.0.1:{stack.settings.worker_probe_port}/debug/state"
        pool_stream = wire.pool_stream_name(POOL)
        async with aiohttp.ClientSession() as http:
            for _ in range(100):  # the ACK (and the release of its slot) goes out after the reply
                async with http.get(url) as r:
                    assert r.status == 200 and r.headers["Content-Type"] == "application/json"
                    state = await r.json()
                if all(c["unsettled"] == 0 for c in state["consumers"] if c["stream"] == pool_stream):
                    break
                await asyncio.sleep(0.05)
        assert state["worker_id"] == stack.settings.worker_id and state["batch_method"] == "run_batch"
        model = state["models"][MODEL]
        assert model["ready_state"] == "ready" and model["tokenizer_mode"] == "none"
        assert model["batch_budget"] == 64 and model["count_cap"] == 64
        assert model["queue_depth"] == 0 and model["in_flight_batches"] == 0
        assert model["cost_cap"] > 0 and model["wait_ms"] > 0
        memory = state["memory"]  # what the soak judges a leak by (docs/reliability.md, "Soak")
        assert memory["python_blocks"] > 0
        assert memory["in_use_bytes"] >= memory["mmap_bytes"] >= 0 and memory["free_bytes"] >= 0
        collector = memory["gc"]  # cyclic garbage: collected by time (runtime.gc.PeriodicCollection)
        assert len(collector["pending"]) == len(collector["collected"]) == 3 and collector["uncollectable"] == 0
        assert collector["periodic"]["interval_s"] == runtime_gc.GC_INTERVAL_S and collector["frozen"] > 0
        # The messages held now, which live memory is read against (a heap census: ~a dozen blocks each).
        held = {c["stream"]: c for c in state["consumers"]}
        assert set(held) == {wire.worker_stream_name(stack.settings.worker_id), wire.pool_stream_name(POOL)}
        pool = held[pool_stream]
        assert pool["durable"] == wire.pool_durable_name(POOL, PROFILE, BUNDLE)
        assert pool["unsettled"] == pool["buffered"] == 0 and pool["high_water"] >= 1  # it held the item, then settled
        assert pool["max_outstanding"] >= pool["credit"] >= 0 and pool["paused"] is None
    # Off when asked (on by default for loopback peers: tests/integration/test_operator_view.py).
    async with running_stack(nats_server, tmp_path, env={"SIE_SIDECAR_DEBUG_ENDPOINT": "off"}) as stack:
        url = f"http://127.0.0.1:{stack.settings.worker_probe_port}/debug/state"
        async with aiohttp.ClientSession() as http, http.get(url) as r:
            assert r.status == 404


async def test_health_heartbeat_and_shutdown_tombstone(nats_server: NatsServer, tmp_path: Path) -> None:
    beats: list[dict[str, Any]] = []
    async with running_stack(nats_server, tmp_path, env={"SIE_HEALTH_PUBLISH_INTERVAL_MS": "100"}) as stack:

        async def on_beat(msg: Any) -> None:
            beats.append(json.loads(msg.data))

        await stack.nc.subscribe(f"sie.health.{WORKER}", cb=on_beat)
        await stack.wait_for(lambda: any(b["ready"] for b in beats), timeout=10)
        beat = next(b for b in beats if b["ready"])
        assert list(beat) == HEALTH_KEYS  # the v0.7.1 fields in order, and `loading_models` after loaded
        assert (beat["name"], beat["machine_profile"], beat["pool_name"], beat["bundle"]) == (
            WORKER,
            PROFILE,
            POOL,
            BUNDLE,
        )
        assert beat["terminated"] is False and beat["ready_gpu_slots"] == 1 and MODEL in beat["loaded_models"]
        stack.stop.set()
        await asyncio.wait_for(stack.task, 30)
        await stack.nc.flush()
        await asyncio.sleep(0.2)
        # Two tombstones (§10): the publisher's as it stops, then main's after waiting for it.
        tombstones = [b for b in beats if b["terminated"]]
        assert len(tombstones) == 2 and beats[-2:] == tombstones
        for last in tombstones:
            assert (last["terminated"], last["ready"], last["ready_gpu_slots"]) == (True, False, 0)


async def test_a_beat_goes_out_at_once_when_a_model_starts_or_finishes_loading(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """Newer than v0.7.1 (§10): `loading_models` from the backend's Ping, and a heartbeat as soon as
    the loaded or loading set changes, not at the next 30 s interval."""
    beats: list[tuple[float, dict[str, Any]]] = []
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], load_delay_s=1.0)
    env = {"SIE_HEALTH_PUBLISH_INTERVAL_MS": "30000"}

    async def on_beat(msg: Any) -> None:
        beats.append((time.monotonic(), json.loads(msg.data)))

    # Subscribed before the sidecar starts: its ready beat goes out as the handshake finds the
    # preloaded model, and a subscription made after start-up could miss it (then none for 30 s).
    listener = await nats.connect(nats_server.url)
    await listener.subscribe(f"sie.health.{WORKER}", cb=on_beat)
    await listener.flush()
    try:
        async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:
            await stack.wait_for(lambda: any(b["ready"] for _, b in beats), timeout=10)
            cold = "org/cold"
            subject = f"sie.work.{POOL}.{PROFILE}.{BUNDLE}.{cold}"
            wid = await stack.publish(work_item(model=cold), subject=subject)
            await stack.wait_for(lambda: any(cold in b["loading_models"] for _, b in beats), timeout=5)
            await stack.wait_for(lambda: any(cold in b["loaded_models"] for _, b in beats), timeout=5)
            await stack.wait_for(lambda: len(stack.results_for(wid)) == 1)
            loading = next(t for t, b in beats if cold in b["loading_models"])
            loaded = next(t for t, b in beats if cold in b["loaded_models"])
            assert 0.5 < loaded - loading < 5.0  # each change had its own beat, long before the interval
            assert all(b["loading_models"] == [] for _, b in beats if cold in b["loaded_models"])
    finally:
        await listener.close()


def test_readiness_reasons() -> None:
    r = Readiness(ping_interval_ms=100, stale_mult=3)
    assert r.reason() == "handshake pending"
    r.last_ping_ok = time.monotonic()
    assert r.reason() is None and r.ready
    assert str(r.reason(now=r.last_ping_ok + 1.0)).startswith("heartbeat stale (1000 ms ago, threshold 300 ms)")
    r.draining = True
    assert r.reason() == "draining"


async def test_health_heartbeat_reports_the_load_under_a_burst(nats_server: NatsServer, tmp_path: Path) -> None:
    """A burst at a slow backend shows up in the heartbeat as queued items, their cost, batches in
    flight and `saturated`; once every item is answered the fields are zero and `saturated` false."""
    beats: list[dict[str, Any]] = []
    burst, depth = 40, 2
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_delay_s=0.3)
    # v0.7.1's count cap of 12 (the derived cap of 64 would take the whole burst in one batch).
    env = {
        "SIE_HEALTH_PUBLISH_INTERVAL_MS": "50",
        "SIE_RUST_PIPELINE_DEPTH": str(depth),
        "SIE_BATCHER_MAX_BATCH_REQUESTS": "12",
    }
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:

        async def on_beat(msg: Any) -> None:
            beats.append(json.loads(msg.data))

        await stack.nc.subscribe(f"sie.health.{WORKER}", cb=on_beat)
        await stack.wait_for(lambda: any(b["ready"] for b in beats), timeout=10)
        idle = [b for b in beats if b["ready"]][-1]
        assert (idle["queue_depth"], idle["pending_cost"], idle["inflight_batches"], idle["saturated"]) == (
            0,
            0,
            0,
            False,
        )
        items = [work_item(text=f"burst {i}") for i in range(burst)]
        await asyncio.gather(*(stack.publish(item) for item in items))

        def loaded(b: dict[str, Any]) -> bool:
            return bool(b["queue_depth"] > 0 and b["inflight_batches"] > 0)

        await stack.wait_for(lambda: any(loaded(b) for b in beats), timeout=10)
        busy = next(b for b in beats if loaded(b))
        # Encode items without a tokenizer cost 1 each; at most `depth` batches run at once, and
        # what runs is no longer queued. One ready slot x 4 concurrent batches: saturated from 4.
        assert busy["pending_cost"] == busy["queue_depth"] <= burst - 1
        assert 1 <= busy["inflight_batches"] <= depth
        assert busy["saturated"] is True
        await stack.wait_for(lambda: len(stack.replies) == burst, timeout=30)
        assert all(r["success"] for r in stack.replies)
        # The last batch task ends just after its replies went out: wait (bounded) for a quiet beat.
        await stack.wait_for(lambda: beats[-1]["queue_depth"] == beats[-1]["inflight_batches"] == 0, timeout=10)
        after = beats[-1]
        assert (after["pending_cost"], after["saturated"]) == (0, False)
        assert all(b["inflight_batches"] <= depth for b in beats)


async def test_the_health_tombstone_goes_out_before_queued_work_drains(nats_server: NatsServer, tmp_path: Path) -> None:
    """§15.4: readiness off, the heartbeat stopped and the health tombstone come before the parked,
    scheduler and generation joins, so the gateway stops routing here while queued work drains.
    Three batches of two run one at a time (1 s each); the stop comes after the first answer."""
    adapter = NullAdapter(dim=8, preloaded_models=[MODEL], batch_delay_s=1.0)
    env = {
        "SIE_HEALTH_PUBLISH_INTERVAL_MS": "100",
        "SIE_RUST_PIPELINE_DEPTH": "1",
        "SIE_BATCHER_MAX_BATCH_REQUESTS": "2",
    }
    events: list[str] = []
    async with running_stack(nats_server, tmp_path, adapter=adapter, env=env) as stack:

        async def on_beat(msg: Any) -> None:
            if json.loads(msg.data)["terminated"]:
                events.append("tombstone")

        async def on_reply(msg: Any) -> None:
            events.append("reply")

        await stack.nc.subscribe(f"sie.health.{WORKER}", cb=on_beat)
        await stack.nc.subscribe("_INBOX.gw.>", cb=on_reply)
        ids = [await stack.publish(work_item(text=f"t{i}")) for i in range(6)]
        await stack.wait_for(lambda: len(stack.replies) >= 1, timeout=10)
        stack.stop.set()
        await asyncio.wait_for(stack.task, 30)
        await stack.nc.flush()
        await asyncio.sleep(0.2)
        assert all(len(stack.results_for(w)) == 1 for w in ids)  # the queued work still drained
    assert "tombstone" in events
    first_tombstone = events.index("tombstone")
    assert events[first_tombstone:].count("reply") >= 2  # at least two queued batches answered after it
