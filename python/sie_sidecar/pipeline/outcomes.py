# SPDX-License-Identifier: Apache-2.0
"""Outcomes and replies (sidecar-behaviour §4.2, §6): bind a batch's outcomes to its deliveries, publish
the replies through a `ReplySink` (a whole batch at a time), then settle every delivery exactly once:
ACK after publication, NAK for a retry, or left un-ACKed when a backend outcome could not be published."""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .. import wire
from ..errors import QUEUE_FULL, REMOTE_REFUSAL_MESSAGE
from ..logs import Throttled
from ..sched.quantum import QuantumController
from ..wire.types import Reply, WorkResult
from ..wire.workitem import WorkItem
from .config_gate import ConfigState
from .delivery import Delivery, Settler
from .replies import batched_f16_slices, error_result, outcome_result, queue_ms

log = logging.getLogger(__name__)
_warn = Throttled(log)

#: The shortest NAK delay a backend's `nak_retry` outcome may ask for: a backend answering 0 for
#: work it cannot take would otherwise spend the item's 20 deliveries in a moment (law 2).
MIN_RETRY_NAK_MS = 1000


class ReplySink(Protocol):
    """Where replies go (`bus.publisher.Publisher` on NATS): whole batches, never one message at a time."""

    @property
    def framed(self) -> bool: ...
    @property
    def max_payload(self) -> int: ...
    async def publish_framed(self, replies: wire.FramedReplies) -> bool: ...
    async def publish_batch(self, replies: list[Reply]) -> list[bool]: ...
    async def publish_raw(self, subject: str, payload: bytes) -> bool: ...


class Outcomes:
    """Publishes and settles for the dispatcher; `on_retry(model)` hears of every `nak_retry` outcome
    (the dispatcher forgets its cached ready answer for that model)."""

    def __init__(
        self,
        *,
        worker_id: str,
        nak_delay_ms: int,
        publisher: ReplySink,
        settler: Settler,
        config: ConfigState,
        quantum: QuantumController | None,
        on_retry: Callable[[str], object],
        acks_with_replies: bool = False,
    ) -> None:
        """`acks_with_replies`: the publisher and the settler write to the same connection, so a
        natively framed batch carries its ACKs after its replies (one write per batch)."""
        self._acks_with_replies = acks_with_replies
        self._worker_id = worker_id
        self._nak_delay_ms = nak_delay_ms
        self._publisher = publisher
        self._settler = settler
        self._config = config
        self._quantum = quantum
        self._on_retry = on_retry

    async def apply(self, ds: list[Delivery], outcome: Any) -> None:
        """Bind outcomes to deliveries by work_item_id (FIFO for duplicates), publish, then settle."""
        if not outcome.batched_f16_multivectors and self._publisher.framed:
            framed = wire.frame_outcome_replies(
                ds,
                outcome.outcomes,
                worker_id=self._worker_id,
                current_hash=self._config.current,
                now=time.time(),
                max_payload=self._publisher.max_payload,
                acks=self._acks_with_replies,
                ack_reply=self._ack_reply(ds),
            )
            if framed is not None:  # the common case: every reply framed natively in one call
                if await self.settle_framed(ds, framed):
                    self._observe_framed(ds, outcome.outcomes, framed.sent)
                return
        base = self._nak_delay_ms
        waiting: dict[str, deque[Delivery]] = defaultdict(deque)
        for d in ds:
            assert d.item is not None
            waiting[d.item.work_item_id].append(d)
        f16 = batched_f16_slices(outcome.batched_f16_multivectors)
        to_publish: list[tuple[Delivery, WorkResult]] = []
        refusals: list[tuple[Delivery, WorkResult]] = []
        for o in outcome.outcomes:
            queue = waiting.get(o.work_item_id)
            if not queue:
                _warn.warning("outcome for an unknown work item; ignored", extra={"item": o.work_item_id})
                continue
            d = queue.popleft()
            assert d.item is not None
            if o.disposition == "nak_retry":
                self._on_retry(d.model)  # e.g. the model was unloaded mid-batch
                delay = base if o.nak_delay_ms is None else max(o.nak_delay_ms, min(base, MIN_RETRY_NAK_MS))
                if d.item.fallback_reason is not None:
                    refusals.append((d, self._remote_refusal(d, o, delay)))
                    continue
                await self._settler.nak(d, delay)
                continue
            result = outcome_result(
                d.item,
                o,
                worker_id=self._worker_id,
                worker_direct=d.worker_direct,
                current_hash=self._config.current,
                f16_slice=f16.get(o.work_item_id),
                payload_fetch_ms=d.payload_fetch_ms,
            )
            to_publish.append((d, result))
        for queue in waiting.values():
            for d in queue:
                await self._settler.nak(d, base)  # no outcome for this item
        await self.publish_and_settle(to_publish, nak_on_failure=False)
        await self.publish_and_settle(refusals, nak_on_failure=True)

    def _remote_refusal(self, d: Delivery, o: Any, delay_ms: int) -> WorkResult:
        """wire-protocol §4.6 (newer than v0.7.1): a `nak_retry` of an item that stands in for a
        local refusal (`fallback_reason`) goes back to its gateway as a refusal, not into the stream:
        the outcome's code (default QUEUE_FULL) and retry hint (default the NAK delay in seconds)."""
        assert d.item is not None
        return error_result(
            d.item,
            code=o.error_code or QUEUE_FULL,
            message=REMOTE_REFUSAL_MESSAGE,
            worker_id=self._worker_id,
            worker_direct=d.worker_direct,
            current_hash=self._config.current,
            retry_after_s=o.retry_after_s if o.retry_after_s is not None else math.ceil(delay_ms / 1000),
        )

    def response_decoder(self, ds: list[Delivery]) -> Callable[[memoryview], Any]:
        """What the RunBatch call decodes its response with: replies framed straight from the
        response bytes (`wire.frame_batch_response`, no object per outcome) when the batch is the
        common case, else the decoded `BatchOutcome` for `apply`."""
        q = self._quantum
        fused = self._publisher.framed and (q is None or not q.include_queue_ms)

        def decode(raw: memoryview) -> Any:
            if fused:
                framed = wire.frame_batch_response(
                    raw,
                    ds,
                    worker_id=self._worker_id,
                    current_hash=self._config.current,
                    now=time.time(),
                    max_payload=self._publisher.max_payload,
                    acks=self._acks_with_replies,
                    ack_reply=self._ack_reply(ds),
                )
                if framed is not None:
                    return framed
            return wire.decode_batch_outcome(raw)

        return decode

    async def settle_response(self, ds: list[Delivery], framed: wire.FramedResponse) -> None:
        """Publish and settle a batch framed by `response_decoder`; feed the quantum controller."""
        if await self.settle_framed(ds, framed.replies) and self._quantum is not None:
            self._quantum.observe_totals(framed.totals)

    def _observe_framed(self, ds: list[Delivery], outcomes: list[Any], sent: bytes) -> None:
        """`observe` for a natively framed batch: one window update for the whole batch."""
        q = self._quantum
        if q is None:
            return
        if q.include_queue_ms:
            self.observe(
                (d.item, o.inference_ms, o.postprocessing_ms)
                for d, o, s in zip(ds, outcomes, sent, strict=True)
                if s and o.disposition == "publish_and_ack" and d.item is not None
            )
            return
        q.observe_totals(
            [
                (o.inference_ms or 0.0) + (o.postprocessing_ms or 0.0)
                for o, s in zip(outcomes, sent, strict=True)
                if s and o.disposition == "publish_and_ack"
            ]
        )

    def observe(self, items: Iterable[tuple[WorkItem, float | None, float | None]]) -> None:
        """Feed the quantum controller one latency sample per published `publish_and_ack` item."""
        q = self._quantum
        if q is None:
            return
        now = time.time()
        for item, inference_ms, postprocessing_ms in items:
            q.observe(inference_ms, postprocessing_ms, queue_ms(item, now) if q.include_queue_ms else None)

    def _ack_reply(self, ds: list[Delivery]) -> str | None:
        """With confirmed ACKs, the reply subject the framer writes on a batch's last ACK, so that it
        asks for an answer (`ack_reply`); None without them."""
        confirmation = self._settler.confirmation if self._acks_with_replies else None
        return confirmation.reserve() if confirmation is not None and ds else None

    async def settle_framed(self, ds: list[Delivery], framed: wire.FramedReplies) -> bool:
        """Publish a natively framed batch, flush, then ACK; on failure leave what was sent un-ACKed.
        With confirmed ACKs the last ACK in the buffer asks for an answer (`_ack_reply`)."""
        published = await self._publisher.publish_framed(framed)
        confirmation = self._settler.confirmation
        if published and confirmation is not None and framed.ack_reply is not None:
            confirmation.owe_reply(framed.ack_reply, ds)
        if published:
            if framed.acks:
                self._settler.acked_with_replies(ds)
            else:
                await self._settler.ack_many(ds)
            return True
        sent = framed.sent  # nothing of the buffer went out, its ACKs neither
        await self._settler.ack_many([d for d, s in zip(ds, sent, strict=True) if not s])  # no reply subject
        for d, s in zip(ds, sent, strict=True):
            if s:
                self._settler.leave(d)
        return False

    async def publish_errors(self, ds: Iterable[Delivery], code: str, message: str, *, nak_on_failure: bool) -> None:
        results = []
        for d in ds:
            assert d.item is not None
            results.append(
                (
                    d,
                    error_result(
                        d.item,
                        code=code,
                        message=message,
                        worker_id=self._worker_id,
                        worker_direct=d.worker_direct,
                        current_hash=self._config.current,
                    ),
                )
            )
        await self.publish_and_settle(results, nak_on_failure=nak_on_failure)

    async def publish_and_settle(self, results: list[tuple[Delivery, WorkResult]], *, nak_on_failure: bool) -> None:
        """Publish, flush, then ACK what went out. A failed publish of a backend outcome is left
        un-ACKed (redelivered after ack_wait); a failed sidecar error is NAKed with the base delay."""
        if not results:
            return
        replies = [
            Reply(subject=d.item.reply_subject, result=r, accepts_result_chunks=d.item.accepts_result_chunks)
            for d, r in results
            if d.item is not None
        ]
        sent = await self._publisher.publish_batch(replies)
        published = []
        for (d, r), ok in zip(results, sent, strict=True):
            if ok:
                published.append(d)
                if r.success and self._quantum is not None and d.item is not None and d.item.reply_subject.strip():
                    self.observe(((d.item, r.inference_ms, r.postprocessing_ms),))
            elif nak_on_failure:
                await self._settler.nak(d, self._nak_delay_ms)
            else:
                self._settler.leave(d)
        await self._settler.ack_many(published)  # after the flush, in one framed write

    async def nak_all(self, ds: Iterable[Delivery], delay_ms: int, reason: str = "retry") -> None:
        """NAK every unsettled delivery (`reason`: the NATS metric reason, §13)."""
        for d in ds:
            if not d.settled:
                await self._settler.nak(d, delay_ms, reason)


__all__ = ["MIN_RETRY_NAK_MS", "Outcomes", "ReplySink"]
