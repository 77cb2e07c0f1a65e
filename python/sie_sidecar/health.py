# SPDX-License-Identifier: Apache-2.0
"""Readiness (sidecar-behaviour §10): the IPC heartbeat, the `/healthz` and `/readyz` probes and the
NATS health heartbeat on `sie.health.{worker_id}`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from .telemetry import GPU_SLOTS, INFLIGHT_BATCHES, PENDING_COST, PENDING_ITEMS, SATURATED, Registry

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Readiness:
    """What `/readyz` and the health heartbeat report."""

    ping_interval_ms: int = 2000
    stale_mult: int = 3
    draining: bool = False
    last_ping_ok: float | None = None  # time.monotonic() of the last successful heartbeat
    loaded_models: list[str] = field(default_factory=list)
    ready_children: int = 0

    def reason(self, now: float | None = None) -> str | None:
        """None when ready, else the `not ready: <reason>` text."""
        if self.draining:
            return "draining"
        if self.last_ping_ok is None:
            return "handshake pending"
        age_ms = ((time.monotonic() if now is None else now) - self.last_ping_ok) * 1000.0
        threshold = self.ping_interval_ms * (self.stale_mult or 3)
        if age_ms > threshold:
            return f"heartbeat stale ({age_ms:.0f} ms ago, threshold {threshold} ms)"
        return None

    @property
    def ready(self) -> bool:
        return self.reason() is None


class PingClient(Protocol):
    async def ping(self) -> Any: ...


class ConfigSink(Protocol):
    def adopt(self, backend_hash: str) -> None: ...


async def heartbeat(clients: list[PingClient], readiness: Readiness, config: ConfigSink, stop: asyncio.Event) -> None:
    """Ping every backend child each interval (first tick at once); record success and models."""
    failures = 0
    while not stop.is_set():
        replies = await asyncio.gather(*(c.ping() for c in clients), return_exceptions=True)
        ready = [r for r in replies if not isinstance(r, BaseException) and getattr(r, "ready", False)]
        readiness.ready_children = len(ready)
        if ready:
            failures = 0
            readiness.last_ping_ok = time.monotonic()
            config.adopt(ready[0].bundle_config_hash)
            readiness.loaded_models = sorted({m for r in ready for m in r.loaded_models})
        else:
            failures += 1
            if failures in (1, 5, 30) or failures % 120 == 0:
                errors = [repr(r) for r in replies if isinstance(r, BaseException)]
                log.warning("backend heartbeat failed", extra={"failures": failures, "errors": errors[:3]})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), readiness.ping_interval_ms / 1000.0)


async def start_probes(readiness: Readiness, port: int, host: str = "0.0.0.0") -> web.AppRunner | None:
    """Serve `/healthz` and `/readyz`; a bind failure is logged and the process keeps running."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok", content_type="text/plain", charset="utf-8")

    async def readyz(_: web.Request) -> web.Response:
        reason = readiness.reason()
        if reason is None:
            return web.Response(text="ok", content_type="text/plain", charset="utf-8")
        return web.Response(status=503, text=f"not ready: {reason}", content_type="text/plain", charset="utf-8")

    async def not_found(_: web.Request) -> web.Response:
        return web.Response(status=404, text="not found", content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_route("*", "/{tail:.*}", not_found)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        log.error("probe server could not bind", extra={"port": port, "error": repr(exc)})
        await runner.cleanup()
        return None
    return runner


@dataclass(frozen=True, slots=True)
class HealthIdentity:
    """Static fields of the health heartbeat."""

    worker_id: str
    machine_profile: str
    pool_name: str
    bundle: str
    gpu_count: int = 1
    backend_children: int = 1


#: Saturation thresholds in percent of capacity (§10): entered at 90, left below 70.
SATURATE_PCT = 90
DESATURATE_PCT = 70


@dataclass(slots=True)
class Saturation:
    """The `saturated` flag with its hysteresis (§10): capacity = ready slots x max concurrent
    batches (at least 1), load = queue depth + in-flight batches; saturated once load reaches 90 %
    of capacity, and it stays so until load falls below 70 %. No ready slot: not saturated."""

    max_concurrent_batches: int = 4
    saturated: bool = False

    def update(self, load: int, ready_slots: int) -> bool:
        if ready_slots <= 0:
            self.saturated = False
            return False
        capacity = max(1, ready_slots * self.max_concurrent_batches)
        threshold = DESATURATE_PCT if self.saturated else SATURATE_PCT
        self.saturated = load * 100 >= capacity * threshold
        return self.saturated


def gpu_slots(identity: HealthIdentity, readiness: Readiness, *, terminated: bool = False) -> tuple[bool, int, int]:
    """(ready, total GPU slots, ready GPU slots) as the heartbeat reports them."""
    ready = readiness.ready and not terminated
    total = max(identity.backend_children, identity.gpu_count, 1)
    return ready, total, (min(readiness.ready_children, total) if ready else 0)


def health_payload(
    identity: HealthIdentity,
    readiness: Readiness,
    *,
    bundle_config_hash: str,
    queue_depth: int = 0,
    pending_cost: int = 0,
    inflight_batches: int = 0,
    saturated: bool = False,
    terminated: bool = False,
) -> bytes:
    """The v0.7.1 heartbeat JSON, fields in order (sidecar-behaviour §10)."""
    ready, total, ready_slots = gpu_slots(identity, readiness, terminated=terminated)
    body = {
        "name": identity.worker_id,
        "ready": ready,
        "terminated": terminated,
        "gpu_count": identity.gpu_count,
        "total_gpu_slots": total,
        "ready_gpu_slots": ready_slots,
        "machine_profile": identity.machine_profile,
        "pool_name": identity.pool_name,
        "bundle": identity.bundle,
        "bundle_config_hash": bundle_config_hash,
        "loaded_models": readiness.loaded_models,
        "queue_depth": queue_depth,
        "pending_cost": pending_cost,
        "inflight_batches": inflight_batches,
        "saturated": saturated,
    }
    return json.dumps(body, separators=(",", ":")).encode()


class HealthReporter:
    """Builds each heartbeat from the telemetry registry the schedulers record into (queued items,
    their cost, batches in flight) and keeps the saturation state between beats."""

    def __init__(
        self, identity: HealthIdentity, readiness: Readiness, telemetry: Registry, *, max_concurrent_batches: int = 4
    ) -> None:
        self.identity = identity
        self.readiness = readiness
        self.saturation = Saturation(max_concurrent_batches)
        self._queued = telemetry.gauge(PENDING_ITEMS)
        self._queued_cost = telemetry.gauge(PENDING_COST)
        self._running = telemetry.gauge(INFLIGHT_BATCHES)
        self._saturated = telemetry.gauge(SATURATED)
        self._total_slots = telemetry.gauge(GPU_SLOTS, (("state", "total"),))
        self._ready_slots = telemetry.gauge(GPU_SLOTS, (("state", "ready"),))

    def payload(self, bundle_config_hash: str, *, terminated: bool = False) -> bytes:
        """The next heartbeat (or, with `terminated`, the shutdown tombstone)."""
        _, total, ready_slots = gpu_slots(self.identity, self.readiness, terminated=terminated)
        depth = max(0, int(self._queued.value))
        inflight = max(0, int(self._running.value))
        saturated = self.saturation.update(depth + inflight, ready_slots)
        self._saturated.set(1 if saturated else 0)
        self._total_slots.set(total)
        self._ready_slots.set(ready_slots)
        return health_payload(
            self.identity,
            self.readiness,
            bundle_config_hash=bundle_config_hash,
            queue_depth=depth,
            pending_cost=max(0, int(self._queued_cost.value)),
            inflight_batches=inflight,
            saturated=saturated,
            terminated=terminated,
        )


__all__ = [
    "HealthIdentity",
    "HealthReporter",
    "Readiness",
    "Saturation",
    "gpu_slots",
    "health_payload",
    "heartbeat",
    "start_probes",
]
