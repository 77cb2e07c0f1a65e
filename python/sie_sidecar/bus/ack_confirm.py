# SPDX-License-Identifier: Apache-2.0
"""Confirmed ACKs: the last ACK of every batch asks JetStream for an answer, and a batch whose answer
does not come is ACKed again (backing off) while that is safe, until its ack_wait has passed.

Why: a plain ACK is fire-and-forget. When the durable's leader dies or freezes, the ACKs it had not
replicated yet are lost with it, and their items are delivered again after ack_wait: 21-37 duplicates
per leader fault at 531 items/s (docs/reliability.md). A replicated consumer answers an ACK that
carries a reply subject only once a quorum holds it (tests/integration/test_ack_confirm.py pauses
both followers and sees no answer until they resume), and a server takes one connection's messages
in order, so the answer to a batch's last ACK confirms the batch. The cost is one message back per
batch, nothing per item; the ACKs still leave in the same write as their replies.

When re-sending is safe: an ACK may only follow its reply. A batch's replies and ACKs leave in one
write; if that connection was lost since, the replies may have died in it, and ACKing again would
settle items nobody was answered for (lost; the first version did that after a reconnect). So an
unanswered batch is re-ACKed only while the connection it was written to is still the current one
and a PING/PONG proves the server has read everything written before (the client's buffer empty
first, since nats-py's PING overtakes what is still in it). Otherwise it is left to redelivery, as
a plain ACK would be. Re-sent ACKs of a batch that was in fact taken are no-ops.
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
from .direct import direct
from .outbound import ACK, FramedWriter, frame_pubs

log = logging.getLogger(__name__)
_warn = Throttled(log)

#: Batches awaiting an answer at most; past it the oldest is given up (counted), bounding memory
#: when a server stops answering but keeps the connection (e.g. a consumer without a leader).
MAX_PENDING_BATCHES = 4096
#: The longest wait between re-sends, in timeouts: 2, 4, 8, 8, 8 s with the default, so a batch
#: still gets tries late in its ack_wait.
MAX_WAIT_TIMEOUTS = 4
#: The status of the answer a server makes itself when nobody subscribes to the subject.
NO_RESPONDERS = "503"
#: How long `close` waits for the answers still owed (the last batches of a drain).
CLOSE_WAIT_S = 1.0
_ACK_TAIL = b" 4\r\n+ACK\r\n"


def frame_confirmed_acks(subjects: Sequence[str], reply: str) -> bytes:
    """`+ACK` to every subject, the last one carrying `reply` (`PUB <subject> <reply> 4`)."""
    if not subjects:
        raise ValueError("no ACKs to frame")
    *rest, last = subjects
    return frame_pubs([(s, ACK) for s in rest]) + b"PUB %s %s%s" % (last.encode(), reply.encode(), _ACK_TAIL)


def ask_last_ack(buffer: bytes, last_subject: str, reply: str) -> bytes | None:
    """`buffer` (replies, then their ACKs: `wire.frame_outcome_replies` with `acks`) with its final
    ACK, to `last_subject`, carrying `reply`; None when the buffer does not end with that ACK."""
    tail = b"PUB %s%s" % (last_subject.encode(), _ACK_TAIL)
    if not buffer.endswith(tail):
        return None
    confirmed_tail = b"PUB %s %s%s" % (last_subject.encode(), reply.encode(), _ACK_TAIL)
    return b"".join((memoryview(buffer)[: len(buffer) - len(tail)], confirmed_tail))


@dataclass
class ConfirmCounts:
    """What `/debug/state` shows under `ack_confirm`."""

    batches: int = 0
    confirmed: int = 0
    #: Batches ACKed again because no answer came within the (doubling) timeout.
    resent: int = 0
    #: Batches given up at ack_wait without an answer (JetStream redelivers them).
    expired: int = 0
    #: Batches written to a connection since lost: left to redelivery (their replies may have died).
    abandoned: int = 0
    #: Batches given up because more than `MAX_PENDING_BATCHES` were owed.
    overflowed: int = 0
    #: Answers that said nobody took the ACK (`503`, e.g. while the durable elects a leader).
    unheard: int = 0


@dataclass
class _Batch:
    #: The ACK subjects, or the deliveries they are read from only if a re-send needs them.
    subjects: Sequence[str] | None
    deliveries: Sequence[Any] | None
    connection: int
    due: float
    deadline: float
    wait_s: float

    def __len__(self) -> int:
        return len(self.subjects if self.subjects is not None else self.deliveries or ())

    def ack_subjects(self) -> list[str]:
        if self.subjects is not None:
            return list(self.subjects)
        return [str(d.msg.reply) for d in self.deliveries or ()]


class AckConfirmer:
    """Confirms the settler's ACKs (`pipeline.delivery.AckWriter` and `AckConfirmation`); `start`
    subscribes to the answers."""

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
        # Answers handed over by nats-py's reader (no task wake-up per batch's answer); a callback
        # subscription where nats-py's internals changed.
        sub = await self._nc.subscribe(f"{self._prefix}.*")
        if direct(sub, self._answer):
            self._sub = sub
        else:
            await sub.unsubscribe()
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

    def owe(self, token: int, deliveries: Sequence[Any]) -> None:
        """A buffer whose last ACK asks with `token` was handed to the connection: await its answer."""
        if token:
            self.counts.batches += 1
            self._remember(token, self._batch(None, tuple(deliveries)))

    def reserve(self) -> str:
        """The reply subject for a batch whose framer writes the asking ACK itself (`ack_reply` of
        `wire.frame_batch_response`). One never owed is simply never awaited."""
        return self._reply(next(self._tokens))

    def owe_reply(self, reply: str, deliveries: Sequence[Any]) -> None:
        """The buffer whose last ACK carries `reply` (from `reserve`) was handed to the connection."""
        _, _, token = reply.rpartition(".")
        self.owe(int(token), deliveries)

    async def ack_many(self, reply_subjects: Sequence[str]) -> None:
        """ACK a batch in one write (after its replies, which were written just before), the last
        ACK asking for an answer; raises like `publish` (the settler logs it)."""
        if not reply_subjects:
            return
        self.counts.batches += 1
        token = next(self._tokens)
        self._remember(token, self._batch(reply_subjects, None))
        await self._send(reply_subjects, token)

    def snapshot(self) -> dict[str, int | float]:
        return {"timeout_s": self._timeout_s, "pending": len(self._pending), **vars(self.counts)}

    def _reply(self, token: int) -> str:
        return f"{self._prefix}.{token}"

    def _connection(self) -> int:
        """Which connection this is: nats-py counts a reconnect once the new server took CONNECT,
        before it replays its buffer and reports itself connected again."""
        return int(self._nc.stats["reconnects"])

    def _batch(self, subjects: Sequence[str] | None, deliveries: Sequence[Any] | None) -> _Batch:
        now = self._clock()
        due, deadline = now + self._timeout_s, now + self._ack_wait_s
        return _Batch(subjects, deliveries, self._connection(), due, deadline, self._timeout_s)

    def _remember(self, token: int, batch: _Batch) -> None:
        self._pending[token] = batch
        if len(self._pending) > MAX_PENDING_BATCHES:
            del self._pending[next(iter(self._pending))]
            self.counts.overflowed += 1
            _warn.warning("ACK confirmations overflowed; oldest batch left to ack_wait")

    async def _send(self, subjects: Sequence[str], token: int) -> None:
        reply = self._reply(token)
        if self._writer.framed:
            await self._writer.publish_framed(frame_confirmed_acks(subjects, reply), len(subjects), 4 * len(subjects))
            return
        for subject in subjects[:-1]:
            await self._nc.publish(subject, ACK)
        await self._nc.publish(subjects[-1], ACK, reply=reply)

    async def _on_answer(self, msg: Any) -> None:
        """`_answer` as a subscription callback (the fallback without direct delivery)."""
        self._answer(msg)

    def _answer(self, msg: Any) -> None:
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
        tick = min(self._timeout_s / 2, 0.5)
        while True:
            await asyncio.sleep(tick)
            if self._nc.is_connected:
                await self.resend_due()

    async def resend_due(self) -> None:
        """Re-ACK the batches whose answer is overdue (their wait doubles each time) when that is
        safe (module docstring); give up on those past their ack_wait or whose connection is gone."""
        now = self._clock()
        connection = self._connection()
        ready: list[tuple[int, _Batch]] = []
        for token, batch in [(t, b) for t, b in self._pending.items() if b.due <= now]:
            if now >= batch.deadline or batch.connection != connection:
                del self._pending[token]
                if batch.connection != connection:
                    self.counts.abandoned += 1
                else:
                    self.counts.expired += 1
                    _warn.warning("ACKs unconfirmed within ack_wait; redelivered", extra={"acks": len(batch)})
                continue
            ready.append((token, batch))
        if not ready or not await self._server_read_everything(connection):
            return  # not proven yet: the next round asks again
        for token, batch in ready:
            if self._pending.pop(token, None) is None:
                continue  # answered meanwhile
            batch.wait_s = min(batch.wait_s * 2, self._timeout_s * MAX_WAIT_TIMEOUTS)
            batch.due = self._clock() + batch.wait_s
            subjects = batch.ack_subjects()
            batch.subjects, batch.deliveries = subjects, None
            self.counts.resent += 1
            new_token = next(self._tokens)
            self._remember(new_token, batch)
            try:
                await self._send(subjects, new_token)
            except Exception as exc:  # disconnected again: its connection is gone, so it is abandoned
                log.debug("ACK re-send failed", extra={"error": repr(exc)})

    async def _server_read_everything(self, connection: int) -> bool:
        """Whether the server of `connection` has read all that was written to it: nothing left in
        the client's buffer (a PING would overtake it), then a PONG on that same connection. A
        client whose buffer cannot be seen (nats-py internals changed) proves nothing."""
        pending = getattr(self._nc, "_pending_data_size", None)
        if pending is None or pending:
            return False
        try:
            await self._nc.flush(timeout=max(1, round(self._timeout_s)))
        except Exception:  # a timeout or a lost connection: nothing is proven
            return False
        return self._nc.is_connected and self._connection() == connection


__all__ = [
    "CLOSE_WAIT_S",
    "MAX_PENDING_BATCHES",
    "MAX_WAIT_TIMEOUTS",
    "AckConfirmer",
    "ConfirmCounts",
    "ask_last_ack",
    "frame_confirmed_acks",
]
