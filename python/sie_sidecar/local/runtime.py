# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar run` with `SIE_SIDECAR_INGEST=local` (sidecar-behaviour §11, §15.4): the same
pipeline as NATS mode (dispatcher, schedulers, IPC client, live config reconciler, heartbeat and
probes) fed by the local socket instead of JetStream. No NATS connection, publisher, health
publisher, config subscriber or admission poll.

Shutdown: the listener stops and removes its socket file (in-flight calls get the pull-loop join
to finish, then answer `cancelled`), then readiness and the heartbeat, the reconciler, the scheduler
drain and the backend drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

from ..config import Settings
from ..errors import StartupError
from ..ipc.children import BackendChildren
from ..ipc.client import IpcClient
from ..pipeline.config_gate import ConfigState
from ..pipeline.deadlines import DeadlineRules
from ..pipeline.delivery import Settler
from ..pipeline.dispatcher import Dispatcher
from ..pipeline.gate import gate_pulls
from ..pipeline.readiness import Readiness
from ..telemetry import Registry
from .ingest import LocalPipeline
from .server import LocalIngest
from .source import LocalReplies, LocalSource

log = logging.getLogger(__name__)

TASK_JOIN_S = 10.0
BACKEND_DRAIN_MS = 15_000
GENERATION_JOIN_S = 15.0


@dataclass
class LocalRunning:
    settings: Settings
    ipc: IpcClient | BackendChildren
    readiness: Readiness
    dispatcher: Dispatcher
    settler: Settler
    source: LocalSource
    ingest: LocalIngest
    tasks: set[asyncio.Task[None]]
    loop: asyncio.Task[None]
    gate: asyncio.Task[None]
    pull_stop: asyncio.Event
    background: list[asyncio.Task[Any]]
    hb_stop: asyncio.Event


async def start_local(settings: Settings, stop: asyncio.Event, resources: contextlib.AsyncExitStack) -> LocalRunning:
    """Open everything in start-up order, each close pushed onto `resources` as soon as it exists."""
    from ..app import (
        PeriodicCollection,
        _dispatch_settings,
        _end_tasks,
        attach_catalog,
        live_config,
        open_backend_side,
        quantum_controller,
        recording_switch,
        start_feed,
        start_heartbeat,
        start_metrics,
        start_reconciler,
        start_tracing,
        tune_gc_for_steady_state,
    )

    assert settings.local_socket is not None
    limits = settings.concurrency
    payloads, readiness, probes, ipc = await open_backend_side(settings, resources)
    quantum = quantum_controller(settings)
    config = ConfigState(settings.bundle_config_hash)
    telemetry = Registry()
    recording = recording_switch(settings)
    start_metrics(settings, telemetry, resources, ipc, payloads, recording=recording)
    replies = LocalReplies()
    settler = Settler(replies)  # no broker: ACKs land on the slots in one call per batch; a NAK is the local retry
    dispatcher = Dispatcher(
        # Deadlines are NATS work's (§15.3): local ingest runs what its caller sent.
        dataclasses.replace(_dispatch_settings(settings), deadlines=DeadlineRules(judge=False)),
        ipc,
        replies,
        settler,
        config=config,
        shutdown=stop,
        quantum=quantum,
        payloads=payloads,
        telemetry=telemetry,
        tracer=start_tracing(settings, resources),
    )
    attach_catalog(settings, config, dispatcher, recording)
    background: list[asyncio.Task[Any]] = []
    hb_stop = asyncio.Event()
    resources.push_async_callback(_end_tasks, background, hb_stop)
    live = live_config(settings, config, ipc=ipc, readiness=readiness, telemetry=telemetry, stop=stop)
    start_reconciler(settings, live, config, hb_stop, background)
    start_heartbeat(ipc, readiness, config, hb_stop, background)
    source = LocalSource(max_outstanding=limits.pull_outstanding)
    resources.callback(source.stop)
    if probes is not None and settings.debug_endpoint:

        def debug_state() -> dict[str, Any]:
            recording.turn_on()  # a watched sidecar records from the first read on (telemetry/switch.py)
            state = dispatcher.debug_state()
            state["ingest"] = {"mode": "local", "queued": source.queued, "paused": source.paused()}
            return state

        probes.serve_debug(debug_state, telemetry, loopback_only=settings.debug_endpoint_peers == "loopback")
    pipeline = LocalPipeline(
        source=source,
        replies=replies,
        generations=dispatcher.generations,
        worker_id=settings.worker_id,
        pool=settings.pool,
        machine_profile=settings.machine_profile,
        bundle=settings.bundle,
    )
    ingest = LocalIngest(settings.local_socket, pipeline)
    try:
        await ingest.start()
    except OSError as exc:
        raise StartupError("local ingest socket", f"{settings.local_socket}: {exc}") from None
    resources.push_async_callback(ingest.close, 0.0)
    tasks: set[asyncio.Task[None]] = set()
    dispatcher.set_on_idle(source.wake)
    dispatcher.on_draining = readiness.backend_refused
    pull_stop = asyncio.Event()
    loop = start_feed(settings, source, dispatcher, quantum=quantum, tasks=tasks, stop=pull_stop, on_idle=source.wake)
    resources.push_async_callback(_end_tasks, [loop], pull_stop)
    tune_gc_for_steady_state()
    PeriodicCollection().start(hb_stop, background)
    gate = asyncio.create_task(
        gate_pulls(
            readiness,
            [source],
            pull_stop,
            return_delay_s=settings.nak_delay_ms / 1000.0,
            poll_s=settings.worker_ping_interval_ms / 1000.0,
        )
    )
    resources.push_async_callback(_end_tasks, [gate], pull_stop)
    log.info("local ingest listening", extra={"socket": settings.local_socket})
    return LocalRunning(
        settings=settings,
        ipc=ipc,
        readiness=readiness,
        dispatcher=dispatcher,
        settler=settler,
        source=source,
        ingest=ingest,
        tasks=tasks,
        loop=loop,
        gate=gate,
        pull_stop=pull_stop,
        background=background,
        hb_stop=hb_stop,
    )


async def drain_local(r: LocalRunning) -> None:
    """§15.4 in local mode: the listener (in-flight calls finish within the join, else `cancelled`),
    then the pull loop, readiness and heartbeat, the reconciler, the scheduler drain, generations and
    the backend drain."""
    from ..app import _end_tasks, record_drain

    started = time.monotonic()
    pending: set[asyncio.Task[None]] = set()
    await r.ingest.close(TASK_JOIN_S)
    r.pull_stop.set()
    r.gate.cancel()
    await asyncio.gather(r.loop, r.gate, return_exceptions=True)
    r.source.stop()
    if r.tasks:
        _, pending = await asyncio.wait(set(r.tasks), timeout=TASK_JOIN_S)
        for task in pending:
            task.cancel()
    await r.dispatcher.join_parked()
    await r.dispatcher.close_schedulers(r.settings.scheduler_drain_deadline_ms / 1000.0)
    await r.dispatcher.generations.join(GENERATION_JOIN_S)
    r.readiness.draining = True
    r.hb_stop.set()
    await _end_tasks(r.background)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(r.ipc.drain(BACKEND_DRAIN_MS), BACKEND_DRAIN_MS / 1000.0 + 1)
    record_drain(r.dispatcher.telemetry, started, clean=not pending)


__all__ = ["LocalRunning", "drain_local", "start_local"]
