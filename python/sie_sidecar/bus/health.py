# SPDX-License-Identifier: Apache-2.0
"""The NATS health heartbeat on `sie.health.{worker_id}` (sidecar-behaviour §10): the payload, and the
publisher that sends it every interval and a tombstone at shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Protocol

from nats.aio.client import Client as NatsClient

from .. import wire
from ..pipeline.readiness import Readiness

log = logging.getLogger(__name__)


class ConfigSource(Protocol):
    """Where the advertised bundle-config hash is read (the pipeline's config gate)."""

    @property
    def current(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class HealthIdentity:
    """Static fields of the health heartbeat."""

    worker_id: str
    machine_profile: str
    pool_name: str
    bundle: str
    gpu_count: int = 1
    backend_children: int = 1


def health_payload(
    identity: HealthIdentity,
    readiness: Readiness,
    *,
    bundle_config_hash: str,
    queue_depth: int = 0,
    pending_cost: int = 0,
    inflight_batches: int = 0,
    terminated: bool = False,
) -> bytes:
    """The v0.7.1 heartbeat JSON, fields in order (sidecar-behaviour §10)."""
    ready = readiness.ready and not terminated
    total = max(identity.backend_children, identity.gpu_count, 1)
    body = {
        "name": identity.worker_id,
        "ready": ready,
        "terminated": terminated,
        "gpu_count": identity.gpu_count,
        "total_gpu_slots": total,
        "ready_gpu_slots": min(readiness.ready_children, total) if ready else 0,
        "machine_profile": identity.machine_profile,
        "pool_name": identity.pool_name,
        "bundle": identity.bundle,
        "bundle_config_hash": bundle_config_hash,
        "loaded_models": readiness.loaded_models,
        "queue_depth": queue_depth,
        "pending_cost": pending_cost,
        "inflight_batches": inflight_batches,
        "saturated": False,
    }
    return json.dumps(body, separators=(",", ":")).encode()


async def publish_health(
    nc: NatsClient,
    identity: HealthIdentity,
    readiness: Readiness,
    *,
    config: ConfigSource,
    interval_ms: int,
    stop: asyncio.Event,
) -> None:
    """Publish the heartbeat every interval until `stop`; failures are logged on counts 1, 5, 30, every 120."""
    subject = wire.health_subject(identity.worker_id)
    failures = 0
    while not stop.is_set():
        try:
            await nc.publish(subject, health_payload(identity, readiness, bundle_config_hash=config.current or ""))
        except Exception as exc:  # logged on counts 1, 5, 30, every 120 (§10)
            failures += 1
            if failures in (1, 5, 30) or failures % 120 == 0:
                log.warning("health publish failed", extra={"failures": failures, "error": repr(exc)})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_ms / 1000.0)


__all__ = ["ConfigSource", "HealthIdentity", "health_payload", "publish_health"]
