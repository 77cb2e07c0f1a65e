# SPDX-License-Identifier: Apache-2.0
"""Confirmed ACKs: the last ACK of every batch asks JetStream for an answer, and a batch whose answer
does not come is ACKed again (backing off) until it comes or the batch's ack_wait has passed.

Why: a plain ACK is fire-and-forget. When the durable's leader dies or freezes, the ACKs it had not
replicated yet are lost with it, and their items are delivered again after ack_wait: 21-37 duplicates
per leader fault at 531 items/s (docs/reliability.md). A replicated consumer answers an ACK that
carries a reply subject only once a quorum holds it (tests/integration/test_ack_confirm.py pauses
both followers and sees no answer until they resume), and a server takes one connection's ACKs in
order, so the answer to a batch's last ACK confirms the batch. The cost is one message back from
the server per batch, nothing per item. Re-sent ACKs of a batch that was in fact ACKed are no-ops.

Nothing is re-sent while the connection is down: the reconnect buffer is for the replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..logs import Throttled
from .outbound import ACK, FramedWriter, frame_pubs

log = logging.getLogger(__name__)
_warn = Throttled(log)

#: Batches awaiting an answer at most; past it the oldest is given up (counted), bounding memory
#: when a server stops answering but keeps the connection (e.g. a consumer without a leader).
MAX_PENDING_BATCHES = 4096
#: The status of the answer a server makes itself when nobody subscribes to the subject.
NO_RESPONDERS = "503"
#: How long `close` waits for the answers still owed (the last batches of a drain).
CLOSE_WAIT_S = 1.0


def frame_confirmed_acks(subjects: Sequence[str], reply: str) -> bytes:
    """`+ACK` to every subject, the last one carrying `reply` (`PUB <subject> <reply> 4`)."""
    if not subjects:
        raise ValueError("no ACKs to frame")
    *rest, last = subjects
    return frame_pubs([(s, ACK) for s in rest]) + b"PUB %s %s 4\r\n+ACK\r\n" % (last.encode(), reply.encode())


@dataclass
class ConfirmCounts:
    """What `/debug/state` shows under `ack_confirm`."""

    batches: int = 0
    confirmed: int = 0
    #: Batches ACKed again because no answer came within the (doubling) timeout.
    resent: int = 0
    #: Batches given up: ack_wait passed without an answer (JetStream redelivers them), or over
    #: `MAX_PENDING_BATCHES`.
    expired: int = 0
    overflowed: int = 0
    #: Answers that said nobody took the ACK (`503`, e.g. while the durable elects a leader).
    unheard: int = 0


@dataclass
class _Batch:
    subjects: Sequence[str]
    due: float
    deadline: float
    wait_s: float


class AckConfirmer:
    """The settler's `AckWriter` when ACKs are confirmed; `start` subscribes to the answers."""

    def __init__(
        self,
        nc: Any,
        writer: FramedWriter,
        *,
        timeout_s: float,
        ack_wait_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nc = nc
        self._writer = writer
        self._timeout_s = timeout_s
        self._ack_wait_s = ack_wait_s
        self._clock = clock
        self._prefix: str = nc.new_inbox()
        self._tokens = itertools.count(1)
        self._pending: dict[int, _Batch] = {}  # by token; insertion order is send order
        self._sub: Any = None
        self._task: asyncio.Task[None] | None = None
        self.counts = ConfirmCounts()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(f"{self._prefix}.*", cb=self._on_answer)
        self._task = asyncio.create_task(self._watch(), name="ack-confirm")

    async def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Wait up to `wait_s` for the answers still owed, then stop; what is unanswered then is
        redelivered after ack_wait, as any un-ACKed message."""
        deadline = self._clock() + wait_s
        while self._pending and self._clock() < deadline and self._nc.is_connected:
            await asyncio.sleep(0.02)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def ack_many(self, reply_subjects: Sequence[str]) -> None:
        """ACK a batch in one write, its last ACK asking for an answer; raises like `publish` (the
        settler logs it), and the batch is re-sent once the connection is back."""
        if not reply_subjects:
            return
        self.counts.batches += 1
        now = self._clock()
        batch = _Batch(reply_subjects, now + self._timeout_s, now + self._ack_wait_s, self._timeout_s)
        token = self._remember(batch)
        await self._send(reply_subjects, token)

    def snapshot(self) -> dict[str, int | float]:
        return {"timeout_s": self._timeout_s, "pending": len(self._pending), **vars(self.counts)}

    def _remember(self, batch: _Batch) -> int:
        token = next(self._tokens)
        self._pending[token] = batch
        if len(self._pending) > MAX_PENDING_BATCHES:
            del self._pending[next(iter(self._pending))]
            self.counts.overflowed += 1
            _warn.warning("ACK confirmations overflowed; oldest batch left to ack_wait")
        return token

    async def _send(self, subjects: Sequence[str], token: int) -> None:
        reply = f"{self._prefix}.{token}"
        if self._writer.framed:
            await self._writer.publish_framed(frame_confirmed_acks(subjects, reply), len(subjects), 4 * len(subjects))
            return
        for subject in subjects[:-1]:
            await self._nc.publish(subject, ACK)
        await self._nc.publish(subjects[-1], ACK, reply=reply)

    async def _on_answer(self, msg: Any) -> None:
        """An answer from the consumer confirms, even an error (an ACK of a message already ACKed:
        nothing is left to ACK). A `503` status is the server saying that nobody took the ACK (no
        leader yet, mid-election): the batch stays owed and is re-sent when due."""
        headers = msg.headers
        if headers is not None and headers.get("Status") == NO_RESPONDERS:
            self.counts.unheard += 1
            return
        _, _, token = msg.subject.rpartition(".")
        if token.isdigit() and self._pending.pop(int(token), None) is not None:
            self.counts.confirmed += 1

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(min(self._timeout_s / 2, 0.5))
            if self._nc.is_connected:
                await self.resend_due()

    async def resend_due(self) -> None:
        """Re-ACK every batch whose answer is overdue (its wait doubles each time); give up on those
        past their ack_wait, which JetStream has redelivered or is about to."""
        now = self._clock()
        due = [(t, b) for t, b in self._pending.items() if b.due <= now]
        for token, batch in due:
            if self._pending.pop(token, None) is None:
                continue  # answered meanwhile
            if now >= batch.deadline:
                self.counts.expired += 1
                _warn.warning("ACKs unconfirmed within ack_wait; redelivered", extra={"acks": len(batch.subjects)})
                continue
            batch.wait_s *= 2
            batch.due = now + batch.wait_s
            self.counts.resent += 1
            new_token = self._remember(batch)
            try:
                await self._send(batch.subjects, new_token)
            except Exception as exc:  # disconnected again: the next round tries once more
                log.debug("ACK re-send failed", extra={"error": repr(exc)})


__all__ = ["CLOSE_WAIT_S", "MAX_PENDING_BATCHES", "AckConfirmer", "ConfirmCounts", "frame_confirmed_acks"]
