# SPDX-License-Identifier: Apache-2.0
"""Execution of one formed batch (§4.1, §4.6, §5.5): the last cancellation and deadline checks, the
config barrier, one batch RPC (RunBatch, or the per-op method), publication and settlement of every
item, and what the model's lane learns from it (`BatchReport`). Model lanes call it; it calls no
earlier stage."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress
from typing import TYPE_CHECKING, Any

from .. import wire
from ..errors import NO_RUN_BATCH, ConfigNotAttested, IpcServerError
from ..ipc.requests import PER_OP_METHOD, per_op_body, run_batch_request
from ..otel.tracer import BatchSpan, Tracer
from ..sched.lane import BatchReport
from ..sched.scheduler import Formed
from ..telemetry import WORK_ITEM_AGE, Histogram, Registry
from .columns import config_hashes, request_latencies_ms, run_batch_columns
from .config_gate import ConfigState
from .delivery import Delivery
from .lanes import ModelLanes
from .outcomes import Outcomes
from .stages import MODEL_UNSUPPORTED, BackendClient, warn
from .sweeps import Sweeper

if TYPE_CHECKING:
    from .dispatcher import DispatchSettings


@dataclass(frozen=True, slots=True)
class Executed:
    """What an executed batch tells its lane: the backend's `inference_ms` (first outcome's), the
    requests with a success, in outcome order, and (when the replies were framed natively) every
    executed item's `request_id` in item order."""

    inference_ms: float | None
    succeeded: dict[str, None]
    request_ids: list[str] | None = None


class Execution:
    """Formed batches to batch RPCs and settled items."""

    def __init__(
        self,
        settings: DispatchSettings,
        backend: BackendClient,
        outcomes: Outcomes,
        *,
        sweeper: Sweeper,
        lanes: ModelLanes,
        config: ConfigState,
        telemetry: Registry,
        tracer: Tracer | None,
    ) -> None:
        self._s = settings
        self._backend = backend
        self._out = outcomes
        self._sweeper = sweeper
        self._lanes = lanes
        self._config = config
        self._telemetry = telemetry
        #: Batch spans (`SIE_TRACING_ENABLED`); None: off, one test per batch and nothing per item.
        self.tracer = tracer
        #: Items per backend batch call, for the shutdown summary and the demo.
        self.batch_sizes: Counter[int] = Counter()
        #: Called when the backend refuses a batch as `draining` (the runtime's pull gate stops pulling).
        self.on_draining: Callable[[], None] | None = None
        #: `sie.worker.work_item.age` by operation, looked up once per registry (not per batch).
        self._ages: dict[str, tuple[Registry, Histogram]] = {}

    def _age_histogram(self, op: str) -> tuple[Registry, Histogram]:
        """`sie.worker.work_item.age` of `op`, made and kept in `_ages` (read inline; this on a miss)."""
        found = self._ages[op] = (self._telemetry, self._telemetry.histogram(WORK_ITEM_AGE, (("operation", op),)))
        return found

    async def execute_formed(self, model: str, formed: Formed[Delivery]) -> BatchReport | None:
        """One formed batch: execute it and report what the model's lane learns from (§4.1, §4.6):
        the reported `inference_ms`, the call's time, and each succeeded request's latency. With
        metrics, each item's queue time and, when the backend answered, the batch's size and cost
        and its oldest item's enqueue → dispatch and → answer."""
        started = time.monotonic()
        outcome = await self._execute(
            model,
            formed.op,
            formed.lora,
            formed.items,
            formed.total_cost,
        )
        finished = time.monotonic()
        lane = self._lanes.models[model].lane
        metrics = lane.metrics if lane is not None else None
        if metrics is not None:  # one compiled call: queue times, and size, cost, waits when answered
            taken_at = formed.taken_at if formed.taken_at is not None else started
            answered = None if outcome is None else finished
            instruments = metrics.batches.get(formed.op)  # inline; the method on a miss
            if instruments is None or metrics.resolved_version != metrics.catalog.version:
                instruments = metrics.batch(formed.op)
            instruments.record(formed.enqueued_at, taken_at, len(formed.items), formed.total_cost, started, answered)
        if outcome is None:
            return None
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

    async def _execute(self, model: str, op: str, lora: str, ds: list[Delivery], total_cost: int) -> Executed | None:
        """Cancellation, the config barrier, one batch RPC and the settlement of every item; returns
        what the lane learns from it, or None when the batch never reached the backend or failed there."""
        base = self._s.nak_delay_ms
        ds = await self._sweeper.drop_tombstoned(ds)  # before_ipc: cancelled first (§4.1 row 9 before row 10)
        ds, latest = await self._sweeper.drop_expired(ds, before_ipc=True)
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
                ages: Histogram | None = None
                if self._lanes.catalog is not None:  # §5.6: the work-item age, at the execution commit
                    found = self._ages.get(op)
                    if found is None or found[0] is not self._telemetry:
                        found = self._age_histogram(op)
                    ages = found[1]  # recorded by `run_batch_columns`, in the call that reads the items
                wait = None
                if latest is not None:
                    wait = self._s.deadlines.run_batch_timeout_s(self._s.ipc_request_timeout_s, latest, time.time())
                outcome, refused, span = await self._call_backend(
                    model, op, lora, ds, total_cost, pinned=pinned, timeout_s=wait, ages=ages
                )
        if outcome is None:
            if isinstance(refused, IpcServerError):
                # `draining` too gets the base delay, as v0.7.1 does in practice (§4.2, last row): a
                # backend restarting gracefully refuses for seconds, and 100 ms NAKs spent an item's
                # 20 deliveries in 2 s. The readiness gate stops the pulling meanwhile.
                self._lanes.forget_ready(model)
                warn.warning("batch RPC refused", key=model, extra={"model": model, "error": refused.message})
                if refused.message == "draining" and self.on_draining is not None:
                    self.on_draining()
            elif refused is not None:  # transport, timeout, decode: the whole batch goes back
                self._lanes.forget_ready(model)
                warn.warning("batch RPC failed", key=model, extra={"model": model, "error": repr(refused)})
            await self._out.nak_all(ds, base, MODEL_UNSUPPORTED if unsupported else "retry")
            return None
        items_count = len(ds)
        self.batch_sizes[items_count] += 1
        try:
            if isinstance(outcome, wire.FramedResponse):  # replies already framed from the response bytes
                await self._out.settle_response(ds, outcome)
                rids = outcome.request_ids
                return Executed(outcome.inference_ms, dict.fromkeys(compress(rids, outcome.success)), rids)
            await self._out.apply(ds, outcome)
        finally:
            if span is not None:  # the batch's span covers its publish and settlement too
                span.event("published")
                span.end()
        outcomes = outcome.outcomes
        return Executed(
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
        ages: Histogram | None = None,
    ) -> tuple[Any, BaseException | None, BatchSpan | None]:
        """One batch RPC (RunBatch, or the per-op method for a backend without it): the outcome, or
        None and what refused it (None: the config gate); and, for a sampled batch that got an
        answer, its span, still open (the caller ends it once the replies are published). Runs
        inside the execution barrier. A batch with hash-pinned items goes only to a child whose
        last Ping attests the advertised config. `ages`: where each item's work-item age is
        recorded now (metrics on)."""
        # The RunBatch writer reads undecoded items in place (`wire_item`); every one has an item.
        # Tracing on, the same pass gathers the items' distinct contexts for the span.
        tracer = self.tracer
        contexts: list[str] | None = [] if tracer is not None and not tracer.never else None
        items, fetch_ms, prepared, audio = run_batch_columns(ds, op, ages, contexts)
        # A sampled batch's span is parented on its items' first valid context and links to the
        # others (§5.4); its context is the one every RunBatchItem carries to the backend. An
        # unsampled batch's bytes are exactly the untraced ones.
        span = None
        if tracer is not None and contexts is not None:
            span = tracer.start_batch(model, op, len(items), total_cost, contexts)
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
                    body = run_batch_request(
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
