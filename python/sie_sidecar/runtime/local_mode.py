# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar run` with `SIE_SIDECAR_INGEST=local` (sidecar-behaviour §11, §15.4): the same
pipeline as NATS mode (dispatcher, schedulers, IPC client, live config reconciler, heartbeat and
probes) fed by the local socket instead of JetStream. No NATS connection, publisher, health
publisher, config subscriber or admission poll.

Shutdown: the listener stops and removes its socket file (in-flight calls get the pull-loop join
to finish, then answer `cancelled`), then the pull loop, the scheduler drain and the generations,
readiness and the heartbeat, the reconciler, and the backend drain.
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
from ..local.ingest import LocalPipeline
from ..local.server import LocalIngest
from ..local.source import LocalReplies, LocalSource
from ..pipeline.deadlines import DeadlineRules
from ..pipeline.delivery import Settler
from ..pipeline.dispatcher import Dispatcher
from ..pipeline.readiness import Readiness
from ..probes import ProbeServer
from .backend_side import open_backend_side
from .drain import TASK_JOIN_S, drain_backend, drain_pipeline, end_tasks, join_in_flight, record_drain, stop_pulling
from .pipeline_side import (
    PipelineState,
    live_config,
    open_pipeline_state,
    start_feed,
    start_gate,
    start_heartbeat,
    start_reconciler,
)
from .telemetry_side import attach_catalog, start_tracing

log = logging.getLogger(__name__)


@dataclass
class LocalRunning:
    """What `start_local` opened, for the drain (§15.4); the exit stack closes it all on every path."""

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


def serve_debug_state(
    settings: Settings, probes: ProbeServer, state: PipelineState, dispatcher: Dispatcher, source: LocalSource
) -> None:
    """`/debug/state` on the probe port, with the local source's queue in place of NATS's parts."""

    def debug_state() -> dict[str, Any]:
        state.recording.turn_on()  # a watched sidecar records from the first read on (telemetry/switch.py)
        snapshot = dispatcher.debug_state()
        snapshot["ingest"] = {"mode": "local", "queued": source.queued, "paused": source.paused()}
        return snapshot

    probes.serve_debug(debug_state, state.telemetry, loopback_only=settings.debug_endpoint_peers == "loopback")


async def open_listener(
    settings: Settings, source: LocalSource, replies: LocalReplies, dispatcher: Dispatcher
) -> LocalIngest:
    """The local socket (§11), bound to the source, the reply slots and the generation streams; a
    socket that cannot be opened is fatal."""
    assert settings.local_socket is not None
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
    return ingest


async def start_local(settings: Settings, stop: asyncio.Event, resources: contextlib.AsyncExitStack) -> LocalRunning:
    """Open everything in start-up order, each close pushed onto `resources` as soon as it exists."""
    assert settings.local_socket is not None
    limits = settings.concurrency
    payloads, readiness, probes, ipc = await open_backend_side(settings, resources)
    state = open_pipeline_state(settings, resources, ipc, payloads)
    replies = LocalReplies()
    settler = Settler(replies)  # no broker: ACKs land on the slots in one call per batch; a NAK is the local retry
    dispatcher = Dispatcher(
        # Deadlines are NATS work's (§15.3): local ingest runs what its caller sent.
        dataclasses.replace(settings.dispatch, deadlines=DeadlineRules(judge=False)),
        ipc,
        replies,
        settler,
        config=state.config,
        shutdown=stop,
        quantum=state.quantum,
        payloads=payloads,
        telemetry=state.telemetry,
        tracer=start_tracing(settings, resources),
    )
    attach_catalog(settings, state.config, dispatcher, state.recording)
    background: list[asyncio.Task[Any]] = []
    hb_stop = asyncio.Event()
    resources.push_async_callback(end_tasks, background, hb_stop)
    live = live_config(settings, state.config, ipc=ipc, readiness=readiness, telemetry=state.telemetry, stop=stop)
    start_reconciler(settings, live, state.config, hb_stop, background)
    start_heartbeat(ipc, readiness, state.config, hb_stop, background)
    source = LocalSource(max_outstanding=limits.pull_outstanding)
    resources.callback(source.stop)
    if probes is not None and settings.debug_endpoint:
        serve_debug_state(settings, probes, state, dispatcher, source)
    ingest = await open_listener(settings, source, replies, dispatcher)
    resources.push_async_callback(ingest.close, 0.0)
    tasks: set[asyncio.Task[None]] = set()
    dispatcher.set_on_idle(source.wake)
    dispatcher.on_draining = readiness.backend_refused
    pull_stop = asyncio.Event()
    loop = start_feed(
        settings, source, dispatcher, quantum=state.quantum, tasks=tasks, stop=pull_stop, on_idle=source.wake
    )
    resources.push_async_callback(end_tasks, [loop], pull_stop)
    gate = start_gate(settings, readiness, [source], pull_stop, resources, hb_stop=hb_stop, background=background)
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
    then the pull loop, the scheduler drain and generations, readiness and heartbeat, the reconciler
    and the backend drain."""
    started = time.monotonic()
    await r.ingest.close(TASK_JOIN_S)
    await stop_pulling(r.pull_stop, r.gate, [r.loop])
    r.source.stop()
    pending = await join_in_flight(r.tasks)
    await drain_pipeline(r.dispatcher, r.settings)
    r.readiness.draining = True
    r.hb_stop.set()
    await end_tasks(r.background)
    await drain_backend(r.ipc)
    record_drain(r.dispatcher.telemetry, started, clean=not pending)


def log_stopped_local(r: LocalRunning) -> None:
    """The last line of a clean stop: batch sizes and how every call's items were settled."""
    counts = r.settler.counts
    settled = {"acked": counts.acked, "dropped": counts.dropped, "naked": counts.naked}
    log.info("stopped", extra={"batch_sizes": r.dispatcher.batch_summary(), "settled": settled})


__all__ = ["LocalRunning", "drain_local", "log_stopped_local", "start_local"]
