# SPDX-License-Identifier: Apache-2.0
"""The NATS health heartbeat on `sie.health.{worker_id}` (sidecar-behaviour §10): the payload, and the
publisher that sends it every interval and a tombstone at shutdown."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from nats.aio.client import Client as NatsClient

from .. import wire
from ..logs import should_log
from ..pipeline.readiness import Readiness
from ..telemetry import GPU_SLOTS, INFLIGHT_BATCHES, PENDING_COST, PENDING_ITEMS, SATURATED, Registry

log = logging.getLogger(__name__)

#: How long a tombstone's flush may take (main waits 2 s for the publisher's, §15.4 step 3).
TOMBSTONE_FLUSH_S = 2


class ConfigSource(Protocol):
    """Where the advertised bundle-config hash is read (the pipeline's config gate)."""

    @property
    def current(self) -> str | None: ...
    @property
    def unsupported_models(self) -> Sequence[str]: ...


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
    unsupported_models: Sequence[str] = (),
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
        "loading_models": readiness.loading_models,  # newer than v0.7.1 (§10), after loaded_models
        "queue_depth": queue_depth,
        "pending_cost": pending_cost,
        "inflight_batches": inflight_batches,
        "saturated": saturated,
    }
    if unsupported_models:  # newer than v0.7.1: omitted when empty
        body["unsupported_models"] = list(unsupported_models)
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

    def payload(
        self, bundle_config_hash: str, *, unsupported_models: Sequence[str] = (), terminated: bool = False
    ) -> bytes:
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
            unsupported_models=unsupported_models,
            queue_depth=depth,
            pending_cost=max(0, int(self._queued_cost.value)),
            inflight_batches=inflight,
            saturated=saturated,
            terminated=terminated,
        )


async def publish_health(
    nc: NatsClient,
    reporter: HealthReporter,
    *,
    config: ConfigSource,
    interval_ms: int,
    stop: asyncio.Event,
) -> None:
    """The NATS heartbeat (§10): first beat at once, then every interval until `stop`; the load fields
    and `saturated` come from the telemetry registry, and a beat goes out at once when the loaded or
    loading set changes. Failures are logged on counts 1, 5, 30, every 120."""
    subject = wire.health_subject(reporter.identity.worker_id)
    failures = 0
    while not stop.is_set():
        reporter.readiness.models_changed.clear()
        try:
            await nc.publish(
                subject, reporter.payload(config.current or "", unsupported_models=config.unsupported_models)
            )
        except Exception as exc:  # logged on counts 1, 5, 30, every 120 (§10)
            failures += 1
            if should_log(failures):
                log.warning("health publish failed", extra={"failures": failures, "error": repr(exc)})
        await _next_beat(reporter.readiness.models_changed, stop, interval_ms / 1000.0)
    await publish_tombstone(nc, reporter, config)  # the first of the two (§10); main sends the second


async def publish_tombstone(nc: NatsClient, reporter: HealthReporter, config: ConfigSource) -> None:
    """The shutdown beat (`ready=false`, `terminated=true`, no ready slots), flushed; failures are
    logged, never raised: shutdown goes on."""
    payload = reporter.payload(config.current or "", unsupported_models=config.unsupported_models, terminated=True)
    try:
        await nc.publish(wire.health_subject(reporter.identity.worker_id), payload)
        await nc.flush(timeout=TOMBSTONE_FLUSH_S)
    except Exception as exc:
        log.warning("health tombstone not published", extra={"error": repr(exc)})


async def _next_beat(models_changed: asyncio.Event, stop: asyncio.Event, interval_s: float) -> None:
    """Until the interval has passed, `stop` is set, or the loaded or loading set changed (newer than
    v0.7.1: a beat at once, so the gateway routes to a model the moment it is ready). The caller
    clears `models_changed` before it builds a beat, so a change during the publish is not lost."""
    waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(models_changed.wait())}
    try:
        await asyncio.wait(waiters, timeout=interval_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


__all__ = [
    "ConfigSource",
    "HealthIdentity",
    "HealthReporter",
    "Saturation",
    "gpu_slots",
    "health_payload",
    "publish_health",
    "publish_tombstone",
]
