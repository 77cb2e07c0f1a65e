# SPDX-License-Identifier: Apache-2.0
"""NATS ingest: the runtime fed by JetStream pull consumers, answering through the publisher
(sidecar-behaviour §2.1 startup order, §15.4 shutdown). Start-up opens, in order: the backend side,
the NATS connection and topology, the pipeline state, the outbound writer and settlement, the
dispatcher, the cancel subscriptions, the control plane (live config, reconciler, heartbeat,
admission, consumer reconciliation), health, the pull consumers and their loops, and the gate; each
close is pushed onto the exit stack as soon as its part exists."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import wire
from ..bus import ack_confirm
from ..bus import connect as connection
from ..bus.attempts import observe_pulls
from ..bus.config_sub import subscribe_config
from ..bus.connect import NATS_FAILURES, NatsClient
from ..bus.control import Subscription, subscribe_cancels, unsubscribe_all
from ..bus.health import HealthIdentity, HealthReporter, publish_health, publish_tombstone
from ..bus.outbound import FramedWriter
from ..bus.publisher import Publisher
from ..bus.pull import PullConsumer
from ..bus.topology import TopologySpec, consumer_ack_wait_s, establish_topology, reconcile_forever
from ..config import Settings
from ..control.config_service import Reconciler
from ..control.gateway import poll_forever
from ..control.live_config import LiveConfig
from ..errors import StartupError, TopologyError
from ..ipc.children import BackendChildren
from ..ipc.client import IpcClient
from ..payloads import PayloadStore
from ..pipeline.admission import Admission
from ..pipeline.delivery import Settler
from ..pipeline.dispatcher import SHUTDOWN_NAK_MS, ConfigState, Dispatcher
from ..pipeline.readiness import PingClient, Readiness
from ..probes import ProbeServer
from ..telemetry import RecordingSwitch, Registry
from .backend_side import open_backend_side
from .drain import (
    HEALTH_TOMBSTONE_WAIT_S,
    drain_backend,
    drain_pipeline,
    end_tasks,
    join_in_flight,
    record_drain,
    stop_pulling,
)
from .gc import PeriodicCollection
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
class NatsLink:
    """The NATS connection as start-up leaves it: connected, the topology established (§2.1), the
    consumers' ack_wait read back from the server."""

    events: connection.NatsEvents
    nc: NatsClient
    js: Any  # nats-py's JetStreamContext
    spec: TopologySpec
    sync_via: str
    ack_wait_s: float


@dataclass
class Outbound:
    """The connection's one writer (replies, then their ACKs, in order), the ACK confirmer when ACKs
    are confirmed, the settler and the publisher."""

    writer: FramedWriter
    confirmer: ack_confirm.AckConfirmer | None
    settler: Settler
    publisher: Publisher


@dataclass
class ControlPlane:
    """What runs beside the pipeline, ended with the background tasks: live config, the reconciler,
    the backend children pinged, the pool admission gate."""

    live: LiveConfig
    reconciler: Reconciler | None
    pingers: list[PingClient]
    admission: Admission | None


@dataclass
class NatsRunning:
    """What `start_nats` opened, for the drain (§15.4); the exit stack closes it all on every path."""

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


async def connect_nats(settings: Settings, resources: contextlib.AsyncExitStack) -> NatsLink:
    """Connect (its close pushed first), establish the topology (a failure is fatal, §2.1), and read
    the consumers' ack_wait as the server has them."""
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
    return NatsLink(events=events, nc=nc, js=js, spec=spec, sync_via=sync_via, ack_wait_s=ack_wait_s)


async def ack_confirmer(
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


async def open_outbound(
    settings: Settings, link: NatsLink, resources: contextlib.AsyncExitStack, state: PipelineState
) -> Outbound:
    """The writer, the ACK confirmer (closed after the drain, before NATS closes), the settler and
    the publisher; both record NATS operations once recording is on (§13)."""
    writer = FramedWriter(link.nc)  # the connection's one writer: replies, then their ACKs, in order
    confirmer = await ack_confirmer(link.nc, writer, settings, link.ack_wait_s)
    if confirmer is not None:
        resources.push_async_callback(confirmer.close)  # after the drain, before NATS closes
    settler = Settler(writer, None) if confirmer is None else Settler(confirmer, confirmer)
    publisher = Publisher(link.nc, writer=writer)

    def attach_settlement() -> None:
        settler.telemetry = state.telemetry  # settlement counts are NATS operations here (§13)
        publisher.telemetry = state.telemetry

    state.recording.when_on(attach_settlement)
    return Outbound(writer=writer, confirmer=confirmer, settler=settler, publisher=publisher)


def nats_dispatcher(
    settings: Settings,
    stop: asyncio.Event,
    resources: contextlib.AsyncExitStack,
    *,
    link: NatsLink,
    ipc: IpcClient | BackendChildren,
    payloads: PayloadStore,
    readiness: Readiness,
    state: PipelineState,
    out: Outbound,
) -> Dispatcher:
    """The dispatcher over the publisher and the settler, with tombstones, leases paused while
    readiness says so (§15.3), and the catalog; several backend children weigh its pending work."""
    dispatcher = Dispatcher(
        settings.dispatch.for_ack_wait(link.ack_wait_s),
        ipc,
        out.publisher,
        out.settler,
        config=state.config,
        # §7: a request tombstone lives as long as its request can still be delivered (1800 s default).
        tombstones=wire.TombstoneSet(ttl_s=settings.tombstone_horizon_s),
        shutdown=stop,
        quantum=state.quantum,
        payloads=payloads,
        telemetry=state.telemetry,
        acks_with_replies=out.writer.framed,  # one writer for both: a batch's ACKs follow its replies
        tracer=start_tracing(settings, resources),
    )
    attach_catalog(settings, state.config, dispatcher, state.recording)
    dispatcher.leases.paused = readiness.lease_pause_reason  # §15.3: no renewal while draining or stale
    if isinstance(ipc, BackendChildren):
        ipc.pressure = dispatcher.model_pressure  # placement weighs each child's pending work
    return dispatcher


async def cancel_subscriptions(
    settings: Settings, link: NatsLink, dispatcher: Dispatcher, resources: contextlib.AsyncExitStack
) -> list[Subscription]:
    """The cancel subscriptions (§7), registered with the server before the first pull; the list
    collects every later subscription too, all unsubscribed when the exit stack closes."""
    subs: list[Subscription] = []
    resources.push_async_callback(unsubscribe_all, subs)
    try:
        await subscribe_cancels(link.nc, dispatcher, settings.worker_id, subs, sync_via=link.sync_via)
    except NATS_FAILURES as exc:
        raise StartupError("cancel subscriptions", link.events.describe(exc)) from None
    return subs


async def start_control_plane(
    settings: Settings,
    stop: asyncio.Event,
    *,
    link: NatsLink,
    ipc: IpcClient | BackendChildren,
    readiness: Readiness,
    state: PipelineState,
    dispatcher: Dispatcher,
    subs: list[Subscription],
    hb_stop: asyncio.Event,
    background: list[asyncio.Task[Any]],
) -> ControlPlane:
    """Live config (§9): the subscriber, then the reconciler, both writing under the execution
    barrier; the heartbeat (§10); the pool admission poll (§8) when active; the consumer
    reconciliation when its interval is set."""
    live = live_config(settings, state.config, ipc=ipc, readiness=readiness, telemetry=state.telemetry, stop=stop)
    await subscribe_config(link.nc, live, subs, stop, sync_via=link.sync_via)
    reconciler = start_reconciler(settings, live, state.config, hb_stop, background)
    pingers = start_heartbeat(ipc, readiness, state.config, hb_stop, background)
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
                reconcile_forever(link.js, link.spec, settings.nats_consumer_reconcile_interval_ms / 1000.0, stop)
            )
        )
    return ControlPlane(live=live, reconciler=reconciler, pingers=pingers, admission=admission)


def health_reporter(
    settings: Settings, readiness: Readiness, telemetry: Registry, pingers: list[PingClient]
) -> HealthReporter:
    """What the health heartbeat (§10) reports: the worker's identity, readiness and load."""
    identity = HealthIdentity(
        worker_id=settings.worker_id,
        machine_profile=settings.machine_profile,
        pool_name=settings.pool,
        bundle=settings.bundle,
        gpu_count=settings.gpu_count,
        backend_children=len(pingers),
    )
    return HealthReporter(identity, readiness, telemetry, max_concurrent_batches=settings.concurrency.model_groups)


def serve_debug_state(
    settings: Settings,
    probes: ProbeServer,
    resources: contextlib.AsyncExitStack,
    *,
    link: NatsLink,
    ipc: IpcClient | BackendChildren,
    state: PipelineState,
    dispatcher: Dispatcher,
    control: ControlPlane,
    collection: PeriodicCollection,
    consumers: list[PullConsumer],
    confirmer: ack_confirm.AckConfirmer | None,
) -> None:
    """`/debug/state` on the probe port (`sie-sidecar top` reads it). `consumers` may still be empty:
    the endpoint may be asked before they are made."""
    from ..bus.lag import ConsumerLag, Watched
    from ..telemetry.memory import gc_stats, memory_stats  # ctypes and mallinfo2 only with the debug endpoint

    spec = link.spec
    lag = ConsumerLag(  # read from JetStream only while someone reads the state
        link.js,
        [
            Watched("pool", spec.pool_stream, spec.pool_durable),
            Watched("worker", spec.worker_stream, spec.worker_consumer),
        ],
        describe=link.events.describe,
    )
    resources.push_async_callback(lag.close)
    live, reconciler = control.live, control.reconciler

    def debug_state() -> dict[str, Any]:
        state.recording.turn_on()  # a watched sidecar records from the first read on (telemetry/switch.py)
        snapshot = dispatcher.debug_state()
        snapshot["placement"] = ipc.placement() if isinstance(ipc, BackendChildren) else {}
        snapshot["pool_quarantined"] = isinstance(ipc, BackendChildren) and ipc.quarantined
        snapshot["live_config"] = live.snapshot() | {
            "reconciler": None if reconciler is None else reconciler.snapshot()
        }
        snapshot["memory"] = memory_stats() | {"gc": gc_stats() | {"periodic": collection.snapshot()}}
        snapshot["consumers"] = [consumer.snapshot() for consumer in consumers]
        snapshot["ack_confirm"] = None if confirmer is None else confirmer.snapshot()
        snapshot["nats"] = link.events.snapshot()
        snapshot["lag"] = lag.read()
        return snapshot

    probes.serve_debug(debug_state, state.telemetry, loopback_only=settings.debug_endpoint_peers == "loopback")


def start_health(
    settings: Settings,
    nc: NatsClient,
    reporter: HealthReporter,
    config: ConfigState,
    *,
    health_stop: asyncio.Event,
    background: list[asyncio.Task[Any]],
) -> asyncio.Task[None] | None:
    """The health publisher (§10) when enabled; it sends a tombstone as it stops."""
    if not settings.health_publish_enabled:
        return None
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
    return health


def pull_consumers(
    settings: Settings, link: NatsLink, writer: FramedWriter, recording: RecordingSwitch, telemetry: Registry
) -> list[PullConsumer]:
    """The worker-direct and the pool consumer (§2), re-issuing credit after a reconnect and
    recording delivery attempts once recording is on."""
    spec = link.spec  # the names the topology was established with
    consumers = [
        PullConsumer(
            link.nc,
            stream,
            durable,
            batch=settings.nats_fetch_budget,
            expires_s=settings.nats_pull_expires_s,
            max_outstanding=settings.concurrency.pull_outstanding,
            writer=writer,
        )
        for stream, durable in ((spec.worker_stream, spec.worker_consumer), (spec.pool_stream, spec.pool_durable))
    ]
    for consumer in consumers:
        link.events.on_reconnected.append(consumer.on_reconnected)

    def attach_pulls() -> None:
        for consumer in consumers:
            consumer.telemetry = telemetry  # delivery attempts, tallied per run, taken at export (§13)
        observe_pulls(telemetry, consumers)

    recording.when_on(attach_pulls)
    return consumers


def follow_consumers(
    settings: Settings, dispatcher: Dispatcher, consumers: list[PullConsumer], readiness: Readiness
) -> Callable[[], None]:
    """Bind the dispatcher to the consumers: an idle pipeline wakes them, the pull-ahead follows the
    batch budget unless pinned, a shutdown NAK outlives their pull requests, a draining backend
    pauses them (through readiness). Returns what wakes them all."""
    limits = settings.concurrency

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
    return wake_all


async def start_pull_loops(
    settings: Settings,
    consumers: list[PullConsumer],
    dispatcher: Dispatcher,
    resources: contextlib.AsyncExitStack,
    *,
    link: NatsLink,
    state: PipelineState,
    tasks: set[asyncio.Task[None]],
    pull_stop: asyncio.Event,
    on_idle: Callable[[], None],
) -> list[asyncio.Task[None]]:
    """Start each consumer paused (the gate resumes it once the backend is ready) and its pull loop;
    each loop ends before its consumer stops."""
    loops: list[asyncio.Task[None]] = []
    for consumer in consumers:
        resources.push_async_callback(consumer.stop)
        try:
            await consumer.start(paused="handshake pending")  # the gate resumes it once the backend is ready
        except NATS_FAILURES as exc:
            raise StartupError("pull consumers", link.events.describe(exc)) from None
        loop = start_feed(
            settings, consumer, dispatcher, quantum=state.quantum, tasks=tasks, stop=pull_stop, on_idle=on_idle
        )
        loops.append(loop)
        resources.push_async_callback(end_tasks, [loop], pull_stop)  # the loop ends before its consumer stops
    return loops


async def start_nats(settings: Settings, stop: asyncio.Event, resources: contextlib.AsyncExitStack) -> NatsRunning:
    """Open everything in start-up order (§2.1), pushing each part's close onto `resources` as soon as
    it exists, so that a failure (or a signal) at any step closes what came before, in reverse."""
    payloads, readiness, probes, ipc = await open_backend_side(settings, resources)
    link = await connect_nats(settings, resources)
    state = open_pipeline_state(settings, resources, ipc, payloads)
    out = await open_outbound(settings, link, resources, state)
    dispatcher = nats_dispatcher(
        settings, stop, resources, link=link, ipc=ipc, payloads=payloads, readiness=readiness, state=state, out=out
    )
    subs = await cancel_subscriptions(settings, link, dispatcher, resources)

    background: list[asyncio.Task[Any]] = []
    hb_stop = asyncio.Event()
    health_stop = asyncio.Event()
    resources.push_async_callback(end_tasks, background, hb_stop, health_stop)
    control = await start_control_plane(
        settings,
        stop,
        link=link,
        ipc=ipc,
        readiness=readiness,
        state=state,
        dispatcher=dispatcher,
        subs=subs,
        hb_stop=hb_stop,
        background=background,
    )
    reporter = health_reporter(settings, readiness, state.telemetry, control.pingers)
    consumers: list[PullConsumer] = []  # made below; the debug endpoint may be asked before
    collection = PeriodicCollection()
    if probes is not None and settings.debug_endpoint:
        serve_debug_state(
            settings,
            probes,
            resources,
            link=link,
            ipc=ipc,
            state=state,
            dispatcher=dispatcher,
            control=control,
            collection=collection,
            consumers=consumers,
            confirmer=out.confirmer,
        )
    health = start_health(settings, link.nc, reporter, state.config, health_stop=health_stop, background=background)

    consumers.extend(pull_consumers(settings, link, out.writer, state.recording, state.telemetry))
    tasks: set[asyncio.Task[None]] = set()
    wake_all = follow_consumers(settings, dispatcher, consumers, readiness)
    pull_stop = asyncio.Event()
    loops = await start_pull_loops(
        settings,
        consumers,
        dispatcher,
        resources,
        link=link,
        state=state,
        tasks=tasks,
        pull_stop=pull_stop,
        on_idle=wake_all,
    )
    gate = start_gate(
        settings,
        readiness,
        consumers,
        pull_stop,
        resources,
        hb_stop=hb_stop,
        background=background,
        collection=collection,
        admission=control.admission,
    )
    return NatsRunning(
        settings=settings,
        nc=link.nc,
        ipc=ipc,
        readiness=readiness,
        dispatcher=dispatcher,
        settler=out.settler,
        publisher=out.publisher,
        config=state.config,
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


async def drain_nats(r: NatsRunning) -> None:
    """The shutdown sequence up to the backend drain (§15.4 steps 1-7); the exit stack then flushes and
    closes NATS, the IPC client, the probes and the payload store."""
    settings = r.settings
    started = time.monotonic()
    # 1. Stop taking work; finish and settle what is in flight (bounded).
    await stop_pulling(r.pull_stop, r.gate, r.loops)
    for consumer in r.consumers:
        await consumer.stop()
    pending = await join_in_flight(r.tasks)
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
    await end_tasks(r.background)
    # 4. Parked groups saw the stop and hand their items back; 5. the scheduler drain flushes what is
    # queued (the rest is NAKed to come back); 6. generation tasks joined. Each bounded.
    await drain_pipeline(r.dispatcher, settings)
    # 7. Backend drain; 8. (the exit stack) NATS flush and close, probes off.
    await drain_backend(r.ipc)
    record_drain(r.dispatcher.telemetry, started, clean=not pending)


def log_stopped_nats(r: NatsRunning) -> None:
    """The last line of a clean stop: batch sizes, how every delivery was settled, replies published."""
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


__all__ = ["NatsRunning", "drain_nats", "log_stopped_nats", "start_nats"]
