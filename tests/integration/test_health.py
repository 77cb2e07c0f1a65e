# SPDX-License-Identifier: Apache-2.0
"""Probes and the NATS health heartbeat (sidecar-behaviour §10) on a running sidecar."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from sie_sidecar.pipeline.readiness import Readiness

from .conftest import NatsServer
from .stack import BUNDLE, MODEL, POOL, PROFILE, WORKER, running_stack

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


async def test_health_heartbeat_and_shutdown_tombstone(nats_server: NatsServer, tmp_path: Path) -> None:
    beats: list[dict[str, Any]] = []
    async with running_stack(nats_server, tmp_path, env={"SIE_HEALTH_PUBLISH_INTERVAL_MS": "100"}) as stack:

        async def on_beat(msg: Any) -> None:
            beats.append(json.loads(msg.data))

        await stack.nc.subscribe(f"sie.health.{WORKER}", cb=on_beat)
        await stack.wait_for(lambda: any(b["ready"] for b in beats), timeout=10)
        beat = next(b for b in beats if b["ready"])
        assert list(beat) == HEALTH_KEYS  # the v0.7.1 fields, in order
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
        last = beats[-1]
        assert (last["terminated"], last["ready"], last["ready_gpu_slots"]) == (True, False, 0)


def test_readiness_reasons() -> None:
    r = Readiness(ping_interval_ms=100, stale_mult=3)
    assert r.reason() == "handshake pending"
    r.last_ping_ok = time.monotonic()
    assert r.reason() is None and r.ready
    assert str(r.reason(now=r.last_ping_ok + 1.0)).startswith("heartbeat stale (1000 ms ago, threshold 300 ms)")
    r.draining = True
    assert r.reason() == "draining"
