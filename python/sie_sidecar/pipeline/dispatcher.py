# SPDX-License-Identifier: Apache-2.0
"""The dispatcher sequences the pipeline's stages for each pulled batch (sidecar-behaviour §4.1-4.3,
§5.2-5.3; v0.7.1 rules). One batch walks: `intake` (verdicts, groups per model) → per model group the
pre-check (`config_gate`) → `readiness_gate` (or `parking` while the model loads) → `preparation`
(payloads, media, tokens, audio) into the model's lane (`lanes`, `sched.lane`) → `execution` (the
batch RPC) → publication and settlement (`outcomes`). `sweeps` drops cancelled and expired items at
each stage. Each delivery is settled exactly once.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ..config.groups import DispatchSettings
from ..ipc.types import ReadyResponse
from ..otel.tracer import Tracer
from ..payloads import PayloadStore
from ..sched.lane import ModelLane
from ..sched.quantum import QuantumController
from ..sched.scheduler import SchedulerConfig
from ..telemetry import ModelCatalog, Registry
from .admission import Admission
from .columns import config_hashes
from .config_gate import ConfigState
from .deadlines import DeadlineLeases, DeadlineRules
from .debug_views import batch_summary, debug_state
from .delivery import Delivery, Settler
from .execution import Execution
from .generation import Generations, GenerationSettings
from .intake import Intake
from .lanes import ModelLanes, ModelState
from .outcomes import Outcomes, ReplySink
from .parking import Parking
from .preparation import Preparation
from .readiness_gate import Loading, ReadinessGate
from .stages import MODEL_UNSUPPORTED, BackendClient, Forward
from .sweeps import Sweeper

log = logging.getLogger(__name__)

#: The NAK delay for work handed back at shutdown, unless the runtime sets `shutdown_nak_ms`.
SHUTDOWN_NAK_MS = 100
#: Shutdown waits this long for parked groups to hand their items back (§15.4 step 4).
PARKED_JOIN_S = 15.0


class Dispatcher:
    """Turns pulled batches into backend calls and published results: builds the stages, sequences
    them per batch and per model group, and keeps the surface both ingest modes of the runtime and tests use."""

    def __init__(
        self,
        settings: DispatchSettings,
        backend: BackendClient,
        publisher: ReplySink,
        settler: Settler,
        *,
        config: ConfigState | None = None,
        tombstones: Any = None,
        batch_tombstones: Any = None,
        shutdown: asyncio.Event | None = None,
        quantum: QuantumController | None = None,
        payloads: PayloadStore | None = None,
        telemetry: Registry | None = None,
        acks_with_replies: bool = False,
        tracer: Tracer | None = None,
    ) -> None:
        """`acks_with_replies`: `publisher` and `settler` write to one connection (the runtime's one
        FramedWriter), so a batch's ACKs are framed after its replies in one buffer."""
        self._s = settings
        #: What the schedulers and batch calls record (queue depth, pending cost, batches in flight,
        #: batch sizes); the health heartbeat reads it.
        self.telemetry = telemetry if telemetry is not None else Registry()
        self._backend = backend
        self._settler = settler
        self._config = config or ConfigState()
        self._intake = Intake(tombstones, batch_tombstones)
        self._group_slots = asyncio.Semaphore(max(1, settings.max_concurrent_batches))
        self._sweeper = Sweeper(settings.deadlines, settings.nak_delay_ms, settler, self._intake, self.telemetry)
        self._lanes = ModelLanes(settings, self.telemetry, backend, self._sweeper.keepalive)
        self._out = Outcomes(
            worker_id=settings.worker_id,
            nak_delay_ms=settings.nak_delay_ms,
            publisher=publisher,
            settler=settler,
            config=self._config,
            quantum=quantum,
            on_retry=self._lanes.forget_ready,
            acks_with_replies=acks_with_replies,
        )
        #: Generate items: one task each, never scheduled or batched (§14).
        self.generations = Generations(
            GenerationSettings(settings.worker_id, settings.nak_delay_ms, settings.generate_frame_timeout_s),
            backend=backend,  # type: ignore[arg-type]  # the generation calls: IpcClient / BackendChildren
            sink=publisher,
            settler=settler,
            outcomes=self._out,
            config=self._config,
            payloads=payloads,
        )
        sweeper, lanes, out, config = self._sweeper, self._lanes, self._out, self._config
        self._gate = ReadinessGate(settings, backend, out, settler=settler, sweeper=sweeper, lanes=lanes)
        self._parking = Parking(
            settings,
            backend,
            out,
            sweeper=sweeper,
            gate=self._gate,
            config=config,
            shutdown=shutdown or asyncio.Event(),
            run_group=self._run_group,
            shutdown_nak_ms=lambda: SHUTDOWN_NAK_MS,
        )
        self._prep = Preparation(out, settler=settler, sweeper=sweeper, lanes=lanes, payloads=payloads)
        self._execution = Execution(
            settings, backend, out, sweeper=sweeper, lanes=lanes, config=config, telemetry=self.telemetry, tracer=tracer
        )
        self._lanes.bind(self._execution.execute_formed)  # each lane's formed batches go to execution

    # -- what the runtime (both modes) and tests read and set, forwarded to the stage that owns it (see there)

    tombstones = Forward[Any]("_intake", "tombstones")
    batch_tombstones = Forward[Any]("_intake", "batch_tombstones")
    catalog = Forward[ModelCatalog | None]("_lanes", "catalog")
    tracer = Forward[Tracer | None]("_execution", "tracer")
    batch_sizes = Forward[Counter[int]]("_execution", "batch_sizes")
    leases = Forward[DeadlineLeases]("_sweeper", "leases")
    shutdown_nak_ms = Forward[Callable[[], int]]("_parking", "shutdown_nak_ms")
    on_draining = Forward[Callable[[], None] | None]("_execution", "on_draining")
    on_count_cap = Forward[Callable[[int], None] | None]("_lanes", "on_count_cap")
    _models = Forward[dict[str, ModelState]]("_lanes", "models")
    _lane = Forward[Callable[[str], ModelLane[Delivery]]]("_lanes", "lane")

    @property
    def config(self) -> ConfigState:
        return self._config

    async def cancel_generation(self, request_id: str) -> None:
        """`cancel.{router}.{request}`: forwarded to every backend child; no tombstone (v0.7.1)."""
        await self.generations.cancel(request_id)

    def intake_limit(self) -> int:
        """The most messages one pulled batch should carry: the smallest batch budget reported."""
        return self._lanes.intake_limit

    def model_pressure(self, model: str) -> tuple[int, int]:
        """(pending cost, pending items) of the model's scheduler: what child placement weighs (§5)."""
        return self._lanes.pressure(model)

    def set_admission(self, admission: Admission) -> None:
        """Check each item's `admission_pool` against this gate at intake (§4.1 row 11)."""
        self._intake.admission = admission

    def set_on_idle(self, on_idle: Callable[[], None] | None) -> None:
        """Called whenever a model's scheduler has nothing pending or running (the pull loop's bypass)."""
        self._lanes.on_idle = on_idle

    def idle(self) -> bool:
        """No model has items queued in its scheduler or batches in flight."""
        return self._lanes.idle()

    def record_with(self, catalog: ModelCatalog) -> None:
        """Recording is on (at start, or at the first `/debug/state` read): every lane gets its metrics."""
        self._lanes.record_with(catalog)

    def debug_state(self) -> dict[str, Any]:
        """What `GET /debug/state` shows (`debug_views.debug_state`), read on the event loop."""
        return debug_state(
            worker_id=self._s.worker_id,
            backend=self._backend,
            config=self._config,
            admission=self._intake.admission,
            lanes=self._lanes,
            tokenizers=self._prep.tokenizers,
            batch_sizes=self.batch_sizes,
        )

    def batch_summary(self) -> dict[str, float]:
        """Count, mean, p50 and max of the items per backend batch so far."""
        return batch_summary(self.batch_sizes)

    # -- one pulled batch, from intake to the model lanes --------------------------------------------

    async def handle(self, messages: Sequence[Any], release: Callable[[int], None] | None = None) -> None:
        """Settle every message of one pulled batch exactly once; `release` returns pull capacity."""
        found = self._intake.intake(messages, release)
        groups, plain = await self._sweeper.intake(found), found.plain
        if len(groups) == 1:  # the usual pull: one model, no task per group
            model, ds = next(iter(groups.items()))
            await self._run_group(model, ds, plain.get(model))
        elif groups:
            await asyncio.gather(*(self._run_group(model, ds, plain.get(model)) for model, ds in groups.items()))

    async def _run_group(
        self, model: str, ds: list[Delivery], plain_op: str | None = None, ready: ReadyResponse | None = None
    ) -> None:
        """One model group on a group slot; a group whose model loads is parked (and comes back here)."""
        async with self._group_slots:
            try:
                parked = await self._group(model, ds, plain_op, ready)
            except Exception:
                parked = None
                log.exception("model group failed; NAKing what is left", extra={"model": model})
                for d in ds:
                    if not d.settled:
                        await self._settler.nak(d, self._s.nak_delay_ms)
        if parked is not None:
            self._parking.park(model, ds, plain_op, parked.state)

    async def _group(
        self, model: str, ds: list[Delivery], plain_op: str | None = None, ready: ReadyResponse | None = None
    ) -> Loading | None:
        """`plain_op`: intake found every delivery of the group plain (`Verdicts.plain`), so the
        per-item operation split and payload checks are skipped. `ready`: a parked group's answer,
        already waited for. Returns the loading answer when the group is to be parked."""
        base = self._s.nak_delay_ms
        if plain_op is None and ready is None:
            ds = self._start_generations(ds)  # before the tombstones: generation is never dropped (§14)
        ds = await self._sweeper.drop_cancelled(ds)
        if not ds:
            return None
        # The group pre-check (§4.2): a hash no longer current, or a model the backend cannot serve.
        if not self._config.supports(model):  # §4.1 row 12 / §4.2: reason model_unsupported
            await self._out.nak_all(ds, base, MODEL_UNSUPPORTED)
            return None
        if not self._config.accepts_hashes(config_hashes(ds)):
            await self._out.nak_all(ds, base)
            return None
        if ready is None:
            found = await self._gate.first_ready(model, ds)
            if isinstance(found, Loading):
                return found
            ready = found
        if ready is None:
            return None
        ds = await self._sweeper.drop_cancelled(ds)
        await self._prep.prepare(model, ds, ready, plain_op)
        return None

    def _start_generations(self, ds: list[Delivery]) -> list[Delivery]:
        """Hand every `generate` delivery to its own task (§14); the rest stay in the group."""
        rest = []
        for d in ds:
            if d.item is not None and d.item.operation == "generate":
                self.generations.start(d)
            else:
                rest.append(d)
        return rest

    # -- shutdown ------------------------------------------------------------------------------------

    async def join_parked(self, timeout_s: float = PARKED_JOIN_S) -> None:
        """Shutdown (§15.4 step 4): parked groups see the stop and NAK; wait for them, bounded."""
        await self._parking.join(timeout_s)

    async def close_schedulers(self, deadline_s: float) -> None:
        """Shutdown: flush every model's queued work (bounded), then NAK what is left; it returns as
        soon as nothing of this process can pull it any more (`shutdown_nak_ms`)."""
        await self._sweeper.stop_leases()
        for left in await self._lanes.close(deadline_s):
            await self._out.nak_all(left, self.shutdown_nak_ms())


# `SchedulerConfig` and `DeadlineRules` are the parts of `DispatchSettings`: given with it, as before
# the three moved to `config.groups`.
__all__ = [
    "BackendClient",
    "ConfigState",
    "DeadlineRules",
    "DispatchSettings",
    "Dispatcher",
    "ReplySink",
    "SchedulerConfig",
]
