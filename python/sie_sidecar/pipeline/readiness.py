# SPDX-License-Identifier: Apache-2.0
"""Readiness (sidecar-behaviour §10): what the IPC heartbeat learnt about the backend, which the probes,
the health heartbeat and the pull gate read."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..logs import should_log

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Readiness:
    """What `/readyz` and the health heartbeat report."""

    ping_interval_ms: int = 2000
    stale_mult: int = 3
    draining: bool = False
    last_ping_ok: float | None = None  # time.monotonic() of the last successful heartbeat
    loaded_models: list[str] = field(default_factory=list)
    #: Models whose load is in progress on a ready child (newer than v0.7.1: Ping's `loading_models`).
    loading_models: list[str] = field(default_factory=list)
    #: Set when the loaded or loading set changes (the health heartbeat publishes at once).
    models_changed: asyncio.Event = field(default_factory=asyncio.Event)
    ready_children: int = 0
    #: The latest heartbeat was answered, and every answer said "not ready" (an unhealthy backend).
    backend_refusing: bool = False
    #: The backend refuses batch work as `draining` (a batch was refused, or the drain probe said so);
    #: only a drain probe that finds it taking work again clears it. Ping cannot tell (§3.1, §3.9).
    backend_draining: bool = False
    #: No drain probe has run since the backend last answered ready (the handshake needs one).
    probe_due: bool = True
    #: Batches refused as draining so far: a probe that began before the latest refusal cannot clear it.
    refusals: int = 0
    #: Set after every heartbeat round (the pull gate waits on it).
    changed: asyncio.Event = field(default_factory=asyncio.Event)

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

    def lease_pause_reason(self, now: float | None = None) -> str | None:
        """Why deadline leases must not be renewed now (§15.3): draining, or an established
        heartbeat gone stale. Before the first heartbeat they go on."""
        if self.draining:
            return "draining"
        if self.last_ping_ok is None:
            return None
        reason = self.reason(now)
        return reason if reason is not None and reason.startswith("heartbeat stale") else None

    def pull_reason(self, now: float | None = None) -> str | None:
        """Why the sidecar must not pull now, None when it may (issue 9, law 2): `/readyz`'s reason,
        or a backend that answers its heartbeat with "not ready" (draining, say). The probe keeps the
        v0.7.1 rule (only a stale heartbeat turns it), but pulling stops at the first such answer:
        every item pulled then would only be refused and NAKed."""
        reason = self.reason(now)
        if reason is None and self.backend_refusing:
            return "backend not ready (it answers the heartbeat with ready=false)"
        if reason is None and self.backend_draining:
            return "backend draining (it refuses batch work; probed each heartbeat)"
        return reason

    def backend_refused(self) -> None:
        """The backend refused a batch as draining: stop pulling now, not at the next heartbeat (every
        item pulled meanwhile would be refused too), until a drain probe finds it taking work."""
        self.backend_draining = True
        self.refusals += 1
        self.changed.set()


class PingClient(Protocol):
    async def ping(self) -> Any: ...
    async def probe_draining(self, model_id: str = "") -> bool: ...


class ConfigSink(Protocol):
    def adopt(self, backend_hash: str) -> None: ...


async def heartbeat(clients: list[PingClient], readiness: Readiness, config: ConfigSink, stop: asyncio.Event) -> None:
    """Ping every backend child each interval (first tick at once); record success and models. While a
    drain probe is due (the handshake, a batch refused as draining, a drain seen before) the children
    that answered ready are probed too, before the round is published, so the pull gate never opens
    on a backend that would refuse what it pulls."""
    failures = 0
    while not stop.is_set():
        replies = await asyncio.gather(*(c.ping() for c in clients), return_exceptions=True)
        answered = [r for r in replies if not isinstance(r, BaseException)]
        ready = [r for r in answered if getattr(r, "ready", False)]
        readiness.ready_children = len(ready)
        readiness.backend_refusing = bool(answered) and not ready
        if not ready:
            readiness.probe_due = True  # when it answers ready again, the handshake probes again
        elif readiness.probe_due or readiness.backend_draining:
            ready_clients = [c for c, r in zip(clients, replies, strict=True) if getattr(r, "ready", False)]
            await _probe_drain(ready_clients, ready, readiness)
        if ready:
            failures = 0
            readiness.last_ping_ok = time.monotonic()
            config.adopt(ready[0].bundle_config_hash)
            loaded = sorted({m for r in ready for m in r.loaded_models})
            loading = sorted({m for r in ready for m in getattr(r, "loading_models", ())})
            if (loaded, loading) != (readiness.loaded_models, readiness.loading_models):
                readiness.models_changed.set()
            readiness.loaded_models, readiness.loading_models = loaded, loading
        else:
            failures += 1
            if should_log(failures):
                errors = [repr(r) for r in replies if isinstance(r, BaseException)]
                log.warning("backend heartbeat failed", extra={"failures": failures, "errors": errors[:3]})
        readiness.changed.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), readiness.ping_interval_ms / 1000.0)


async def _probe_drain(clients: list[PingClient], pongs: list[Any], readiness: Readiness) -> None:
    """Ask each ready child whether it refuses batch work (an empty batch, so no delivery is spent);
    a child that cannot be asked leaves the verdict as it was, and the next round asks again."""
    models = [next(iter(getattr(p, "loaded_models", ()) or ()), "") for p in pongs]
    refusals = readiness.refusals
    answers = await asyncio.gather(
        *(c.probe_draining(m) for c, m in zip(clients, models, strict=True)), return_exceptions=True
    )
    verdicts = [a for a in answers if isinstance(a, bool)]
    if len(verdicts) < len(answers):
        errors = [repr(a) for a in answers if isinstance(a, BaseException)]
        log.warning("backend drain probe failed", extra={"errors": errors[:3]})
        readiness.probe_due = True
        return
    draining = any(verdicts) or readiness.refusals != refusals  # refused while asking: still draining
    if draining != readiness.backend_draining:
        log.info("backend draining" if draining else "backend takes batch work again")
    readiness.backend_draining = draining
    readiness.probe_due = False


__all__ = ["PingClient", "Readiness", "heartbeat"]
