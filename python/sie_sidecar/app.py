# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar run`: wire NATS, the backend client, the dispatcher and the probes together, run
until SIGTERM/SIGINT, then drain (sidecar-behaviour §2.1 startup order, §15.4 shutdown)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from . import wire
from .config import Settings
from .delivery import Settler
from .dispatcher import SHUTDOWN_NAK_MS, ConfigState, Dispatcher, DispatchSettings
from .health import HealthIdentity, Readiness, health_payload, heartbeat, start_probes
from .ipc_client import IpcClient
from .nats_sync import sync_with_server
from .outbound import FramedWriter
from .payloads import PayloadStore, PayloadStoreConfigError
from .prep.audio import configure_permits as configure_audio_permits
from .publisher import Publisher
from .pull import PullConsumer
from .quantum import LatencyWindow, QuantumController
from .scheduler import SchedulerConfig
from .topology import POOL_ACK_WAIT_S, WORKER_ACK_WAIT_S, TopologySpec, ensure_topology, reconcile_forever

log = logging.getLogger(__name__)

TASK_JOIN_S = 10.0
HEALTH_TOMBSTONE_WAIT_S = 2.0
BACKEND_DRAIN_MS = 15_000
#: An item pending this long goes into the next batch whatever its cost (at most a quarter of ack_wait).
MAX_ITEM_WAIT_S = 5.0


async def _pull_loop(
    consumer: PullConsumer,
    handle: Callable[[list[Msg], Callable[[int], None]], Coroutine[Any, Any, None]],
    *,
    budget: int | Callable[[], int],
    inflight: int,
    stop: asyncio.Event,
    tasks: set[asyncio.Task[None]],
    quantum: QuantumController,
    idle_bypass: bool = True,
    on_idle: Callable[[], None] | None = None,
    busy: Callable[[], bool] | None = None,
) -> None:
    """Take coalesced batches from one long-lived pull and hand each to the dispatcher (§5.1).

    The quantum comes from the controller for every batch, and `budget` (a number, or a callable
    read per batch) caps its size. With `idle_bypass`, coalescing ends as
    soon as no batch is being handled (`tasks` is shared by every pull loop) and `busy()` (the
    schedulers have work queued or in flight) is false: waiting for more messages only pays while the
    backend is busy, so an idle worker takes what is there at once.
    """
    slots = asyncio.Semaphore(max(1, inflight))
    size = budget if callable(budget) else (lambda: budget)

    def idle() -> bool:
        return not tasks and (busy is None or not busy())

    stop_early = idle if idle_bypass else None

    def finished(t: asyncio.Task[None]) -> None:
        tasks.discard(t)
        slots.release()
        if not tasks and on_idle is not None:
            on_idle()

    stopped = asyncio.ensure_future(stop.wait())  # one waiter for the whole loop, not one per batch
    try:
        while not stopped.done():
            next_batch = asyncio.ensure_future(consumer.next_batch(max(1, size()), quantum.quantum_s(), stop_early))
            await asyncio.wait({next_batch, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not next_batch.done():
                next_batch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await next_batch
                break
            batch = next_batch.result()
            if not batch:
                continue
            await slots.acquire()
            task: asyncio.Task[None] = asyncio.create_task(handle(batch, consumer.settled))
            tasks.add(task)
            task.add_done_callback(finished)
    finally:
        stopped.cancel()


async def _gate_pulls(
    readiness: Readiness,
    consumers: list[PullConsumer],
    stop: asyncio.Event,
    *,
    return_delay_s: float,
    poll_s: float,
) -> None:
    """Pull only while the backend can serve (issue 9, law 2): pause every consumer while
    `readiness.pull_reason()` says why not (handshake pending, heartbeat stale, backend draining) and
    resume when it clears. The consumers start paused, so nothing is pulled before the first good
    handshake. One log line per change of state (or of the kind of reason). Checked after every
    heartbeat round and every `poll_s` (staleness comes with time alone)."""
    logged: str | None = ""  # the kind of reason last logged; None: pulling; "": nothing logged yet
    while not stop.is_set():
        reason = readiness.pull_reason()
        kind = None if reason is None else reason.split(" (")[0]
        if reason is None:
            for consumer in consumers:
                consumer.resume()
        else:
            for consumer in consumers:
                consumer.pause(reason, return_delay_s=return_delay_s)
        if kind != logged:
            if reason is None:
                log.info("pulling: the backend is ready")
            else:  # at start-up (before the first heartbeat) this is expected: info, not a warning
                level = logging.INFO if logged == "" else logging.WARNING
                log.log(level, "not pulling: the backend cannot serve", extra={"reason": reason})
            logged = kind
        readiness.changed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(poll_s):
                await readiness.changed.wait()


async def _consumer_ack_wait_s(js: Any, spec: TopologySpec) -> float:
    """The shortest ack_wait of the consumers this worker pulls from, as the server has them (an
    operator may have changed the pool durable's; ensure_topology only warns about it)."""
    waits = []
    for stream, durable, default in (
        (spec.pool_stream, spec.pool_durable, POOL_ACK_WAIT_S),
        (spec.worker_stream, spec.worker_consumer, WORKER_ACK_WAIT_S),
    ):
        try:
            info = await js.consumer_info(stream, durable)
            waits.append(float(info.config.ack_wait or default))
        except Exception as exc:  # the configured value is the best guess left
            log.warning("consumer info unavailable", extra={"consumer": durable, "error": repr(exc)})
            waits.append(default)
    return min(waits)


def _dispatch_settings(settings: Settings, *, ack_wait_s: float = POOL_ACK_WAIT_S) -> DispatchSettings:
    """The dispatcher's and the schedulers' share of the settings (§1.2 batching and pipelining);
    `ack_wait_s` sets the schedulers' progress-ACK interval and their bound on any item's wait."""
    return DispatchSettings(
        worker_id=settings.worker_id,
        nak_delay_ms=settings.nak_delay_ms,
        fetch_budget=settings.fallback_batch_budget,
        max_concurrent_batches=settings.max_concurrent_batches,
        scheduler=SchedulerConfig(
            max_batch_cost=settings.batcher_max_batch_cost,
            max_batch_requests=settings.batcher_max_batch_requests,
            max_batch_wait_ms=settings.batcher_max_batch_wait_ms,
            coalesce_ms=settings.batcher_coalesce_ms,
            coalesce_ratio=settings.batcher_coalesce_ratio,
            pipeline_depth=settings.pipeline_depth,
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
    )


def _cancel_handlers(dispatcher: Dispatcher, worker_id: str) -> tuple[Callable[[Msg], Awaitable[None]], ...]:
    async def on_work_cancel(msg: Msg) -> None:
        parsed = wire.parse_work_cancel(msg.subject)
        if parsed is not None:
            dispatcher.tombstones.record(*parsed)

    async def on_batch_cancel(msg: Msg) -> None:
        request_id = wire.parse_batch_cancel(msg.subject, worker_id)
        if request_id is not None:
            dispatcher.batch_tombstones.record(request_id)

    return on_work_cancel, on_batch_cancel


async def _health_publisher(
    nc: NatsClient,
    identity: HealthIdentity,
    readiness: Readiness,
    *,
    config: ConfigState,
    interval_ms: int,
    stop: asyncio.Event,
) -> None:
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


async def run(settings: Settings, *, stop: asyncio.Event | None = None, started: asyncio.Event | None = None) -> int:
    """Run the sidecar until `stop` is set (SIGTERM/SIGINT set it when not given); returns an exit code."""
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
    log.info("starting", extra={"settings": settings.redacted()})
    for warning in settings.warnings:
        log.warning(warning)
    configure_audio_permits(settings.audio_prep_permits)  # concurrent audio decodes (§7.3)

    try:
        payloads = PayloadStore.from_settings(settings)
    except PayloadStoreConfigError as exc:  # an unusable SIE_PAYLOAD_STORE_URL is fatal at start-up (§3)
        log.error("invalid payload store", extra={"error": str(exc)})
        return 2
    readiness = Readiness(
        ping_interval_ms=settings.worker_ping_interval_ms, stale_mult=settings.worker_readyz_stale_mult
    )
    probes = await start_probes(readiness, settings.worker_probe_port)
    ipc = IpcClient(
        settings.ipc_socket_path,
        pool_size=settings.ipc_pool_size,
        request_timeout_s=settings.ipc_request_timeout_s,
        model_ready_timeout_s=settings.model_ready_timeout_s,
    )
    consumers: list[PullConsumer] = []

    async def on_reconnected() -> None:
        log.info("NATS reconnected; re-issuing pull credit")
        for consumer in consumers:
            consumer.on_reconnected()

    nc = await nats.connect(
        servers=settings.nats_servers,
        reconnected_cb=on_reconnected,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        name=f"sie-sidecar {settings.worker_id}",
    )
    js = nc.jetstream()
    spec = TopologySpec.from_settings(settings)
    await ensure_topology(js, spec)  # failure is fatal (§2.1)
    ack_wait_s = await _consumer_ack_wait_s(js, spec)

    quantum = QuantumController(
        LatencyWindow(),
        min_ms=settings.adaptive_min_quantum_ms,
        max_ms=settings.adaptive_max_quantum_ms,
        target_p50_ms=settings.adaptive_target_p50_ms,
        include_queue_ms=settings.pull_quantum_include_queue_ms,
    )
    config = ConfigState(settings.bundle_config_hash)
    settler = Settler(FramedWriter(nc))
    publisher = Publisher(nc)
    dispatcher = Dispatcher(
        _dispatch_settings(settings, ack_wait_s=ack_wait_s),
        ipc,
        publisher,
        settler,
        config=config,
        shutdown=stop,
        quantum=quantum,
        payloads=payloads,
    )
    on_work_cancel, on_batch_cancel = _cancel_handlers(dispatcher, settings.worker_id)
    subs = [
        await nc.subscribe("work_cancel.>", cb=on_work_cancel),
        await nc.subscribe("batch_cancel.>", cb=on_batch_cancel),
    ]
    # A SUB only sits in the client's buffer until written: make sure the server has the cancel
    # subscriptions before the first pull, or a cancel sent at start-up would go unseen (§2.1 order).
    # Not `nc.flush()`: its PING overtakes the queued SUBs (nats_sync.py).
    await sync_with_server(nc)

    background: list[asyncio.Task[Any]] = []
    hb_stop = asyncio.Event()
    background.append(asyncio.create_task(heartbeat([ipc], readiness, config, hb_stop)))
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
    )
    health_stop = asyncio.Event()
    if settings.health_publish_enabled:
        background.append(
            asyncio.create_task(
                _health_publisher(
                    nc,
                    identity,
                    readiness,
                    config=config,
                    interval_ms=settings.health_publish_interval_ms,
                    stop=health_stop,
                )
            )
        )

    outstanding = settings.pull_loop_max_outstanding
    consumers.append(
        PullConsumer(
            nc,
            wire.worker_stream_name(settings.worker_id),
            wire.worker_consumer_name(settings.worker_id),
            batch=settings.nats_fetch_budget,
            expires_s=settings.nats_pull_expires_s,
            max_outstanding=outstanding,
        )
    )
    consumers.append(
        PullConsumer(
            nc,
            wire.pool_stream_name(settings.pool),
            wire.pool_durable_name(settings.pool, settings.machine_profile, settings.bundle),
            batch=settings.nats_fetch_budget,
            expires_s=settings.nats_pull_expires_s,
            max_outstanding=outstanding,
        )
    )
    tasks: set[asyncio.Task[None]] = set()

    def wake_all() -> None:
        for consumer in consumers:
            consumer.wake()

    dispatcher.set_on_idle(wake_all)

    def shutdown_nak_ms() -> int:
        # Past the life of our own pull requests: sooner, the server would hand the item straight
        # back to one of them, and the NAK on arrival would cost another delivery.
        live_s = max((c.requests_live_s() for c in consumers), default=0.0)
        return max(SHUTDOWN_NAK_MS, round(live_s * 1000))

    dispatcher.shutdown_nak_ms = shutdown_nak_ms
    dispatcher.on_draining = lambda: readiness.backend_refused(settings.nak_delay_ms / 1000.0)
    nats_budget = settings.nats_fetch_budget

    pull_stop = asyncio.Event()
    loops = []
    for consumer in consumers:
        await consumer.start(paused="handshake pending")  # the gate resumes it once the backend is ready
        loops.append(
            asyncio.create_task(
                _pull_loop(
                    consumer,
                    dispatcher.handle,
                    budget=lambda: min(nats_budget, dispatcher.intake_limit()),
                    inflight=settings.pull_loop_inflight,
                    stop=pull_stop,
                    tasks=tasks,
                    quantum=quantum,
                    idle_bypass=settings.batcher_idle_bypass_enabled,
                    on_idle=wake_all,
                    busy=lambda: not dispatcher.idle(),
                )
            )
        )
    gate = asyncio.create_task(
        _gate_pulls(
            readiness,
            consumers,
            pull_stop,
            return_delay_s=settings.nak_delay_ms / 1000.0,
            poll_s=settings.worker_ping_interval_ms / 1000.0,
        )
    )
    log.info("running", extra={"worker_id": settings.worker_id, "pool": settings.pool})
    if started is not None:
        started.set()

    await stop.wait()
    log.info("draining")
    # 1. Stop taking work; finish and settle what is in flight (bounded).
    pull_stop.set()
    gate.cancel()
    await asyncio.gather(*loops, gate, return_exceptions=True)
    for consumer in consumers:
        await consumer.stop()
    if tasks:
        _, pending = await asyncio.wait(set(tasks), timeout=TASK_JOIN_S)
        for task in pending:
            task.cancel()
        if pending:
            log.warning(
                "in-flight batches cancelled at the drain deadline; JetStream redelivers them",
                extra={"tasks": len(pending)},
            )
    # Scheduler drain (§15.4 step 5): flush what is queued, bounded; the rest is NAKed to come back.
    await dispatcher.close_schedulers(settings.scheduler_drain_deadline_ms / 1000.0)
    for sub in subs:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    # 2. Readiness off, heartbeat stopped; 3. health tombstone.
    readiness.draining = True
    hb_stop.set()
    health_stop.set()
    if settings.health_publish_enabled:
        with contextlib.suppress(Exception):
            tombstone = health_payload(identity, readiness, bundle_config_hash=config.current or "", terminated=True)
            await nc.publish(wire.health_subject(settings.worker_id), tombstone)
            await nc.flush(timeout=round(HEALTH_TOMBSTONE_WAIT_S))
    for task in background:
        task.cancel()
    await asyncio.gather(*background, return_exceptions=True)
    # 7. Backend drain; 8. NATS flush and close, probes off.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(ipc.drain(BACKEND_DRAIN_MS), BACKEND_DRAIN_MS / 1000.0 + 1)
    await ipc.close()
    payloads.close()
    with contextlib.suppress(Exception):
        await nc.flush(timeout=2)
    await nc.close()
    if probes is not None:
        await probes.cleanup()
    counts = settler.counts
    log.info(
        "stopped",
        extra={
            "batch_sizes": dispatcher.batch_summary(),
            "settled": {
                "acked": counts.acked,
                "dropped": counts.dropped,
                "naked": counts.naked,
                "left_unacked": counts.left_unacked,
            },
            "published": {
                "single": publisher.stats.single,
                "chunked": publisher.stats.chunked,
                "compact_error": publisher.stats.compact_error,
            },
        },
    )
    return 0


__all__ = ["run"]
