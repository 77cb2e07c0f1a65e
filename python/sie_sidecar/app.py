# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar run`: wire NATS, the backend client, the dispatcher and the probes together, run
until SIGTERM/SIGINT, then drain (sidecar-behaviour §2.1 startup order, §15.4 shutdown)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from . import wire
from .bus import ack_confirm
from .bus import connect as connection
from .bus.attempts import observe_pulls
from .bus.config_sub import subscribe_config
from .bus.connect import NATS_FAILURES, NatsClient
from .bus.control import Subscription, subscribe_cancels, unsubscribe_all
from .bus.health import HealthIdentity, HealthReporter, publish_health, publish_tombstone
from .bus.outbound import FramedWriter
from .bus.publisher import Publisher
from .bus.pull import PullConsumer
from .bus.topology import POOL_ACK_WAIT_S, TopologySpec, consumer_ack_wait_s, establish_topology, reconcile_forever
from .config import Settings
from .control.config_service import Reconciler
from .control.gateway import poll_forever
from .control.live_config import LiveConfig
from .errors import ConfigError, StartupError, TopologyError
from .ipc.children import BackendChildren
from .ipc.client import IpcClient, observe_ipc
from .ipc.mux import MuxIpcClient
from .otel.tracing import Tracer
from .payloads import PayloadStore, PayloadStoreConfigError
from .pipeline.admission import Admission
from .pipeline.deadlines import DeadlineRules
from .pipeline.delivery import Settler
from .pipeline.dispatcher import PARKED_JOIN_S, SHUTDOWN_NAK_MS, ConfigState, Dispatcher, DispatchSettings
from .pipeline.feed import feed
from .pipeline.gate import gate_pulls
from .pipeline.readiness import PingClient, Readiness, heartbeat
from .pipeline.source import Source
from .prep.audio import configure_permits as configure_audio_permits
from .probes import ProbeServer, start_probes
from .sched.quantum import LatencyWindow, QuantumController
from .sched.scheduler import MAX_ITEM_WAIT_S, SchedulerConfig
from .telemetry import SHUTDOWN_DRAIN_DURATION, ModelCatalog, RecordingSwitch, Registry

if TYPE_CHECKING:
    from .config import OtlpTransport
    from .local.runtime import LocalRunning
    from .otel.target import Target

log = logging.getLogger(__name__)
_T = TypeVar("_T")

TASK_JOIN_S = 10.0
HEALTH_TOMBSTONE_WAIT_S = 2.0
BACKEND_DRAIN_MS = 15_000
#: How long `_drain` waits for the backend's Drain answer: its deadline and a second for the reply.
BACKEND_DRAIN_WAIT_S = BACKEND_DRAIN_MS / 1000.0 + 1
GENERATION_JOIN_S = 15.0


#: Allocations (net) between gen-0 collections once started; CPython's default is 700.
GC_GEN0_THRESHOLD = 10_000


def tune_gc_for_steady_state() -> None:
    """Start-up is done: freeze the heap it built (imports, settings, compiled patterns) and make
    young collections rarer.

    The hot path makes short-lived, acyclic objects by the thousand per second; with CPython's gen-0
    threshold of 700 the collector ran every few batches and walked the whole start-up heap at each
    full collection: ~5% of the sidecar's CPU under load (perf, in-memory pipeline). Reference
    counting frees those objects anyway; the collector is for cycles, rare here. No `gc.collect()`
    first: it costs tens of ms before the first reply, and start-up's cyclic garbage is bounded.
    """
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


#: A full collection at least this often once started (see `PeriodicCollection`).
GC_INTERVAL_S = 60.0


class PeriodicCollection:
    """A full `gc.collect()` every `GC_INTERVAL_S`, timed, so cyclic garbage is bounded by time.

    Why: with start-up frozen and gen-0 at 10,000 net allocations, the hot path (acyclic, freed by
    reference counting) nets about one tracked object a second, so an automatic collection can be
    hours away; meanwhile cycles the standard library makes pile up. Each closed TCP connection's
    asyncio transport keeps itself alive through its own bound read callback, with its sockets,
    addresses and extra dict: ~65 Python blocks per probe or short-lived HTTP connection, which the
    soak measured as a steady +3 blocks/s (docs/reliability.md, "Soak"). The frozen heap is not walked,
    so a full collection costs about a millisecond; `/debug/state` shows `memory.gc.periodic`."""

    def __init__(self, interval_s: float | None = None) -> None:
        self.interval_s = GC_INTERVAL_S if interval_s is None else interval_s
        self.runs = 0
        self.freed = 0
        self.last_ms = 0.0
        self.max_ms = 0.0

    def collect(self) -> int:
        """One full collection now; the objects it freed."""
        started = time.perf_counter()
        freed = gc.collect()
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        self.runs += 1
        self.freed += freed
        self.last_ms = elapsed_ms
        self.max_ms = max(self.max_ms, elapsed_ms)
        return freed

    async def run(self, stop: asyncio.Event) -> None:
        """Collect every `interval_s` until `stop` is set."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
            if not stop.is_set():
                self.collect()

    def start(self, stop: asyncio.Event, background: list[asyncio.Task[Any]]) -> None:
        """Run it as a background task, ended with the others at shutdown."""
        background.append(asyncio.create_task(self.run(stop)))

    def snapshot(self) -> dict[str, float | int]:
        """What `/debug/state` shows under `memory.gc.periodic`."""
        return {
            "interval_s": self.interval_s,
            "runs": self.runs,
            "freed": self.freed,
            "last_ms": round(self.last_ms, 3),
            "max_ms": round(self.max_ms, 3),
        }


def _dispatch_settings(settings: Settings, *, ack_wait_s: float = POOL_ACK_WAIT_S) -> DispatchSettings:
    """The dispatcher's and the schedulers' share of the settings (§1.2 batching and pipelining);
    `ack_wait_s` sets the schedulers' progress-ACK interval and their bound on any item's wait."""
    limits = settings.concurrency
    return DispatchSettings(
        worker_id=settings.worker_id,
        nak_delay_ms=settings.nak_delay_ms,
        fetch_budget=settings.fallback_batch_budget,
        max_concurrent_batches=limits.model_groups,
        scheduler=SchedulerConfig(
            max_batch_cost=settings.batcher_max_batch_cost,
            max_batch_requests=settings.batcher_max_batch_requests,
            requests_from_budget=not settings.batcher_requests_pinned,
            max_batch_wait_ms=settings.batcher_max_batch_wait_ms,
            coalesce_ms=settings.batcher_coalesce_ms,
            coalesce_ratio=settings.batcher_coalesce_ratio,
            pipeline_depth=limits.pipeline_depth,
            idle_bypass=settings.batcher_idle_bypass_enabled,
            jit_dispatch=settings.batcher_jit_dispatch_enabled,
            drain_deadline_s=settings.scheduler_drain_deadline_ms / 1000.0,
            max_item_wait_s=min(MAX_ITEM_WAIT_S, ack_wait_s / 4),
            progress_after_s=ack_wait_s / 2,
        ),
        wave_cadence=settings.wave_cadence,
        controller_env=dict(settings.adaptive_batch_env),
        controller_trace_dir=settings.controller_trace_dir,
        cost_pinned=settings.batcher_cost_pinned,
        parked_deadline_s=settings.redelivery_envelope_s,
        generate_frame_timeout_s=settings.generate_ipc_frame_timeout_s,
        deadlines=DeadlineRules(
            enforce=settings.work_deadline_enforce,
            skew_s=settings.work_deadline_skew_tolerance_ms / 1000.0,
            max_budget_s=settings.work_deadline_max_budget_s,
            horizon_s=settings.tombstone_horizon_s,
        ),
        ipc_request_timeout_s=settings.ipc_request_timeout_s,
    )


def _backend_client(settings: Settings) -> IpcClient | BackendChildren:
    """One IPC client, or one per backend child with placement and the config fan-out (§9.5); each
    pooled, or multiplexed over one connection with `SIE_IPC_MUX` (§1.2)."""
    limits = settings.concurrency
    paths = list(dict.fromkeys(settings.ipc_socket_paths)) or [settings.ipc_socket_path]
    clients: list[IpcClient] = []
    for path in paths:
        if settings.ipc_mux:
            client: IpcClient = MuxIpcClient(
                path,
                request_timeout_s=settings.ipc_request_timeout_s,
                model_ready_timeout_s=settings.model_ready_timeout_s,
            )
        else:
            client = IpcClient(
                path,
                pool_size=limits.ipc_connections,
                request_timeout_s=settings.ipc_request_timeout_s,
                model_ready_timeout_s=settings.model_ready_timeout_s,
            )
        clients.append(client)
    return clients[0] if len(clients) == 1 else BackendChildren(clients)


@dataclass
class _Running:
    """What `_start` opened, for the drain (§15.4); the exit stack closes it all on every path."""

    settings: Settings
    nc: NatsClient
    ipc: IpcClient | BackendChildren
    readiness: Readiness
    dispatcher: Dispatcher
    settler: Settler
    publisher: Publisher
    config: ConfigState
    reporter: HealthReporter
    consumers: list[PullConsumer]
    loops: list[asyncio.Task[None]]
    gate: asyncio.Task[None]
    tasks: set[asyncio.Task[None]]
    pull_stop: asyncio.Event
    subs: list[Subscription]
    background: list[asyncio.Task[Any]]
    hb_stop: asyncio.Event
    health_stop: asyncio.Event
    health: asyncio.Task[None] | None


async def _end_tasks(tasks: list[asyncio.Task[Any]], *events: asyncio.Event) -> None:
    """Set the tasks' stop events, cancel them and wait for them; a no-op once they are done."""
    for event in events:
        event.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def open_backend_side(
    settings: Settings, resources: contextlib.AsyncExitStack
) -> tuple[PayloadStore, Readiness, ProbeServer | None, IpcClient | BackendChildren]:
    """What every ingest mode opens first: the payload store (an unusable SIE_PAYLOAD_STORE_URL is
    fatal, §3), readiness and the probes (a bind failure is logged only, §10), the backend client."""
    try:
        payloads = PayloadStore.from_settings(settings)
    except PayloadStoreConfigError as exc:
        raise StartupError("payload store", str(exc), code=2) from None
    resources.callback(payloads.close)
    readiness = Readiness(
        ping_interval_ms=settings.worker_ping_interval_ms, stale_mult=settings.worker_readyz_stale_mult
    )
    probes = await start_probes(readiness, settings.worker_probe_port)
    if probes is not None:
        resources.push_async_callback(probes.cleanup)
    ipc = _backend_client(settings)
    resources.push_async_callback(ipc.close)
    return payloads, readiness, probes, ipc


METRICS_FLUSH_S = 5.0


def recording_switch(settings: Settings) -> RecordingSwitch:
    """Recording starts with the process when OTLP metrics are on; otherwise at the first read of
    `/debug/state` (telemetry/switch.py), or never."""
    return RecordingSwitch(now=settings.metrics_enabled)


def attach_catalog(settings: Settings, config: ConfigState, dispatcher: Dispatcher, recording: RecordingSwitch) -> None:
    """The §13 (model, profile) catalog, seeded from SIE_METRIC_MODEL_ALLOWLIST; live config extends
    and replaces it. The model lanes record with it once recording is on."""
    config.catalog = ModelCatalog(settings.otel.model_allowlist)

    def attach() -> None:
        assert config.catalog is not None
        dispatcher.record_with(config.catalog)
        dispatcher.generations.telemetry = dispatcher.telemetry

    recording.when_on(attach)


def otel_resource(settings: Settings) -> dict[str, str]:
    """The §13 resource both OTLP signals carry: the sidecar's attributes (`service.instance.id` is
    the worker id, so pods' series stay apart), `OTEL_RESOURCE_ATTRIBUTES` over them, then
    `service.name`, `deployment.environment` and `cloud.region` as config.py resolved them (their
    own variables first, then `OTEL_RESOURCE_ATTRIBUTES`, then the defaults)."""
    from . import __version__

    otel = settings.otel
    attributes = {"service.version": __version__, "service.instance.id": settings.worker_id}
    attributes.update(otel.resource_attributes)
    attributes.update(
        {
            "service.name": otel.service_name,
            "deployment.environment": otel.deployment_environment,
            "cloud.region": otel.cloud_region,
        }
    )
    return attributes


def otlp_target(endpoint: str, protocol: str, transport: OtlpTransport) -> Target:
    """One signal's resolved OTLP settings, as otel/ takes them (it imports nothing of config)."""
    from .otel.target import Target

    return Target(
        endpoint,
        protocol,
        headers=transport.headers.reveal(),
        compression=transport.compression,
        certificate=transport.certificate,
        client_key=transport.client_key,
        client_certificate=transport.client_certificate,
        timeout_s=transport.timeout_s,
        insecure=transport.insecure,
    )


def _flush_on_exit(
    resources: contextlib.AsyncExitStack, name: str, run: Callable[[asyncio.Event], Coroutine[Any, Any, None]]
) -> None:
    """Run `run(stop)` as a task; when the exit stack closes (after the drain) set `stop` and give the
    task METRICS_FLUSH_S for its last export."""
    stop = asyncio.Event()
    task = asyncio.create_task(run(stop), name=name)

    async def flush() -> None:
        stop.set()
        _, pending = await asyncio.wait({task}, timeout=METRICS_FLUSH_S)
        for late in pending:
            late.cancel()

    resources.push_async_callback(flush)


def start_metrics(
    settings: Settings,
    telemetry: Registry,
    resources: contextlib.AsyncExitStack,
    ipc: IpcClient | BackendChildren,
    payloads: PayloadStore,
    *,
    recording: RecordingSwitch,
) -> None:
    """OTLP metrics (§13) when enabled: the OpenTelemetry SDK's exporter, fed the registry's snapshot
    every export interval, and a last one when the exit stack closes (after the drain, so the final
    counts go out). Only then (or with the debug endpoint, which `sie-sidecar top` reads) do the IPC
    clients record per request: disabled, that costs nothing."""
    otel = settings.otel
    endpoint = otel.metrics_endpoint

    def attach() -> None:
        clients = list(ipc.clients) if isinstance(ipc, BackendChildren) else [ipc]
        for client in clients:
            client.telemetry = telemetry
        payloads.telemetry = telemetry
        observe_ipc(telemetry, clients)

    recording.when_on(attach)
    if not settings.metrics_enabled or endpoint is None:
        return
    from . import __version__
    from .otel.export import MetricsPush, OtlpThread

    thread = OtlpThread("otlp-metrics")
    resources.callback(thread.close)  # after the last export (the exit stack unwinds in reverse)
    push = MetricsPush(
        telemetry,
        thread,
        otlp_target(endpoint, otel.metrics_protocol, otel.metrics_transport),
        resource=otel_resource(settings),
        lane=otel.lane,
        interval_s=otel.export_interval_s,
        version=__version__,
        temporality=otel.metrics_temporality,
    )
    _flush_on_exit(resources, "otlp-metrics", push.run)
    log.info(
        "OTLP metrics on",
        extra={"endpoint": endpoint, "protocol": otel.metrics_protocol, "interval_s": otel.export_interval_s},
    )


def start_tracing(settings: Settings, resources: contextlib.AsyncExitStack) -> Tracer | None:
    """Batch spans (`SIE_TRACING_ENABLED`) when enabled: sampled from OTEL_TRACES_SAMPLER, handed to
    the OpenTelemetry SDK's batch span processor (OTEL_BSP_*) as they end, and what it holds exported
    (bounded) when the exit stack closes, after the drain."""
    otel = settings.otel
    if not settings.tracing_enabled or otel.traces_endpoint is None:
        return None
    from . import __version__
    from .otel.export import OtlpThread, TracePush
    from .otel.tracing import Sampler, SpanBuffer

    buffer = SpanBuffer(otel.traces_max_queue)
    tracer = Tracer(Sampler(otel.traces_sampler, otel.traces_sampler_ratio), buffer, lane=otel.lane)
    thread = OtlpThread("otlp-traces")
    resources.callback(thread.close)
    push = TracePush(
        buffer,
        thread,
        otlp_target(otel.traces_endpoint, otel.traces_protocol, otel.traces_transport),
        resource=otel_resource(settings),
        version=__version__,
        max_queue_size=otel.traces_max_queue,
        schedule_delay_s=otel.traces_schedule_delay_s,
        max_export_batch_size=otel.traces_max_export_batch,
        export_timeout_s=otel.traces_export_timeout_s,
    )
    _flush_on_exit(resources, "otlp-traces", push.run)
    log.info(
        "OTLP traces on",
        extra={"endpoint": otel.traces_endpoint, "protocol": otel.traces_protocol, "sampler": otel.traces_sampler},
    )
    return tracer


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


def quantum_controller(settings: Settings) -> QuantumController:
    """The pull quantum's controller (§5.1 step 4) from the `SIE_ADAPTIVE_*` settings."""
    return QuantumController(
        LatencyWindow(),
        min_ms=settings.adaptive_min_quantum_ms,
        max_ms=settings.adaptive_max_quantum_ms,
        target_p50_ms=settings.adaptive_target_p50_ms,
        include_queue_ms=settings.pull_quantum_include_queue_ms,
    )


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


async def _start(settings: Settings, stop: asyncio.Event, resources: contextlib.AsyncExitStack) -> _Running:
    """Open everything in start-up order (§2.1), pushing each part's close onto `resources` as soon as
    it exists, so that a failure (or a signal) at any step closes what came before, in reverse."""
    limits = settings.concurrency
    payloads, readiness, probes, ipc = await open_backend_side(settings, resources)

    events = connection.NatsEvents(settings.redact_text)
    nc = NatsClient()
    resources.push_async_callback(connection.close, nc, events)
    try:
        await connection.connect(nc, settings, events)
    except connection.ConnectError as exc:
        raise StartupError("NATS connect", str(exc)) from None
    js = nc.jetstream()
    spec = TopologySpec.from_settings(settings)
    # Subscriptions are synced by a JetStream call the documented worker permissions allow (§2.6).
    sync_via = f"$JS.API.STREAM.INFO.{spec.pool_stream}"
    try:
        await establish_topology(js, spec, events.describe)  # failure is fatal (§2.1)
    except TopologyError as exc:
        raise StartupError("NATS topology", str(exc)) from None
    ack_wait_s = await consumer_ack_wait_s(js, spec)

    quantum = quantum_controller(settings)
    config = ConfigState(settings.bundle_config_hash)
    telemetry = Registry()
    recording = recording_switch(settings)
    start_metrics(settings, telemetry, resources, ipc, payloads, recording=recording)
    writer = FramedWriter(nc)  # the connection's one writer: replies, then their ACKs, in order
    confirmer = await _ack_confirmer(nc, writer, settings, ack_wait_s)
    if confirmer is not None:
        resources.push_async_callback(confirmer.close)  # after the drain, before NATS closes
    settler = Settler(writer, None) if confirmer is None else Settler(confirmer, confirmer)
    publisher = Publisher(nc, writer=writer)

    def attach_settlement() -> None:
        settler.telemetry = telemetry  # settlement counts are NATS operations here (§13)
        publisher.telemetry = telemetry

    recording.when_on(attach_settlement)
    dispatcher = Dispatcher(
        _dispatch_settings(settings, ack_wait_s=ack_wait_s),
        ipc,
        publisher,
        settler,
        config=config,
        # §7: a request tombstone lives as long as its request can still be delivered (1800 s default).
        tombstones=wire.TombstoneSet(ttl_s=settings.tombstone_horizon_s),
        shutdown=stop,
        quantum=quantum,
        payloads=payloads,
        telemetry=telemetry,
        acks_with_replies=writer.framed,  # one writer for both: a batch's ACKs follow its replies
        tracer=start_tracing(settings, resources),
    )
    attach_catalog(settings, config, dispatcher, recording)
    dispatcher.leases.paused = readiness.lease_pause_reason  # §15.3: no renewal while draining or stale
    if isinstance(ipc, BackendChildren):
        ipc.pressure = dispatcher.model_pressure  # placement weighs each child's pending work
    subs: list[Subscription] = []
    resources.push_async_callback(unsubscribe_all, subs)
    try:
        await subscribe_cancels(nc, dispatcher, settings.worker_id, subs, sync_via=sync_via)
    except NATS_FAILURES as exc:
        raise StartupError("cancel subscriptions", events.describe(exc)) from None

    background: list[asyncio.Task[Any]] = []
    hb_stop = asyncio.Event()
    health_stop = asyncio.Event()
    resources.push_async_callback(_end_tasks, background, hb_stop, health_stop)
    # Live config (§9): the subscriber, then the reconciler; both write under the execution barrier.
    live = live_config(settings, config, ipc=ipc, readiness=readiness, telemetry=telemetry, stop=stop)
    await subscribe_config(nc, live, subs, stop, sync_via=sync_via)
    reconciler = start_reconciler(settings, live, config, hb_stop, background)
    pingers = start_heartbeat(ipc, readiness, config, hb_stop, background)
    admission: Admission | None = None
    if settings.pool_admission_active and settings.gateway_url is not None:
        admission = Admission(
            settings.pool,
            stale_after_s=settings.pool_admission_stale_after_ms / 1000.0,
            on_change=readiness.changed.set,  # the gate re-checks at once
        )
        dispatcher.set_admission(admission)
        background.append(
            asyncio.create_task(
                poll_forever(
                    admission,
                    hb_stop,
                    gateway_url=settings.gateway_url,
                    api_key=settings.gateway_api_key,
                    worker=settings.worker_id,
                    machine_profile=settings.machine_profile,
                    interval_s=settings.pool_admission_check_interval_ms / 1000.0,
                )
            )
        )
    if settings.nats_consumer_reconcile_interval_ms > 0:
        background.append(
            asyncio.create_task(
                reconcile_forever(js, spec, settings.nats_consumer_reconcile_interval_ms / 1000.0, stop)
            )
        )
    identity = HealthIdentity(
        worker_id=settings.worker_id,
        machine_profile=settings.machine_profile,
        pool_name=settings.pool,
        bundle=settings.bundle,
        gpu_count=settings.gpu_count,
        backend_children=len(pingers),
    )
    reporter = HealthReporter(identity, readiness, telemetry, max_concurrent_batches=limits.model_groups)
    consumers: list[PullConsumer] = []  # made below; the debug endpoint may be asked before
    collection = PeriodicCollection()
    if probes is not None and settings.debug_endpoint:
        from .bus.lag import ConsumerLag, Watched
        from .telemetry.memory import gc_stats, memory_stats  # ctypes and mallinfo2 only with the debug endpoint

        lag = ConsumerLag(  # read from JetStream only while someone reads the state
            js,
            [
                Watched("pool", spec.pool_stream, spec.pool_durable),
                Watched("worker", spec.worker_stream, spec.worker_consumer),
            ],
            describe=events.describe,
        )
        resources.push_async_callback(lag.close)

        def debug_state() -> dict[str, Any]:
            recording.turn_on()  # a watched sidecar records from the first read on (telemetry/switch.py)
            state = dispatcher.debug_state()
            state["placement"] = ipc.placement() if isinstance(ipc, BackendChildren) else {}
            state["pool_quarantined"] = isinstance(ipc, BackendChildren) and ipc.quarantined
            state["live_config"] = live.snapshot() | {
                "reconciler": None if reconciler is None else reconciler.snapshot()
            }
            state["memory"] = memory_stats() | {"gc": gc_stats() | {"periodic": collection.snapshot()}}
            state["consumers"] = [consumer.snapshot() for consumer in consumers]
            state["ack_confirm"] = None if confirmer is None else confirmer.snapshot()
            state["nats"] = events.snapshot()
            state["lag"] = lag.read()
            return state

        probes.serve_debug(debug_state, telemetry, loopback_only=settings.debug_endpoint_peers == "loopback")
    health: asyncio.Task[None] | None = None
    if settings.health_publish_enabled:
        health = asyncio.create_task(
            publish_health(
                nc,
                reporter,
                config=config,
                interval_ms=settings.health_publish_interval_ms,
                stop=health_stop,
            )
        )
        background.append(health)

    outstanding = limits.pull_outstanding
    consumers = [
        PullConsumer(
            nc,
            wire.worker_stream_name(settings.worker_id),
            wire.worker_consumer_name(settings.worker_id),
            batch=settings.nats_fetch_budget,
            expires_s=settings.nats_pull_expires_s,
            max_outstanding=outstanding,
            writer=writer,
        ),
        PullConsumer(
            nc,
            wire.pool_stream_name(settings.pool),
            wire.pool_durable_name(settings.pool, settings.machine_profile, settings.bundle),
            batch=settings.nats_fetch_budget,
            expires_s=settings.nats_pull_expires_s,
            max_outstanding=outstanding,
            writer=writer,
        ),
    ]
    for consumer in consumers:
        events.on_reconnected.append(consumer.on_reconnected)

    def attach_pulls() -> None:
        for consumer in consumers:
            consumer.telemetry = telemetry  # delivery attempts, per pulled batch (§13)
        observe_pulls(telemetry, consumers)

    recording.when_on(attach_pulls)
    tasks: set[asyncio.Task[None]] = set()

    def wake_all() -> None:
        for consumer in consumers:
            consumer.wake()

    dispatcher.set_on_idle(wake_all)
    if not settings.pull_outstanding_pinned:

        def follow_count_cap(cap: int) -> None:
            ahead = limits.pull_outstanding_for(cap, settings.max_ack_pending)
            log.info("pull-ahead derived from the batch budget", extra={"count_cap": cap, "max_outstanding": ahead})
            for consumer in consumers:
                consumer.set_max_outstanding(ahead)

        dispatcher.on_count_cap = follow_count_cap

    def shutdown_nak_ms() -> int:
        # Past the life of our own pull requests: sooner, the server would hand the item straight
        # back to one of them, and the NAK on arrival would cost another delivery.
        live_s = max((c.requests_live_s() for c in consumers), default=0.0)
        return max(SHUTDOWN_NAK_MS, round(live_s * 1000))

    dispatcher.shutdown_nak_ms = shutdown_nak_ms
    dispatcher.on_draining = readiness.backend_refused

    pull_stop = asyncio.Event()
    loops: list[asyncio.Task[None]] = []
    for consumer in consumers:
        resources.push_async_callback(consumer.stop)
        try:
            await consumer.start(paused="handshake pending")  # the gate resumes it once the backend is ready
        except NATS_FAILURES as exc:
            raise StartupError("pull consumers", events.describe(exc)) from None
        loop = start_feed(
            settings, consumer, dispatcher, quantum=quantum, tasks=tasks, stop=pull_stop, on_idle=wake_all
        )
        loops.append(loop)
        resources.push_async_callback(_end_tasks, [loop], pull_stop)  # the loop ends before its consumer stops
    tune_gc_for_steady_state()  # start-up is done: freeze its heap, rarer young collections
    collection.start(hb_stop, background)  # ... and cycles collected by time instead
    gate = asyncio.create_task(
        gate_pulls(
            readiness,
            consumers,
            pull_stop,
            return_delay_s=settings.nak_delay_ms / 1000.0,
            poll_s=settings.worker_ping_interval_ms / 1000.0,
            admission=admission,
            admission_pause_s=settings.pool_admission_pause_ms / 1000.0,
        )
    )
    resources.push_async_callback(_end_tasks, [gate], pull_stop)
    return _Running(
        settings=settings,
        nc=nc,
        ipc=ipc,
        readiness=readiness,
        dispatcher=dispatcher,
        settler=settler,
        publisher=publisher,
        config=config,
        reporter=reporter,
        consumers=consumers,
        loops=loops,
        gate=gate,
        tasks=tasks,
        pull_stop=pull_stop,
        subs=subs,
        background=background,
        hb_stop=hb_stop,
        health_stop=health_stop,
        health=health,
    )


async def _drain(r: _Running) -> None:
    """The shutdown sequence up to the backend drain (§15.4 steps 1-7); the exit stack then flushes and
    closes NATS, the IPC client, the probes and the payload store."""
    settings = r.settings
    started = time.monotonic()
    pending: set[asyncio.Task[None]] = set()
    # 1. Stop taking work; finish and settle what is in flight (bounded).
    r.pull_stop.set()
    r.gate.cancel()
    await asyncio.gather(*r.loops, r.gate, return_exceptions=True)
    for consumer in r.consumers:
        await consumer.stop()
    if r.tasks:
        _, pending = await asyncio.wait(set(r.tasks), timeout=TASK_JOIN_S)
        for task in pending:
            task.cancel()
        if pending:
            log.warning(
                "in-flight batches cancelled at the drain deadline; JetStream redelivers them",
                extra={"tasks": len(pending)},
            )
    await unsubscribe_all(r.subs)
    # 2. Readiness off, heartbeat stopped; 3. health tombstones: the publisher sends one as it
    # stops (waited for up to 2 s), then main sends the second (§10); then the reconcilers and the
    # config tasks end. Before the joins below, so the gateway stops routing worker-direct work
    # here while the queued work drains.
    r.readiness.draining = True
    r.hb_stop.set()
    r.health_stop.set()
    if settings.health_publish_enabled:
        if r.health is not None:
            await asyncio.wait({r.health}, timeout=HEALTH_TOMBSTONE_WAIT_S)
        await publish_tombstone(r.nc, r.reporter, r.config)
    await _end_tasks(r.background)
    # Parked groups (§15.4 step 4) saw the stop and hand their items back; bounded.
    await r.dispatcher.join_parked()
    # Scheduler drain (§15.4 step 5): flush what is queued, bounded; the rest is NAKed to come back.
    await r.dispatcher.close_schedulers(settings.scheduler_drain_deadline_ms / 1000.0)
    # 6. Generation tasks joined, bounded; unfinished ones are cancelled and NAK their items.
    await r.dispatcher.generations.join(GENERATION_JOIN_S)
    # 7. Backend drain; 8. (the exit stack) NATS flush and close, probes off.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(r.ipc.drain(BACKEND_DRAIN_MS), BACKEND_DRAIN_WAIT_S)
    record_drain(r.dispatcher.telemetry, started, clean=not pending)


async def _ack_confirmer(
    nc: NatsClient, writer: FramedWriter, settings: Settings, ack_wait_s: float
) -> ack_confirm.AckConfirmer | None:
    """The settler's writer when ACKs are confirmed (`SIE_NATS_ACK_CONFIRM_S` > 0), answers subscribed."""
    if settings.nats_ack_confirm_s <= 0:
        return None
    confirmer = ack_confirm.AckConfirmer(nc, writer, timeout_s=settings.nats_ack_confirm_s, ack_wait_s=ack_wait_s)
    try:
        await confirmer.start()
    except NATS_FAILURES as exc:
        raise StartupError("ACK confirmation subscription", str(exc)) from None
    return confirmer


def record_drain(telemetry: Registry, started: float, *, clean: bool) -> None:
    """`sie.worker.shutdown.drain.duration` (§13): how long the drain took, and whether in-flight work
    had to be cancelled at the join deadline."""
    outcome = "success" if clean else "deadline_exceeded"
    telemetry.record(SHUTDOWN_DRAIN_DURATION, time.monotonic() - started, (("outcome", outcome),))


def shutdown_bound_s(settings: Settings) -> float:
    """The longest a SIGTERM'd sidecar takes to exit when every bounded step of `_drain` and the exit
    stack runs to its deadline: a pod's termination grace shorter than this lets the kubelet SIGKILL
    a drain that would have settled its batches (deploy/kubernetes is checked against it)."""
    pulls = settings.nats_pull_expires_s + 1.0  # the pull loops see the stop when their request ends
    drain = (
        TASK_JOIN_S
        + PARKED_JOIN_S
        + settings.scheduler_drain_deadline_ms / 1000.0
        + GENERATION_JOIN_S
        + HEALTH_TOMBSTONE_WAIT_S
        + BACKEND_DRAIN_WAIT_S
    )
    exporters = METRICS_FLUSH_S * 2  # the last OTLP metrics and traces pushes
    confirmations = ack_confirm.CLOSE_WAIT_S if settings.nats_ack_confirm_s > 0 else 0.0
    return pulls + drain + confirmations + connection.CLOSE_FLUSH_S + exporters


def _log_stopped(r: _Running) -> None:
    counts = r.settler.counts
    log.info(
        "stopped",
        extra={
            "batch_sizes": r.dispatcher.batch_summary(),
            "settled": {
                "acked": counts.acked,
                "dropped": counts.dropped,
                "naked": counts.naked,
                "left_unacked": counts.left_unacked,
            },
            "published": {
                "single": r.publisher.stats.single,
                "chunked": r.publisher.stats.chunked,
                "compact_error": r.publisher.stats.compact_error,
            },
        },
    )


async def _unless_stopped(coro: Coroutine[Any, Any, _T], stop: asyncio.Event) -> _T | None:
    """Run the start-up, giving up (cancelled) as soon as `stop` is set: a signal while NATS is still
    unreachable ends the process at once instead of after the connect deadline."""
    task = asyncio.ensure_future(coro)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return None if task.cancelled() else task.result()


async def _run(settings: Settings, stop: asyncio.Event, started: asyncio.Event | None) -> int:
    from . import __version__  # nats-py imported importlib.metadata already: ~0.6 ms CPU here

    log.info("starting", extra={"version": __version__, "settings": settings.redacted()})
    for warning in settings.warnings:
        log.warning(warning)
    try:
        settings.require_supported()
    except ConfigError as exc:
        log.error(f"start-up failed: configuration: {exc}", extra={"step": "configuration", "exit_code": 2})
        return 2
    configure_audio_permits(settings.concurrency.audio_decodes)  # concurrent audio decodes (§7.3)
    if settings.ingest == "local":
        from .local.runtime import drain_local, start_local

        return await _serve(
            settings,
            stop,
            started,
            start=start_local,
            drain=drain_local,
            stopped=_log_stopped_local,
            where={"ingest": "local"},
        )
    return await _serve(
        settings, stop, started, start=_start, drain=_drain, stopped=_log_stopped, where={"pool": settings.pool}
    )


def _log_stopped_local(r: LocalRunning) -> None:
    counts = r.settler.counts
    settled = {"acked": counts.acked, "dropped": counts.dropped, "naked": counts.naked}
    log.info("stopped", extra={"batch_sizes": r.dispatcher.batch_summary(), "settled": settled})


async def _serve(
    settings: Settings,
    stop: asyncio.Event,
    started: asyncio.Event | None,
    *,
    start: Callable[[Settings, asyncio.Event, contextlib.AsyncExitStack], Coroutine[Any, Any, _T]],
    drain: Callable[[_T], Coroutine[Any, Any, None]],
    stopped: Callable[[_T], None],
    where: dict[str, str],
) -> int:
    """Start (giving up as soon as `stop` is set), run until `stop`, drain, close in reverse order:
    the one life cycle of both ingest modes. A start-up failure is one log line and its exit code; a
    defect is one line with its traceback and exit code 1."""
    running: _T | None = None
    try:
        async with contextlib.AsyncExitStack() as resources:
            running = await _unless_stopped(start(settings, stop, resources), stop)
            if running is not None:
                log.info("running", extra={"worker_id": settings.worker_id, **where})
                if started is not None:
                    started.set()
                await stop.wait()
                log.info("draining")
                await drain(running)
    except StartupError as exc:
        log.error(f"start-up failed: {exc.step}: {exc.reason}", extra={"step": exc.step, "exit_code": exc.code})
        return exc.code
    except Exception as exc:  # a defect: one line (the traceback inside it), exit code 1
        log.error("sidecar failed", exc_info=exc, extra={"exit_code": 1})
        return 1
    if running is None:
        log.info("stopped during start-up")
        return 0
    stopped(running)
    return 0


async def run(settings: Settings, *, stop: asyncio.Event | None = None, started: asyncio.Event | None = None) -> int:
    """Run the sidecar until `stop` is set (SIGTERM/SIGINT set it when not given, from the first line
    on, so a signal during start-up ends it too); returns the exit code: 0 after a clean stop, 2 for
    a configuration refused at start-up, 1 for any other failure (one log line, everything opened
    so far closed in reverse order)."""
    handled: list[signal.Signals] = []
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
                handled.append(sig)
    try:
        return await _run(settings, stop, started)
    finally:
        for sig in handled:
            asyncio.get_running_loop().remove_signal_handler(sig)


__all__ = ["StartupError", "run", "shutdown_bound_s"]
