# SPDX-License-Identifier: Apache-2.0
"""One JetStream delivery and the rule that it is settled exactly once (sidecar-behaviour §4)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..logs import Throttled
from ..telemetry import NATS_OPERATIONS, Counter, Registry
from ..wire._switch import load
from ..wire.workitem import WorkItem
from .source import SettleHandle

log = logging.getLogger(__name__)


#: `(done, twice, releases)` for a batch: `_native.finish_deliveries`, or its twin (`_twins.delivery`).
_finish_deliveries: Callable[[Sequence[Any]], tuple[list[Any], list[Any], list[tuple[Any, int]]]] = load(
    "delivery"
).finish_deliveries
#: Settlement failures come per message while the connection is down: rate-limited, with a count.
_warn = Throttled(log)


class AckWriter(Protocol):
    """Writes many ACKs in one framed write (`bus.outbound.FramedWriter`)."""

    async def ack_many(self, reply_subjects: Sequence[str]) -> None: ...


class AckConfirmation(Protocol):
    """Confirmed ACKs (`bus.ack_confirm.AckConfirmer`) for batches whose ACKs leave in the buffer of
    their replies: the native framer writes the last ACK asking for an answer, `reserve` names its
    reply subject beforehand, and `owe_reply` awaits the answer once the buffer is written."""

    def reserve(self) -> str: ...
    def owe_reply(self, reply: str, deliveries: Sequence[Any]) -> None: ...


@dataclass(slots=True)
class SettleCounts:
    """How deliveries ended; `settled` counts every final state, `left_unacked` included."""

    acked: int = 0
    dropped: int = 0
    naked: int = 0
    left_unacked: int = 0
    progress: int = 0
    settle_errors: int = 0

    @property
    def settled(self) -> int:
        return self.acked + self.dropped + self.naked + self.left_unacked


@dataclass(slots=True)
class Delivery:
    """A pulled message, its decoded WorkItem (once intake decoded it) and its settlement state.

    The native intake makes `_native.LazyDelivery` objects instead whenever it can: the same
    attributes, with the WorkItem decoded only when `item` is first read."""

    msg: SettleHandle
    worker_direct: bool
    item: WorkItem | None = None
    model: str = ""
    settled: bool = field(default=False)
    #: Time spent fetching an offloaded payload for this item (0 when it was inline).
    payload_fetch_ms: float = 0.0
    #: PreparedTokens for an encode item the sidecar tokenized (sent in the RunBatch item).
    prepared_tokens: Mapping[str, Any] | None = None
    #: PreparedAudioPcm16 for an extract item whose audio the sidecar decoded (scheduler-and-prep §7.3).
    prepared_audio: Mapping[str, Any] | None = None
    #: Gives the pull consumer that delivered this message its capacity back.
    release: Callable[[int], None] | None = None

    @property
    def wire_item(self) -> WorkItem | None:
        """What the RunBatch writer and the config barrier read. Here the item itself; the native
        `LazyDelivery` (same attributes, WorkItem kept in its payload until `item` is read) gives
        itself while its item is undecoded, so neither decodes it."""
        return self.item


class Settler:
    """Settles deliveries exactly once and tells the pull loop that capacity came back.

    ACK/NAK/progress failures are logged and otherwise ignored (§4): JetStream redelivers an
    un-ACKed message after ack_wait, which is the safe outcome.
    """

    def __init__(self, writer: AckWriter | None = None, confirmation: AckConfirmation | None = None) -> None:
        self.counts = SettleCounts()
        self._writer = writer
        #: Set when ACKs are confirmed; the writer is then the confirmer too.
        self.confirmation = confirmation
        #: Where `sie.worker.nats.operations` is recorded (§13), once per settle call; None: not.
        self.telemetry: Registry | None = None
        self._counters: dict[tuple[str, str, bool], tuple[Registry, Counter]] = {}

    def _record(self, operation: str, reason: str, n: int, *, ok: bool = True) -> None:
        telemetry = self.telemetry
        if telemetry is not None and n:
            key = (operation, reason, ok)
            found = self._counters.get(key)
            if found is None or found[0] is not telemetry:  # once per series and registry
                attrs = (("operation", operation), ("outcome", "success" if ok else "error"), ("reason", reason))
                found = self._counters[key] = (telemetry, telemetry.counter(NATS_OPERATIONS, attrs))
            found[1].value += n  # `add` inline (n > 0): one Python frame a batch less

    def _finish(self, d: Delivery) -> bool:
        return bool(self._finish_many((d,)))

    async def ack(self, d: Delivery) -> None:
        """Final ACK after the result was published (or there was nothing to publish)."""
        if self._finish(d):
            self.counts.acked += 1
            self._record("ack", "completed", 1, ok=await self._call(d, d.msg.ack()))

    def _finish_many(self, ds: Sequence[Delivery]) -> list[Delivery]:
        """`_finish` for a batch: the capacity goes back with one `release(n)` per source. One
        native call for the whole batch (`_native.finish_deliveries`, or its twin with the twins)."""
        return self._settle(ds, _finish_deliveries)

    @staticmethod
    def _settle(
        ds: Sequence[Delivery],
        finish: Callable[[Sequence[Any]], tuple[list[Any], list[Any], list[tuple[Any, int]]]],
    ) -> list[Delivery]:
        done, twice, releases = finish(ds)
        for d in twice:
            log.error("delivery settled twice", extra={"subject": d.msg.subject})
        for release, count in releases:
            release(count)
        return done

    def acked_with_replies(self, ds: Sequence[Delivery]) -> None:
        """The batch's ACKs went out in the same buffer as its replies (`frame_outcome_replies`
        with `acks`): settle and count them, nothing left to write."""
        n = len(self._finish_many(ds))
        self.counts.acked += n
        self._record("ack", "completed", n)

    async def ack_many(self, ds: Sequence[Delivery]) -> None:
        """ACK a batch of deliveries with one framed write (one `ack` each without a writer)."""
        if self._writer is None:
            for d in ds:
                await self.ack(d)
            return
        subjects = [d.msg.reply for d in self._finish_many(ds)]
        self.counts.acked += len(subjects)
        try:
            await self._writer.ack_many(subjects)
        except Exception as exc:  # logged and ignored, per §4: un-ACKed work is redelivered
            self.counts.settle_errors += len(subjects)
            _warn.warning("batch ack failed", extra={"acks": len(subjects), "error": repr(exc)})
            self._record("ack", "completed", len(subjects), ok=False)
        else:
            self._record("ack", "completed", len(subjects))

    async def drop(self, d: Delivery, reason: str = "completed") -> None:
        """ACK-drop: nothing is published (cancelled work, unsafe reply subject, a server copy:
        reason `completed`; work past its deadline: `deadline_exceeded`, §4.1)."""
        if self._finish(d):
            self.counts.dropped += 1
            self._record("ack", reason, 1, ok=await self._call(d, d.msg.ack()))

    async def nak(self, d: Delivery, delay_ms: int, reason: str = "retry") -> None:
        """NAK for redelivery after `delay_ms` (metric reason `retry`, or the §4.1 row's own:
        `pool_not_assigned`, `model_unsupported`)."""
        if self._finish(d):
            self.counts.naked += 1
            self._record("nak", reason, 1, ok=await self._call(d, d.msg.nak(delay=max(0, delay_ms) / 1000.0)))

    def leave(self, d: Delivery) -> None:
        """Publishing failed: leave the message un-ACKed so it is redelivered after ack_wait."""
        if self._finish(d):
            self.counts.left_unacked += 1

    async def progress(self, d: Delivery) -> bool:
        """Progress-ACK (in_progress) a delivery that is still being worked on."""
        if d.settled:
            return True
        try:
            await d.msg.in_progress()
        except Exception as exc:  # any failure means the lease could not be extended
            self.counts.settle_errors += 1
            _warn.warning("progress ack failed", extra={"subject": d.msg.subject, "error": repr(exc)})
            self._record("progress", "none", 1, ok=False)
            return False
        self.counts.progress += 1
        self._record("progress", "none", 1)
        return True

    async def _call(self, d: Delivery, op: object) -> bool:
        """Await one settle call; False (logged and ignored, per §4) when it failed."""
        try:
            await op  # type: ignore[misc]
        except Exception as exc:
            self.counts.settle_errors += 1
            _warn.warning("settle failed", extra={"subject": d.msg.subject, "error": repr(exc)})
            return False
        return True


__all__ = ["AckConfirmation", "AckWriter", "Delivery", "SettleCounts", "Settler"]
