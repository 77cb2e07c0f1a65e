# SPDX-License-Identifier: Apache-2.0
"""What both ingest modes wire around the dispatcher, whatever feeds it: its settings, the pull
quantum, the registry and recording switch, live config, the reconciler and the heartbeat, the pull
loop over a `Source`, and the gate that opens it once the backend can serve (sidecar-behaviour §1.2,
§5.1, §9, §10)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import Settings
from ..control.config_service import Reconciler
from ..control.live_config import LiveConfig
from ..ipc.children import BackendChildren
from ..ipc.client import IpcClient
from ..payloads import PayloadStore
from ..pipeline.admission import Admission
from ..pipeline.dispatcher import ConfigState, Dispatcher
from ..pipeline.feed import feed
from ..pipeline.gate import PausableSource, gate_pulls
from ..pipeline.readiness import PingClient, Readiness, heartbeat
from ..pipeline.source import Source
from ..sched.quantum import LatencyWindow, QuantumController
from ..telemetry import RecordingSwitch, Registry
from .drain import end_tasks
from .gc import PeriodicCollection, tune_gc_for_steady_state
from .telemetry_side import recording_switch, start_metrics


def quantum_controller(settings: Settings) -> QuantumController:
    """The pull quantum's controller (§5.1 step 4) from the `SIE_ADAPTIVE_*` settings."""
    return QuantumController(
        LatencyWindow(),
        min_ms=settings.adaptive_min_quantum_ms,
        max_ms=settings.adaptive_max_quantum_ms,
        target_p50_ms=settings.adaptive_target_p50_ms,
        include_queue_ms=settings.pull_quantum_include_queue_ms,
    )


@dataclass
class PipelineState:
    """What the dispatcher is built over in either mode, made before it: the pull quantum, the
    advertised config state, the registry the stages record into and the switch that starts it."""

    quantum: QuantumController
    config: ConfigState
    telemetry: Registry
    recording: RecordingSwitch


def open_pipeline_state(
    settings: Settings,
    resources: contextlib.AsyncExitStack,
    ipc: IpcClient | BackendChildren,
    payloads: PayloadStore,
) -> PipelineState:
    """The quantum controller, the config state, the registry and its recording switch, then OTLP
    metrics (§13) when enabled."""
    quantum = quantum_controller(settings)
    config = ConfigState(settings.bundle_config_hash)
    telemetry = Registry()
    recording = recording_switch(settings)
    start_metrics(settings, telemetry, resources, ipc, payloads, recording=recording)
    return PipelineState(quantum=quantum, config=config, telemetry=telemetry, recording=recording)


def live_config(
    settings: Settings,
    config: ConfigState,
    *,
    ipc: IpcClient | BackendChildren,
    readiness: Readiness,
    telemetry: Registry,
    stop: asyncio.Event,
) -> LiveConfig:
    """Live config (§9); it writes under the execution barrier. A commit wakes the health beat, which
    carries the new hash at once."""
    return LiveConfig(
        config,
        ipc,
        bundle=settings.bundle,
        pool=settings.pool,
        allow_list=settings.config_producer_allow_list,
        stop=stop,
        telemetry=telemetry,
        on_commit=readiness.models_changed.set,
    )


def start_reconciler(
    settings: Settings,
    live: LiveConfig,
    config: ConfigState,
    hb_stop: asyncio.Event,
    background: list[asyncio.Task[Any]],
) -> Reconciler | None:
    """The config-service reconciler (§9.3) when a service is configured; refusals and divergence
    wake it."""
    if settings.config_service_url is None:
        return None
    reconciler = Reconciler(
        live,
        settings.config_service_url,
        settings.config_service_bearer,
        poll_interval_s=settings.worker_config_poll_interval_ms / 1000.0,
        full_export_interval_s=settings.worker_config_full_export_interval_ms / 1000.0,
        stop=hb_stop,
    )
    live.on_behind = config.on_refused = reconciler.wake
    config.on_diverged = reconciler.resync
    background.append(asyncio.create_task(reconciler.run()))
    return reconciler


def start_heartbeat(
    ipc: IpcClient | BackendChildren,
    readiness: Readiness,
    config: ConfigState,
    hb_stop: asyncio.Event,
    background: list[asyncio.Task[Any]],
) -> list[PingClient]:
    """The IPC heartbeat over every backend child (§10); returns the children pinged."""
    pingers: list[PingClient] = [*ipc.pingers()] if isinstance(ipc, BackendChildren) else [ipc]
    background.append(asyncio.create_task(heartbeat(pingers, readiness, config, hb_stop)))
    return pingers


def start_feed(
    settings: Settings,
    source: Source,
    dispatcher: Dispatcher,
    *,
    quantum: QuantumController,
    tasks: set[asyncio.Task[None]],
    stop: asyncio.Event,
    on_idle: Callable[[], None],
) -> asyncio.Task[None]:
    """The pull loop (§5.1) over one source, into the dispatcher: batches capped by the fetch budget
    and the smallest batch budget a backend reported, coalescing only while the pipeline is busy."""
    budget = settings.nats_fetch_budget
    return asyncio.create_task(
        feed(
            source,
            dispatcher.handle,
            budget=lambda: min(budget, dispatcher.intake_limit()),
            inflight=settings.concurrency.pull_batches,
            stop=stop,
            tasks=tasks,
            quantum=quantum,
            idle_bypass=settings.batcher_idle_bypass_enabled,
            on_idle=on_idle,
            busy=lambda: not dispatcher.idle(),
        )
    )


def start_gate(
    settings: Settings,
    readiness: Readiness,
    sources: Sequence[PausableSource],
    pull_stop: asyncio.Event,
    resources: contextlib.AsyncExitStack,
    *,
    hb_stop: asyncio.Event,
    background: list[asyncio.Task[Any]],
    collection: PeriodicCollection | None = None,
    admission: Admission | None = None,
) -> asyncio.Task[None]:
    """The last start-up step of either mode: start-up is done, so its heap is frozen and young
    collections made rarer, cycles are collected by time instead (`collection`, or a new one), and
    the gate starts: it resumes the sources (started paused) once the backend is ready and, with an
    admission gate (§8), the pool admitted."""
    tune_gc_for_steady_state()
    if collection is None:
        collection = PeriodicCollection()
    collection.start(hb_stop, background)
    gate = asyncio.create_task(
        gate_pulls(
            readiness,
            sources,
            pull_stop,
            return_delay_s=settings.nak_delay_ms / 1000.0,
            poll_s=settings.worker_ping_interval_ms / 1000.0,
            admission=admission,
            admission_pause_s=settings.pool_admission_pause_ms / 1000.0,
        )
    )
    resources.push_async_callback(end_tasks, [gate], pull_stop)
    return gate


__all__ = [
    "PipelineState",
    "live_config",
    "open_pipeline_state",
    "quantum_controller",
    "start_feed",
    "start_gate",
    "start_heartbeat",
    "start_reconciler",
]
