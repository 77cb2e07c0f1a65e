# SPDX-License-Identifier: Apache-2.0
"""The dispatcher sequences the pipeline's stages for each pulled batch (sidecar-behaviour §4.1-4.3,
§5.2-5.3; v0.7.1 rules): intake verdicts (`intake`), grouping by model, the config gate, the readiness
wait, preparation (payloads, media, tokens, audio), the model's lane (`sched.lane`), the batch RPC, and
publication and settlement (`outcomes`). Each delivery is settled exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, Final, Protocol, TypeVar

from .. import wire
from ..errors import (
    BAD_OPERATION,
    INVALID_REQUEST,
    MODEL_LOAD_FAILED,
    NO_RUN_BATCH,
    PAYLOAD_ERROR,
    ConfigNotAttested,
    IpcServerError,
)
from ..ipc.requests import PER_OP_METHOD, encode_item, item_traceparents, lora_key, per_op_body, run_batch_body
from ..ipc.types import ReadyResponse
from ..logs import Throttled
from ..otel.tracing import BatchSpan, Tracer
from ..payloads import PayloadStore, resolve_items
from ..payloads.resolve import payload_ref_of
from ..prep import RegisteredTokenizer, TokenizerRegistry, encode_cost
from ..prep.audio import prepare_items
from ..prep.media import check_extract_work_item
from ..prep.offload import prepare_off_loop
from ..sched.costs import AUDIO_HARD_BATCH_COST_CAP, extract_cost, runs_alone, score_cost
from ..sched.lane import BatchReport, LaneSettings, ModelLane
from ..sched.quantum import QuantumController
from ..sched.scheduler import Formed, SchedulerConfig
from ..telemetry import QUEUE_DEPTH, WORK_ITEM_AGE, WORK_ITEM_DEADLINE_EXCEEDED, ModelCatalog, QueueDepth, Registry
from ..telemetry.lane_metrics import LaneMetrics
from ..wire.workitem import WorkItem
from .admission import Admission
from .columns import config_hashes, request_latencies_ms, run_batch_columns, unsettled
from .config_gate import ConfigState
from .deadlines import DeadlineLeases, DeadlineRules, deadline_split, observe_clock, work_item_ages
from .delivery import Delivery, Settler
from .generation import Generations, GenerationSettings
from .intake import Intake
from .outcomes import Outcomes, ReplySink

log = logging.getLogger(__name__)
#: Warnings that repeat per batch or per group while a dependency keeps failing, rate-limited.
_warn = Throttled(log)

T = TypeVar("T")

OVERFLOW_NAK_MS = 100
SHUTDOWN_NAK_MS = 100
LOADING_RECHECK_CAP_MS = 15_000
#: A parked group's items are progress-ACKed at least this often (§4.5), whatever the backend does.
PARKED_PROGRESS_S = 15.0
#: Shutdown waits this long for parked groups to hand their items back (§15.4 step 4).
PARKED_JOIN_S = 15.0
#: How long a `ready` answer is reused for later groups of the same model. Any IPC failure or
#: `nak_retry` outcome forgets it, so a backend that unloaded the model is asked again at once.
READY_CACHE_S = 1.0
KNOWN_OPS = ("encode", "score", "extract")


class BatchClient(Protocol):
    """The batch calls of the backend child that serves one model."""

    @property
    def runs_batches(self) -> bool:
        """False once the backend answered RunBatch `unknown method`: per-op methods from then on."""

    @property
    def reported_hash(self) -> str | None:
        """The bundle-config hash the child reported in its last Ping (None: unknown)."""

    async def run_batch_with(
        self,
        body: bytes,
        decode: Callable[[memoryview], Any],
        *,
        attest: Callable[[str | None], bool] | None = None,
        timeout_s: float | None = None,
    ) -> Any: ...
    async def process_batch(
        self,
        method: str,
        body: bytes,
        *,
        attest: Callable[[str | None], bool] | None = None,
        timeout_s: float | None = None,
    ) -> Any: ...


class BackendClient(Protocol):
    """The IPC calls the dispatcher makes (`ipc.client.IpcClient`, or `ipc.children.BackendChildren`
    for several backend children, which places each model on one of them)."""

    @property
    def runs_batches(self) -> bool:
        """False once the backend answered RunBatch `unknown method`: per-op methods from then on."""

    async def ensure_model_ready(self, model_id: str) -> ReadyResponse: ...
    async def client_for(self, model_id: str) -> BatchClient: ...


@dataclass(frozen=True, slots=True)
class DispatchSettings:
    """What the dispatcher reads from `Settings`."""

    worker_id: str
    nak_delay_ms: int = 5000
    fetch_budget: int = 64
    max_concurrent_batches: int = 4
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    #: Step the controller once per wave (primary batch) rather than on every batch (§4.6).
    wave_cadence: bool = True
    #: Each ProcessGenerate frame must arrive within this (SIE_GENERATE_IPC_FRAME_TIMEOUT_S, §15.1).
    generate_frame_timeout_s: float = 300.0
    #: `SIE_ADAPTIVE_BATCH_*` overrides for every model's controller (None: production defaults).
    controller_env: Mapping[str, str] | None = None
    #: Directory for one replayable controller trace per model (`SIE_SIDECAR_CONTROLLER_TRACE`).
    controller_trace_dir: str | None = None
    #: SIE_BATCHER_MAX_BATCH_COST was set: reported `max_batch_tokens` budgets are ignored (§3.7).
    cost_pinned: bool = False
    #: How long a group parked while its model loads may wait before it is handed back: the
    #: redelivery envelope, 30 s times max_deliver (§2.3).
    parked_deadline_s: float = 600.0
    #: Work deadlines (§15.3): enforcement, skew, max budget, tombstone horizon.
    deadlines: DeadlineRules = field(default_factory=DeadlineRules)
    #: The ordinary IPC request timeout: a RunBatch waits this long, or until its latest deadline.
    ipc_request_timeout_s: float = 60.0


@dataclass(frozen=True, slots=True)
class _Loading:
    """The model answered loading (`state`: loading_started or loading_in_progress): the group is
    to be parked."""

    state: str


@dataclass(frozen=True, slots=True)
class _Executed:
    """What an executed batch tells its lane: the backend's `inference_ms` (first outcome's), the
    requests with a success, in outcome order, and (when the replies were framed natively) every
    executed item's `request_id` in item order."""

    inference_ms: float | None
    succeeded: dict[str, None]
    request_ids: list[str] | None = None


#: The operation that only asks for its model to be loaded (ACKed once ready, no result).
LOAD_OP: Final = "load"
#: The NATS metric reason of a NAK for a model the backend reports it cannot serve (§13, newer).
MODEL_UNSUPPORTED: Final = "model_unsupported"


@dataclass(slots=True)
class _Model:
    """What the pipeline keeps per model: its lane (scheduler and controller loop), the last `ready`
    answer (reused for READY_CACHE_S) and its batch budget."""

    lane: ModelLane[Delivery] | None = None
    ready: tuple[float, ReadyResponse] | None = None
    batch_budget: int | None = None


def _inline_text_only(ds: list[Delivery]) -> bool:
    """No extract item (media checks) and no offloaded payload among encode/score items: the one
    test per item that lets `_resolve_payloads` hand the group on untouched."""
    for d in ds:
        item = d.item
        if item is None or item.operation not in ("encode", "score") or payload_ref_of(item) is not None:
            return False
    return True


def _split_by_op(ds: list[Delivery]) -> tuple[dict[tuple[str, str], list[Delivery]], list[Delivery]]:
    """The (operation, LoRA key) groups of a model group, and the items of unknown operations. The
    common case, one known operation and no options anywhere, is one pass without a call per item."""
    first = ds[0].item
    assert first is not None
    op = first.operation
    if op in KNOWN_OPS and all(d.item is not None and d.item.operation == op and not d.item.options for d in ds):
        return {(op, ""): ds}, []
    by_op: dict[tuple[str, str], list[Delivery]] = defaultdict(list)
    unknown: list[Delivery] = []
    for d in ds:
        assert d.item is not None
        if d.item.operation in KNOWN_OPS:
            by_op[(d.item.operation, lora_key(d.item))].append(d)
        else:
            unknown.append(d)
    return by_op, unknown


class Dispatcher:
    """Turns pulled batches into backend calls and published results."""

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
        """`acks_with_replies`: `publisher` and `settler` write to one connection (the app's one
        FramedWriter), so a batch's ACKs are framed after its replies in one buffer."""
        self._s = settings
        #: What the schedulers and batch calls record (queue depth, pending cost, batches in flight,
        #: batch sizes); the health heartbeat reads it.
        self.telemetry = telemetry if telemetry is not None else Registry()
        #: Batch spans (`SIE_TRACING_ENABLED`); None: off, one test per batch and nothing per item.
        self.tracer = tracer
        #: Set when metrics are enabled (the app): each model lane then records its §13 queue and
        #: batch instruments with (model, profile) attributes from this catalog.
        self.catalog: ModelCatalog | None = None
        self._queue_depth: QueueDepth | None = None
        self._backend = backend
        self._settler = settler
        self._config = config or ConfigState()
        self._intake = Intake(tombstones, batch_tombstones)
        self._shutdown = shutdown or asyncio.Event()
        self._payloads = payloads
        self._group_slots = asyncio.Semaphore(max(1, settings.max_concurrent_batches))
        #: Items of groups parked while their model loads (§5.3, newer than v0.7.1): they hold no
        #: group slot and no pull permit, but one of these (capacity: the fetch budget).
        self._parked_free = max(1, settings.fetch_budget)
        self._parked: set[asyncio.Task[None]] = set()
        #: Items per backend batch call, for the shutdown summary and the demo.
        self.batch_sizes: Counter[int] = Counter()
        #: model → (when, ready response): saves an EnsureModelReady round trip per batch at load.
        #: Everything kept per model, in one object each (its lane, the cached ready answer, ...).
        self._models: dict[str, _Model] = {}
        self._lane_settings = LaneSettings(
            scheduler=settings.scheduler,
            wave_cadence=settings.wave_cadence,
            controller_env=dict(settings.controller_env) if settings.controller_env is not None else None,
            controller_trace_dir=settings.controller_trace_dir,
            cost_pinned=settings.cost_pinned,
        )
        self._out = Outcomes(
            worker_id=settings.worker_id,
            nak_delay_ms=settings.nak_delay_ms,
            publisher=publisher,
            settler=settler,
            config=self._config,
            quantum=quantum,
            on_retry=self._forget_ready,
            acks_with_replies=acks_with_replies,
        )
        #: Generate items: one task each, never scheduled or batched (§14).
        self.generations = Generations(
            GenerationSettings(
                worker_id=settings.worker_id,
                nak_delay_ms=settings.nak_delay_ms,
                frame_timeout_s=settings.generate_frame_timeout_s,
            ),
            backend=backend,  # type: ignore[arg-type]  # the generation calls: IpcClient / BackendChildren
            sink=publisher,
            settler=settler,
            outcomes=self._out,
            config=self._config,
            payloads=payloads,
        )
        self._tokenizers = TokenizerRegistry()
        #: §15.3 deadline leases: held batches with a usable deadline, progress-ACKed every ~10 s.
        self.leases = DeadlineLeases(settings.deadlines, self._keepalive)
        self._leases_task: asyncio.Task[None] | None = None
        self._on_idle: Callable[[], None] | None = None
        #: The NAK delay for work handed back at shutdown (the app makes it outlast its pull requests).
        self.shutdown_nak_ms: Callable[[], int] = lambda: SHUTDOWN_NAK_MS
        #: Called when the backend refuses a batch as `draining` (the app's pull gate stops pulling).
        self.on_draining: Callable[[], None] | None = None
        self._intake_limit = settings.fetch_budget
        #: Called with the largest count cap of any model whenever it changes (the app derives the
        #: pull-ahead from it, docs/operations.md "derived defaults").
        self.on_count_cap: Callable[[int], None] | None = None
        self._count_cap = 0

    @property
    def config(self) -> ConfigState:
        return self._config

    @property
    def tombstones(self) -> Any:
        return self._intake.tombstones

    @property
    def batch_tombstones(self) -> Any:
        return self._intake.batch_tombstones

    async def cancel_generation(self, request_id: str) -> None:
        """`cancel.{router}.{request}`: forwarded to every backend child; no tombstone (v0.7.1)."""
        await self.generations.cancel(request_id)

    def intake_limit(self) -> int:
        """The most messages one pulled batch should carry: the smallest batch budget a backend has
        reported (else the fetch budget), so a group never overflows it and nothing is NAKed back
        only to be pulled again at once."""
        return self._intake_limit

    def model_pressure(self, model: str) -> tuple[int, int]:
        """(pending cost, pending items) of the model's scheduler: what child placement weighs
        (scheduler-and-prep §5; `ipc.children.BackendChildren.pressure`)."""
        state = self._models.get(model)
        if state is None or state.lane is None:
            return 0, 0
        scheduler = state.lane.scheduler
        return scheduler.pending_cost, scheduler.pending

    def _note_count_cap(self) -> None:
        """Tell `on_count_cap` when the largest count cap of any model's lane changed."""
        largest = max((m.lane.scheduler.max_requests for m in self._models.values() if m.lane is not None), default=0)
        if largest != self._count_cap:
            self._count_cap = largest
            if self.on_count_cap is not None:
                self.on_count_cap(largest)

    # -- intake ------------------------------------------------------------------------------

    def set_admission(self, admission: Admission) -> None:
        """Check each item's `admission_pool` against this gate at intake (§4.1 row 11)."""
        self._intake.admission = admission

    async def handle(self, messages: Sequence[Any], release: Callable[[int], None] | None = None) -> None:
        """Settle every message of one pulled batch exactly once; `release` returns pull capacity."""
        found = self._intake.intake(messages, release)
        groups, plain = found.groups, found.plain
        naks = found.naks
        if naks and self._s.deadlines.enforce:  # §4.1 row 10 comes before row 11 (pool admission)
            naks, _ = await self._drop_expired(naks)
        for d in naks:  # those with an item were decoded and refused by pool admission (row 11)
            await self._settler.nak(d, self._s.nak_delay_ms, "retry" if d.item is None else "pool_not_assigned")
        for d in found.drops:
            await self._settler.drop(d)
        for model in list(groups):
            live, _ = await self._drop_expired(groups[model], at_intake=True)
            if live:
                groups[model] = live
            else:
                del groups[model]
        if groups:
            if len(groups) == 1:  # the usual pull: one model, no task per group
                model, ds = next(iter(groups.items()))
                await self._run_group(model, ds, plain.get(model))
            else:
                await asyncio.gather(*(self._run_group(model, ds, plain.get(model)) for model, ds in groups.items()))

    async def _drop_expired(
        self, ds: list[Delivery], *, at_intake: bool = False, before_ipc: bool = False
    ) -> tuple[list[Delivery], float | None]:
        """§15.3 at one stage, for a whole batch in one native call: with enforcement on, items past
        their deadline are ACK-dropped (`deadline_exceeded`, action `dropped`). Off, they run, and
        at `before_ipc` they are counted (action `executed`). At intake the clock is observed (row 8)
        and the batch's deadline leases begin (row 13). Returns the live items and the latest
        usable deadline among them (the RunBatch wait's input)."""
        rules = self._s.deadlines
        if not rules.judge or not (at_intake or before_ipc or rules.enforce):
            return ds, None
        split = deadline_split(ds, time.time(), rules.skew_s, rules.max_budget_s)
        live, expired, usable, ignored, ahead, latest = split
        if at_intake:
            if expired or ignored or ahead:
                observe_clock(split, rules)
            if usable or (expired and not rules.enforce):
                self._hold_leases(ds if not rules.enforce else live)
        if not expired:
            return ds, latest
        if rules.enforce:
            self._count_expired(expired, "dropped")
            for d in expired:
                await self._settler.drop(d, "deadline_exceeded")
            return live, latest
        if before_ipc:
            self._count_expired(expired, "executed")
            _warn.warning(
                "work past its deadline executed (SIE_WORK_DEADLINE_ENFORCE is off)",
                key="deadline:executed",
                extra={"items": len(expired)},
            )
        return ds, latest

    def _count_expired(self, expired: list[Delivery], action: str) -> None:
        """`sie.worker.work_item.deadline_exceeded` by operation (one add per operation present)."""
        by_op = Counter(d.item.operation if d.item is not None else "other" for d in expired)
        for op, n in by_op.items():
            self.telemetry.add(WORK_ITEM_DEADLINE_EXCEEDED, n, (("operation", op), ("action", action)))

    def _hold_leases(self, ds: list[Delivery]) -> None:
        self.leases.hold(ds)
        if self._leases_task is None or self._leases_task.done():
            self._leases_task = self.leases.start()

    async def _drop_cancelled(self, ds: list[Delivery]) -> list[Delivery]:
        """Cancelled items ACK-dropped at a §4.2 stage, and (enforcing) those past their deadline."""
        if self._s.deadlines.enforce and self._s.deadlines.judge:
            ds, _ = await self._drop_expired(ds)
        return await self._drop_tombstoned(ds)

    async def _drop_tombstoned(self, ds: list[Delivery]) -> list[Delivery]:
        if not self._intake.any_tombstones():
            return ds
        live = []
        cancelled = self._intake.cancelled
        for d in ds:
            if cancelled(d):
                await self._settler.drop(d)
            else:
                live.append(d)
        return live

    # -- model group -------------------------------------------------------------------------

    async def _run_group(
        self, model: str, ds: list[Delivery], plain_op: str | None = None, ready: ReadyResponse | None = None
    ) -> None:
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
            self._park(model, ds, plain_op, parked.state)

    async def _group(
        self, model: str, ds: list[Delivery], plain_op: str | None = None, ready: ReadyResponse | None = None
    ) -> _Loading | None:
        """`plain_op`: intake found every delivery of the group plain (`Verdicts.plain`), so the
        per-item operation split and payload checks are skipped. `ready`: a parked group's answer,
        already waited for. Returns the loading answer when the group is to be parked."""
        base = self._s.nak_delay_ms
        if plain_op is None and ready is None:
            ds = self._start_generations(ds)  # before the tombstones: generation is never dropped (§14)
        ds = await self._drop_cancelled(ds)
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
            found = await self._first_ready(model, ds)
            if isinstance(found, _Loading):
                return found
            ready = found
        if ready is None:
            return None
        ds = await self._drop_cancelled(ds)
        budget = ready.batch_budget or self._s.fetch_budget
        state = self._model(model)
        if state.batch_budget != budget:
            state.batch_budget = budget
            budgets = [m.batch_budget for m in self._models.values() if m.batch_budget is not None]
            self._intake_limit = max(1, min(self._s.fetch_budget, *budgets))
        if len(ds) > budget:
            await self._out.nak_all(ds[budget:], OVERFLOW_NAK_MS)
            ds = ds[:budget]
        by_op, unknown = ({(plain_op, ""): ds}, []) if plain_op is not None else _split_by_op(ds)
        if unknown:
            loads = [d for d in unknown if d.item is not None and d.item.operation == LOAD_OP]
            if loads:  # §4.2 (newer than v0.7.1): `load` is answered by the model being ready
                await self._settler.ack_many(loads)
                unknown = [d for d in unknown if not d.settled]
        if unknown:
            await self._out.publish_errors(unknown, BAD_OPERATION, "unknown operation", nak_on_failure=True)
        lane = self._lane(model)
        width = ready.descriptor.max_concurrent_dispatch if ready.descriptor is not None else None
        grow = getattr(self._backend, "grow_for", None)  # the pool transport: wire-protocol §1.2
        if grow is not None and width is not None and width > 1:
            grow(model, width)
        lane.describe(
            max_concurrent_dispatch=width,
            max_batch_tokens=ready.max_batch_tokens,
            # A token budget without a count budget: the fallback count budget is the count cap.
            batch_budget=ready.batch_budget or (self._s.fetch_budget if ready.max_batch_tokens else None),
        )
        self._note_count_cap()
        tokenizer = (
            await self._tokenizers.register_async(model, ready.descriptor)
            if "encode" in {op for op, _ in by_op}
            else None
        )
        if len(by_op) == 1:
            (op, lora), part = next(iter(by_op.items()))
            await self._enqueue(lane, op, lora, part, tokenizer, plain=plain_op is not None)
        else:
            await asyncio.gather(
                *(self._enqueue(lane, op, lora, part, tokenizer) for (op, lora), part in by_op.items())
            )
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

    # -- parked groups (§5.3, newer than v0.7.1) -------------------------------------------------

    def _park(self, model: str, ds: list[Delivery], plain_op: str | None, state: str) -> None:
        """Move a loading model's group to its own task, off the group slot, so warm models keep
        flowing. Each item gives its pull permit back for a parked one; those beyond the parked
        capacity are NAKed with the base delay (§4.2, "parked-item capacity exhausted")."""
        live = [d for d in ds if not d.settled]
        take = min(len(live), self._parked_free)
        kept, over = live[:take], live[take:]
        if over:
            # One key for every model: the capacity is shared, and 10,000 cold models (a hostile subject
            # stream) made 10,000 lines at once (tests/pipeline/test_hostile_items.py).
            _warn.warning(
                "parked-item capacity exhausted; NAKing",
                key="parked-capacity",
                extra={"model": model, "items": len(over)},
            )
            task = asyncio.create_task(self._out.nak_all(over, self._s.nak_delay_ms))
            self._parked.add(task)
            task.add_done_callback(self._parked.discard)
        if not kept:
            return
        self._parked_free -= len(kept)
        for d in kept:
            if d.release is not None:
                d.release(1)  # the pull loop may take more work meanwhile
            d.release = self._unpark
        task = asyncio.create_task(self._parked_group(model, kept, plain_op, state), name=f"parked:{model}")
        self._parked.add(task)
        task.add_done_callback(self._parked.discard)

    def _unpark(self, n: int) -> None:
        """A parked item was settled: its parked permit comes back."""
        self._parked_free += n

    async def _parked_group(self, model: str, ds: list[Delivery], plain_op: str | None, state: str) -> None:
        """Wait for the model without a group slot, progress-ACKing every PARKED_PROGRESS_S and
        after each loading answer; hand the group back at the deadline or at shutdown; once
        ready, refresh the progress once more and run it as any other group."""
        base = self._s.nak_delay_ms
        deadline = time.monotonic() + self._s.parked_deadline_s
        try:
            ready = await self._wait_parked(model, ds, deadline, state)
            if ready is None:
                return
            if self._shutdown.is_set():  # ready just as the process stops: hand the group back
                await self._out.nak_all(ds, self.shutdown_nak_ms())
                return
            await self._keepalive(ds)  # refreshed once more before taking a group slot
            await self._run_group(model, ds, plain_op, ready)
        except Exception:
            log.exception("parked model group failed; NAKing what is left", extra={"model": model})
            await self._out.nak_all([d for d in ds if not d.settled], base)

    async def _wait_parked(self, model: str, ds: list[Delivery], deadline: float, state: str) -> ReadyResponse | None:
        """Re-probe a parked group's model after each pause (as v0.7.1 slept: the base delay after
        `loading_started`, twice it after `loading_in_progress`, at most 15 s), `state` being the
        last answer's. Each call races shutdown, the deadline and the PARKED_PROGRESS_S tick."""
        base = self._s.nak_delay_ms
        while True:
            wait_s = min(base if state == "loading_started" else 2 * base, LOADING_RECHECK_CAP_MS) / 1000.0
            try:
                await asyncio.wait_for(self._shutdown.wait(), max(0.0, min(wait_s, deadline - time.monotonic())))
            except TimeoutError:
                pass
            else:
                await self._out.nak_all(ds, self.shutdown_nak_ms())
                return None
            ds[:] = await self._drop_cancelled([d for d in ds if not d.settled])
            if not ds:
                return None
            if not self._config.supports(model):  # §4.2: re-checked right before each readiness probe
                await self._out.nak_all(ds, base, MODEL_UNSUPPORTED)
                return None
            if (cached := self._cached_ready(model)) is not None:
                return cached
            ready = await self._parked_probe(model, ds, deadline)
            if ready is None:
                return None
            verdict = await self._loading_verdict(model, ds, ready)
            if not isinstance(verdict, _Loading):
                return verdict
            state = ready.state

    async def _parked_probe(self, model: str, ds: list[Delivery], deadline: float) -> ReadyResponse | None:
        """One EnsureModelReady for a parked group, progress-ACKing every PARKED_PROGRESS_S while it
        runs; the group is NAKed (and None returned) at the deadline, at shutdown or on failure."""
        base = self._s.nak_delay_ms
        call = asyncio.ensure_future(self._backend.ensure_model_ready(model))
        try:
            while not call.done():
                left = deadline - time.monotonic()
                if left <= 0 or self._shutdown.is_set():
                    call.cancel()
                    if left <= 0:
                        _warn.warning(
                            "parked group waited past the redelivery envelope", key=model, extra={"model": model}
                        )
                    await self._out.nak_all(ds, base if left <= 0 else self.shutdown_nak_ms())
                    return None
                stop = asyncio.ensure_future(self._shutdown.wait())
                done, _ = await asyncio.wait(
                    {call, stop}, timeout=min(PARKED_PROGRESS_S, left), return_when=asyncio.FIRST_COMPLETED
                )
                stop.cancel()
                if not done:
                    await self._keepalive(ds)
            return call.result()
        except asyncio.CancelledError:
            call.cancel()
            raise
        except Exception as exc:
            _warn.warning("EnsureModelReady failed", key=model, extra={"model": model, "error": repr(exc)})
            await self._out.nak_all(ds, base)
            return None

    async def join_parked(self, timeout_s: float = PARKED_JOIN_S) -> None:
        """Shutdown (§15.4 step 4): parked groups see the stop and NAK; wait for them, bounded;
        the unfinished are cancelled, and JetStream redelivers their items after ack_wait."""
        if not self._parked:
            return
        _, pending = await asyncio.wait(set(self._parked), timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("parked groups cancelled at shutdown", extra={"groups": len(pending)})

    def _cached_ready(self, model: str) -> ReadyResponse | None:
        """The model's `ready` answer if it is younger than READY_CACHE_S."""
        cached = self._model(model).ready
        return cached[1] if cached is not None and time.monotonic() - cached[0] < READY_CACHE_S else None

    async def _first_ready(self, model: str, ds: list[Delivery]) -> ReadyResponse | _Loading | None:
        """One readiness answer for a group holding a slot (§4.2): ready, or `_Loading` (every item
        progress-ACKed; the caller parks the group so that it frees the slot while the model loads:
        the v0.7.1 loop slept here, and 4 loading models stopped every warm one), or None (settled)."""
        ds[:] = await self._drop_cancelled(unsettled(ds))
        if not ds:
            return None
        if (cached := self._cached_ready(model)) is not None:
            return cached
        try:
            ready = await self._progressing(self._backend.ensure_model_ready(model), ds)
        except Exception as exc:  # any IPC failure (transport, timeout, server, decode): NAK the group
            _warn.warning("EnsureModelReady failed", key=model, extra={"model": model, "error": repr(exc)})
            await self._out.nak_all(ds, self._s.nak_delay_ms)
            return None
        return await self._loading_verdict(model, ds, ready)

    async def _progressing(self, call: Awaitable[T], ds: list[Delivery]) -> T:
        """Await `call`, progress-ACKing `ds` each progress interval while it runs (law 3). A backend
        that hangs instead of dying leaves EnsureModelReady open for up to 900 s: without this, the
        group's leases ran out at ack_wait and its items ran twice, here and on another worker."""
        after = self._lane_settings.scheduler.progress_after_s
        every = min(PARKED_PROGRESS_S, after) if after > 0 else PARKED_PROGRESS_S
        task = asyncio.ensure_future(call)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=every)
                if done:
                    return task.result()
                await self._keepalive(ds)
        except asyncio.CancelledError:
            task.cancel()
            raise

    async def _loading_verdict(
        self, model: str, ds: list[Delivery], ready: ReadyResponse
    ) -> ReadyResponse | _Loading | None:
        """One EnsureModelReady answer (§4.2): ready (cached), failed (published), loading (every item
        progress-ACKed: `_Loading`), anything else NAKed; None when the group was settled here."""
        base = self._s.nak_delay_ms
        if ready.state == "ready":
            self._model(model).ready = (time.monotonic(), ready)
            return ready
        if ready.state == "failed":
            await self._out.publish_errors(
                ds, MODEL_LOAD_FAILED, f"Model '{model}' failed to load permanently.", nak_on_failure=True
            )
            return None
        if ready.state not in ("loading_started", "loading_in_progress"):
            await self._out.nak_all(ds, base)  # retry_later, or a state this version does not know
            return None
        for d in ds:
            if not await self._settler.progress(d):
                await self._out.nak_all(ds, base)
                return None
        return _Loading(ready.state)

    # -- batches -------------------------------------------------------------------------------

    def set_on_idle(self, on_idle: Callable[[], None] | None) -> None:
        """Called whenever a model's scheduler has nothing pending or running (the pull loop's bypass)."""
        self._on_idle = on_idle

    def idle(self) -> bool:
        """No model has items queued in its scheduler or batches in flight."""
        return all(m.lane.scheduler.idle() for m in self._models.values() if m.lane is not None)

    def _model(self, model: str) -> _Model:
        state = self._models.get(model)
        if state is None:
            state = self._models[model] = _Model()
        return state

    def _forget_ready(self, model: str) -> None:
        """Ask the backend again next time: an IPC failure, or a `nak_retry` (the model was unloaded?)."""
        state = self._models.get(model)
        if state is not None:
            state.ready = None

    def _lane(self, model: str) -> ModelLane[Delivery]:
        state = self._model(model)
        lane = state.lane
        if lane is None:
            lane = state.lane = ModelLane(
                model,
                lambda formed: self._execute_formed(model, formed),
                self._lane_settings,
                on_idle=lambda: self._on_idle() if self._on_idle is not None else None,
                telemetry=self.telemetry,
                keepalive=self._keepalive,
                metrics=self._lane_metrics(model),
            )
        return lane

    def record_with(self, catalog: ModelCatalog) -> None:
        """Recording is on (at start, or at the first `/debug/state` read): lanes made from now on get
        their metrics at creation, and the lanes made before get theirs here."""
        self.catalog = catalog
        for model, state in self._models.items():
            metrics = self._lane_metrics(model) if state.lane is not None and state.lane.metrics is None else None
            if state.lane is not None and metrics is not None:
                state.lane.attach_metrics(metrics)

    def _lane_metrics(self, model: str) -> LaneMetrics | None:
        if self.catalog is None:
            return None
        if self._queue_depth is None:
            self._queue_depth = QueueDepth(self.telemetry, self.catalog, QUEUE_DEPTH)
        return LaneMetrics(self.telemetry, self.catalog, self._queue_depth, model)

    async def _enqueue(
        self,
        lane: ModelLane[Delivery],
        op: str,
        lora: str,
        ds: list[Delivery],
        tokenizer: RegisteredTokenizer | None,
        *,
        plain: bool = False,
    ) -> None:
        """Payloads, media checks, tokenization and audio decoding for one (op, LoRA) group, then into
        the scheduler (`plain`: intake found nothing to fetch or check)."""
        ds = await self._drop_cancelled(ds)  # before_payload_fetch
        if not plain:
            ds = await self._resolve_payloads(ds)
            ds = await self._drop_cancelled(ds)  # after_payload_fetch
        if not ds:
            return
        if op == "encode":
            if tokenizer is not None:
                items = [d.item for d in ds if d.item is not None]
                prepared = await prepare_off_loop(tokenizer, [encode_item(item) for item in items])
                if tokenizer.sends_tokens:  # else the tokens only cost the items (unverifiable id)
                    for d, p in zip(ds, prepared, strict=True):
                        d.prepared_tokens = p
                costs = [encode_cost(p) for p in prepared]
            else:
                costs = [1] * len(ds)
        elif op == "score":
            costs = [score_cost(item.query_item, item.score_items) for item in (d.item for d in ds) if item is not None]
        else:
            await self._enqueue_extract(lane, op, lora, ds)
            return
        lane.scheduler.submit(op, lora, ds, costs)

    async def _enqueue_extract(self, lane: ModelLane[Delivery], op: str, lora: str, ds: list[Delivery]) -> None:
        """Audio preparation (scheduler-and-prep §7.3, §2.3): decoded audio replaces `audio` in the
        item map and costs its duration in ms, under a 720,000 ms hard cap; a refused item gets its
        own `invalid_request` error and ACK, and the rest go on."""
        decoded: list[tuple[Delivery, WorkItem]] = []
        for d in ds:
            assert d.item is not None  # intake decoded every delivery that reaches a scheduler
            decoded.append((d, d.item))
        preps = await prepare_items([item.item for _, item in decoded])
        refused: dict[str, list[Delivery]] = defaultdict(list)
        kept: list[Delivery] = []
        for (d, item), prep in zip(decoded, preps, strict=True):
            if prep.error is not None:
                refused[prep.error].append(d)
            else:
                if prep.item is not item.item:  # `audio` was taken out: the payload bytes are stale
                    item.item, item.raw = prep.item, None
                d.prepared_audio = prep.prepared
                kept.append(d)
        for message, group in refused.items():
            await self._out.publish_errors(group, INVALID_REQUEST, message, nak_on_failure=True)
        if kept:
            lane.scheduler.submit(
                op,
                lora,
                kept,
                [extract_cost(d.prepared_audio) for d in kept],
                [AUDIO_HARD_BATCH_COST_CAP if d.prepared_audio is not None else None for d in kept],
                alone=[runs_alone(d.prepared_audio) for d in kept],
            )

    async def _execute_formed(self, model: str, formed: Formed[Delivery]) -> BatchReport | None:
        """One formed batch: execute it and report what the model's lane learns from (§4.1, §4.6):
        the reported `inference_ms`, the call's time, and each succeeded request's latency. With
        metrics, the batch's size and cost, and its oldest item's enqueue → dispatch and → answer."""
        started = time.monotonic()
        outcome = await self._execute(
            model,
            formed.op,
            formed.lora,
            formed.items,
            formed.total_cost,
        )
        if outcome is None:
            return None
        finished = time.monotonic()
        lane = self._models[model].lane
        if lane is not None and lane.metrics is not None:
            oldest = min(formed.enqueued_at, default=started)
            lane.metrics.executed(formed.op, len(formed.items), formed.total_cost, started - oldest, finished - oldest)
        reported = outcome.inference_ms
        # One latency per request with a success: from its first item's enqueue to now.
        succeeded = outcome.succeeded
        latencies: list[float] = []
        if succeeded:
            rids = outcome.request_ids
            if rids is None or len(rids) != len(formed.items):  # some were cancelled before the call
                rids = [d.item.request_id if d.item is not None else "" for d in formed.items]
            latencies = request_latencies_ms(rids, formed.enqueued_at, succeeded, finished)
        return BatchReport(reported, (finished - started) * 1000.0, finished, latencies)

    async def _keepalive(self, ds: list[Delivery]) -> None:
        """Progress-ACK deliveries a scheduler has held for half the ack_wait (law 3)."""
        progress = self._settler.progress
        for d in ds:
            if not d.settled:
                await progress(d)

    async def close_schedulers(self, deadline_s: float) -> None:
        """Shutdown: flush every model's queued work (bounded), then NAK what is left; it returns as
        soon as nothing of this process can pull it any more (`shutdown_nak_ms`)."""
        await DeadlineLeases.stop(self._leases_task)
        self._leases_task = None
        results = await asyncio.gather(*(m.lane.close(deadline_s) for m in self._models.values() if m.lane is not None))
        for left in results:
            await self._out.nak_all(left, self.shutdown_nak_ms())

    async def _execute(self, model: str, op: str, lora: str, ds: list[Delivery], total_cost: int) -> _Executed | None:
        """Cancellation, the config barrier, one batch RPC and the settlement of every item; returns
        what the lane learns from it, or None when the batch never reached the backend or failed there."""
        base = self._s.nak_delay_ms
        ds = await self._drop_tombstoned(ds)  # before_ipc: cancelled first (§4.1 row 9 before row 10)
        ds, latest = await self._drop_expired(ds, before_ipc=True)
        if not ds:
            return None
        # The execution barrier (§5.5): from the hash check until the backend call returns, no config
        # mutation runs; a waiting one holds this batch back until it is done.
        async with self._config.barrier.shared():
            pinned = self._config.gate_hashes(config_hashes(ds))
            span: BatchSpan | None = None
            unsupported = not self._config.supports(model)
            if pinned is None or unsupported:
                refused: BaseException | None = None
                outcome = None
            else:
                if self.catalog is not None:  # §5.6: the work-item age, at the execution commit
                    ages = work_item_ages(ds, time.time())
                    if ages:
                        self.telemetry.histogram(WORK_ITEM_AGE, (("operation", op),)).record_many(ages)
                wait = None
                if latest is not None:
                    wait = self._s.deadlines.run_batch_timeout_s(self._s.ipc_request_timeout_s, latest, time.time())
                outcome, refused, span = await self._call_backend(
                    model, op, lora, ds, total_cost, pinned=pinned, timeout_s=wait
                )
        if outcome is None:
            if isinstance(refused, IpcServerError):
                # `draining` too gets the base delay, as v0.7.1 does in practice (§4.2, last row): a
                # backend restarting gracefully refuses for seconds, and 100 ms NAKs spent an item's
                # 20 deliveries in 2 s. The readiness gate stops the pulling meanwhile.
                self._forget_ready(model)
                _warn.warning("batch RPC refused", key=model, extra={"model": model, "error": refused.message})
                if refused.message == "draining" and self.on_draining is not None:
                    self.on_draining()
            elif refused is not None:  # transport, timeout, decode: the whole batch goes back
                self._forget_ready(model)
                _warn.warning("batch RPC failed", key=model, extra={"model": model, "error": repr(refused)})
            await self._out.nak_all(ds, base, MODEL_UNSUPPORTED if unsupported else "retry")
            return None
        items_count = len(ds)
        self.batch_sizes[items_count] += 1
        try:
            if isinstance(outcome, wire.FramedResponse):  # replies already framed from the response bytes
                await self._out.settle_response(ds, outcome)
                rids = outcome.request_ids
                return _Executed(outcome.inference_ms, dict.fromkeys(compress(rids, outcome.success)), rids)
            await self._out.apply(ds, outcome)
        finally:
            if span is not None:  # the batch's span covers its publish and settlement too
                span.event("published")
                span.end()
        outcomes = outcome.outcomes
        return _Executed(
            outcomes[0].inference_ms if outcomes else None,
            dict.fromkeys(o.request_id for o in outcomes if o.disposition == "publish_and_ack"),
        )

    async def _call_backend(
        self,
        model: str,
        op: str,
        lora: str,
        ds: list[Delivery],
        total_cost: int,
        *,
        pinned: bool = False,
        timeout_s: float | None = None,
    ) -> tuple[Any, BaseException | None, BatchSpan | None]:
        """One batch RPC (RunBatch, or the per-op method for a backend without it): the outcome, or
        None and what refused it (None: the config gate); and, for a sampled batch that got an
        answer, its span, still open (the caller ends it once the replies are published). Runs
        inside the execution barrier. A batch with hash-pinned items goes only to a child whose
        last Ping attests the advertised config."""
        # The RunBatch writer reads undecoded items in place (`wire_item`); every one has an item.
        items, fetch_ms, prepared, audio = run_batch_columns(ds, op)
        # A sampled batch's span is parented on its items' first valid context and links to the
        # others (§5.4); its context is the one every RunBatchItem carries to the backend. An
        # unsampled batch's bytes are exactly the untraced ones.
        span = None
        if self.tracer is not None and not self.tracer.never:
            span = self.tracer.start_batch(model, op, len(items), total_cost, item_traceparents(items))
        trace = span.wire_context if span is not None else None
        try:
            backend = await self._backend.client_for(model)  # the child the model is placed on
            # Pinned work runs only on a child that attests the advertised config, checked by the
            # client on the very connection the batch goes to (ConfigNotAttested: nothing sent).
            attest = self._config.executes_on if pinned else None
            outcome = None
            # v0.7.1 sends every batch as RunBatch, whatever the descriptor says (it never reads
            # `supports_run_batch`); the client remembers a backend that answered `unknown method`.
            if backend.runs_batches:
                try:
                    body = run_batch_body(
                        model,
                        op,
                        items,
                        lora,
                        total_cost,
                        payload_fetch_ms=fetch_ms,
                        prepared_tokens=prepared,
                        prepared_audio=audio,
                        trace=trace,
                    )
                    if span is not None:
                        span.event("ipc.request")
                    outcome = await backend.run_batch_with(
                        body, self._out.response_decoder(ds), attest=attest, timeout_s=timeout_s
                    )
                except IpcServerError as exc:
                    if exc.message != NO_RUN_BATCH:
                        raise  # nothing ran on NO_RUN_BATCH: this batch goes per-op too, at once
            if outcome is None:
                decoded = [d.item for d in ds if d.item is not None]
                if span is not None:
                    span.attribute("sie.ipc.method", PER_OP_METHOD[op])
                outcome = await backend.process_batch(
                    PER_OP_METHOD[op],
                    per_op_body(model, op, decoded, fetch_ms, prepared, prepared_audio=audio),
                    attest=attest,
                    timeout_s=timeout_s,
                )
        except ConfigNotAttested:
            # The config gate: NAKed with the base delay, the reconciler resyncs.
            if span is not None:
                span.end("not sent: the backend does not attest the config")
            return None, None, None
        except Exception as exc:
            if span is not None:
                span.end(exc.message if isinstance(exc, IpcServerError) else f"{type(exc).__name__}: {exc}")
            return None, exc, None
        if span is not None:
            span.event("ipc.response")
        return outcome, None, span

    def debug_state(self) -> dict[str, Any]:
        """What `GET /debug/state` shows (SIE_SIDECAR_DEBUG_ENDPOINT, on by default for loopback
        peers): per model its readiness as last answered, tokenizer mode, batch budget, controller
        knobs, queue depth and batches in flight; and how batches reach the backend. A snapshot,
        read on the event loop."""
        now = time.monotonic()
        models: dict[str, Any] = {}
        for model, state in sorted(self._models.items()):
            tokenizer = self._tokenizers.get(model)
            entry: dict[str, Any] = {
                "ready_state": state.ready[1].state if state.ready is not None else None,
                "ready_age_s": round(now - state.ready[0], 3) if state.ready is not None else None,
                "tokenizer_mode": tokenizer.mode if tokenizer is not None else "none",
                "batch_budget": state.batch_budget,
            }
            lane = state.lane
            if lane is not None:
                sched = lane.scheduler
                entry |= {
                    "cost_cap": lane.cost_cap,
                    "wait_ms": lane.wait_ms,
                    "cost_budget": lane.budget,
                    "count_cap": sched.max_requests,
                    "queue_depth": sched.pending,
                    "in_flight_batches": sched.in_flight,
                    "pipeline_depth": sched.depth,
                    "flushes": dict(sched.flushes),
                    "jit_holds": sched.jit_holds,
                    "aged_items": sched.aged_items,
                    "progress_acks": sched.progress_acks,
                }
            models[model] = entry
        admission = self._intake.admission
        return {
            "worker_id": self._s.worker_id,
            "batch_method": "run_batch" if self._backend.runs_batches else "per_op",
            "config_hash": self._config.current,
            "config": self._config.snapshot(),
            "pool_admission": None if admission is None else admission.snapshot(),
            "batches": self.batch_summary(),
            "models": models,
        }

    def batch_summary(self) -> dict[str, float]:
        """Count, mean, p50 and max of the items per backend batch so far."""
        sizes = sorted(self.batch_sizes.elements())
        if not sizes:
            return {"batches": 0, "mean": 0.0, "p50": 0.0, "max": 0.0}
        return {
            "batches": len(sizes),
            "mean": round(sum(sizes) / len(sizes), 2),
            "p50": float(sizes[len(sizes) // 2]),
            "max": float(sizes[-1]),
        }

    async def _resolve_payloads(self, ds: list[Delivery]) -> list[Delivery]:
        """Inline offloaded payloads and check extract media (§4.2, §12; scheduler-and-prep §7.1).

        Each refused item gets its own error result (PAYLOAD_TOO_LARGE, payload_error or the media
        code) and is ACKed once that is published; the rest of the batch goes on.
        """
        if ds and _inline_text_only(ds):
            return ds  # the usual encode/score group: no media to check, nothing to fetch
        refused: list[tuple[Delivery, str, str]] = []
        checked: list[Delivery] = []
        for d in ds:  # inline extract media is checked before any fetch
            assert d.item is not None
            bad = check_extract_work_item(d.item) if d.item.operation == "extract" else None
            if bad is None:
                checked.append(d)
            else:
                refused.append((d, bad.code, bad.message))
        offloaded = [d for d in checked if d.item is not None and payload_ref_of(d.item) is not None]
        if offloaded:
            if self._payloads is None:
                refused += [(d, PAYLOAD_ERROR, "failed to resolve item") for d in offloaded]
            else:
                outcomes = await resolve_items(self._payloads, [d.item for d in offloaded if d.item is not None])
                for d, r in zip(offloaded, outcomes, strict=True):
                    if not r.ok:
                        extra = {"item": r.item.work_item_id, "reason": r.reason}
                        _warn.warning("payload fetch failed", key=r.reason, extra=extra)
                        refused.append((d, r.code, r.message))
                        continue
                    d.item, d.payload_fetch_ms = r.item, r.fetch_ms
                    bad = check_extract_work_item(r.item) if r.item.operation == "extract" else None
                    if bad is not None:
                        refused.append((d, bad.code, bad.message))
        if not refused:
            return checked
        for code in dict.fromkeys(code for _, code, _ in refused):
            group = [(d, message) for d, c, message in refused if c == code]
            for message in dict.fromkeys(m for _, m in group):
                await self._out.publish_errors(
                    [d for d, m in group if m == message], code, message, nak_on_failure=True
                )
        gone = {id(d) for d, _, _ in refused}
        return [d for d in checked if id(d) not in gone]


__all__ = ["BackendClient", "ConfigState", "DispatchSettings", "Dispatcher", "ReplySink"]
