# SPDX-License-Identifier: Apache-2.0
"""The local socket as a pipeline `Source` (sidecar-behaviour §11, §4.6): `publish_work` slots become
deliveries of the same pipeline NATS work goes through (intake, preparation, scheduler, IPC).

Each slot is a `SlotHandle`: ACK and progress are no-ops for the broker that is not there, a NAK is
the in-process retry of §11 (the slot is queued again after min(delay, 5 s), at most 3 times), and
the reply the pipeline publishes to the slot's private inbox is the slot's result.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final

from .. import wire
from ..errors import INFERENCE_ERROR, WorkItemError
from ..wire.types import Reply, WorkResult
from ..wire.workitem import decode_work_item

#: A NAKed slot is queued again after min(delay, this) (§11).
RETRY_CAP_S: Final = 5.0
MAX_RETRIES: Final = 3
#: Every slot's reply subject starts with this (a gateway-style inbox, so intake takes it as safe).
INBOX_PREFIX: Final = "_INBOX.local."
_ops = itertools.count(1)


def slot_error(request_id: str, index: int, code: str, message: str, *, worker_id: str) -> bytes:
    """An encoded WorkResult error for slot `index` of a local request (local work is worker-direct)."""
    result = WorkResult(
        work_item_id=f"{request_id}.{index}",
        request_id=request_id,
        item_index=index,
        success=False,
        error=message,
        error_code=code,
        worker_id=worker_id,
        worker_direct=True,
    )
    return bytes(wire.encode_work_result(result))


def new_token() -> str:
    """A fresh reply-subject prefix for one request: `_INBOX.local.{n}.` (slots append their index)."""
    return f"{INBOX_PREFIX}{next(_ops)}."


class LocalWork:
    """One `publish_work` request in the pipeline: a result per slot, in slot order, and a future
    that is done once every slot has its final result (or the request was abandoned)."""

    def __init__(self, slots: int, errors: Mapping[int, bytes], *, worker_id: str, token: str | None = None) -> None:
        """`errors`: the slots already answered (their encoded WorkResult), the rest to run; `token`:
        the reply-subject prefix its items were bound to (`new_token`)."""
        self.token = token if token is not None else new_token()
        self.results: list[bytes | None] = [None] * slots
        for slot, encoded in errors.items():
            self.results[slot] = encoded
        self._pending = slots - len(errors)
        self._worker_id = worker_id
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.abandoned = False
        #: The slot handles (for the ids of a synthesized error).
        self.handles: dict[int, SlotHandle] = {}
        if not self._pending:
            self.done.set_result(None)

    def reply_subject(self, slot: int) -> str:
        return f"{self.token}{slot}"

    def set_result(self, slot: int, encoded: bytes) -> None:
        """A slot's final WorkResult (already msgpack); only the first one counts."""
        if self.results[slot] is None:
            self.results[slot] = encoded
            self._pending -= 1
            if not self._pending and not self.done.done():
                self.done.set_result(None)

    def acked(self, slot: int) -> None:
        """The slot's delivery was ACKed: its result came first, or it was dropped without one."""
        handle = self.handles.get(slot)
        if self.results[slot] is None and handle is not None:
            message = "work item was dropped without an outcome"
            self.fail_slot(slot, handle.request_id, handle.index, message)

    def fail_slot(self, slot: int, request_id: str, index: int, message: str) -> None:
        """The slot ends with a typed `inference_error` result made here (§11)."""
        self.set_result(slot, slot_error(request_id, index, INFERENCE_ERROR, message, worker_id=self._worker_id))

    def abandon(self) -> None:
        """The caller stopped waiting (timeout, disconnect, shutdown): queued slots are skipped and
        late results are dropped."""
        self.abandoned = True

    def encoded_results(self) -> bytes:
        """The msgpack array of WorkResults in slot order: an array header and the encoded maps."""
        results = self.results
        n = len(results)
        head = (
            bytes([0x90 | n])
            if n < 16
            else b"\xdc" + n.to_bytes(2, "big")
            if n < 65536
            else b"\xdd" + n.to_bytes(4, "big")
        )
        return head + b"".join(r if r is not None else b"\xc0" for r in results)


class SlotHandle:
    """One slot's delivery (`pipeline.source.SettleHandle`)."""

    __slots__ = ("_source", "attempts", "data", "index", "item_id", "reply", "request_id", "slot", "subject", "work")

    def __init__(
        self, source: LocalSource, work: LocalWork, slot: int, *, subject: str, data: bytes, item_id: str, index: int
    ) -> None:
        self._source = source
        self.work = work
        self.slot = slot
        self.subject = subject
        self.data = data
        self.reply = work.reply_subject(slot)  # where its result goes, and the key of its batched ACK
        self.item_id = item_id
        self.index = index
        self.request_id = item_id.rsplit(".", 1)[0]
        self.attempts = 0
        work.handles[slot] = self

    async def ack(self) -> None:
        """Final for this delivery: the result published before it is the slot's; none is a drop."""
        self.work.acked(self.slot)

    async def nak(self, delay: int | float | None = None) -> None:
        """The in-process retry of §11: queued again after min(delay, 5 s), at most 3 times."""
        if self.work.results[self.slot] is not None or self.work.abandoned:
            return
        try:  # the rare path: intake NAKs an item it cannot decode, and a retry would not help
            decode_work_item(self.data)
        except WorkItemError as exc:
            self.work.fail_slot(self.slot, self.request_id, self.index, f"work item is not decodable: {exc}")
            return
        if self.attempts >= MAX_RETRIES:
            message = f"work item was retried {MAX_RETRIES} times without an outcome"
            self.work.fail_slot(self.slot, self.request_id, self.index, message)
            return
        again = SlotHandle(
            self._source,
            self.work,
            self.slot,
            subject=self.subject,
            data=self.data,
            item_id=self.item_id,
            index=self.index,
        )
        again.attempts = self.attempts + 1
        self._source.put_later([again], min(RETRY_CAP_S, max(0.0, float(delay or 0.0))))

    async def in_progress(self) -> None:
        """No broker lease to extend."""


class LocalSource:
    """A queue of slot handles with the pull consumer's capacity accounting and pause/resume (the
    pull gate pauses it while the backend cannot serve: queued slots wait, bounded by their
    request's timeout)."""

    def __init__(self, *, max_outstanding: int) -> None:
        self._queue: deque[SlotHandle] = deque()
        self._data = asyncio.Event()
        self._stopped = False
        self._paused: str | None = "handshake pending"
        self._max_outstanding = max(1, max_outstanding)
        self.unsettled = 0
        self._timers: set[asyncio.TimerHandle] = set()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def paused(self) -> str | None:
        return self._paused

    def put(self, handles: Sequence[SlotHandle]) -> None:
        self._queue.extend(handles)
        self._data.set()

    def put_later(self, handles: Sequence[SlotHandle], delay_s: float) -> None:
        if delay_s <= 0:
            self.put(handles)
            return
        timer: asyncio.TimerHandle | None = None

        def fire() -> None:
            if timer is not None:
                self._timers.discard(timer)
            if not self._stopped:
                self.put(handles)

        timer = asyncio.get_running_loop().call_later(delay_s, fire)
        self._timers.add(timer)

    def stop(self) -> None:
        self._stopped = True
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self._data.set()

    def pause(self, reason: str, *, return_delay_s: float = 0.0) -> None:
        self._paused = reason

    def resume(self) -> None:
        if self._paused is not None:
            self._paused = None
            self._data.set()

    def _ready(self) -> bool:
        while self._queue and self._queue[0].work.abandoned:
            self._queue.popleft()
        return bool(self._queue) and self._paused is None and self.unsettled < self._max_outstanding

    async def next_batch(
        self, max_messages: int, quantum_s: float, stop_early: Callable[[], bool] | None = None
    ) -> list[SlotHandle]:
        """Wait for a slot, then coalesce more for up to `quantum_s` (ended early by `stop_early`)."""
        while not self._ready():
            if self._stopped:
                return []
            self._data.clear()
            await self._data.wait()
        batch: list[SlotHandle] = []
        deadline = time.monotonic() + quantum_s
        while True:
            room = min(max_messages - len(batch), self._max_outstanding - self.unsettled)
            while room > 0 and self._queue:
                handle = self._queue.popleft()
                if handle.work.abandoned:
                    continue
                batch.append(handle)
                self.unsettled += 1
                room -= 1
            left = deadline - time.monotonic()
            if room <= 0 or left <= 0 or self._stopped or (stop_early is not None and stop_early()):
                return batch
            self._data.clear()
            try:
                async with asyncio.timeout(left):
                    await self._data.wait()
            except TimeoutError:
                pass

    def settled(self, n: int) -> None:
        self.unsettled = max(0, self.unsettled - n)
        self._data.set()

    def wake(self) -> None:
        self._data.set()


class LocalReplies:
    """The pipeline's reply sink in local mode: each reply goes to the slot its subject names, and
    generation chunks (`publish_raw`) to the stream registered for their subject.

    It takes the natively framed batches (`framed`): the `PUB` frames the wire core builds for NATS
    are split here back into (subject, WorkResult bytes), which costs a few slices per item instead
    of a WorkResult object and an encode per item on the general path."""

    framed = True
    #: Local results are not size-capped by NATS (§11); the response frame's 64 MiB limit still holds.
    max_payload = 1 << 40

    def __init__(self) -> None:
        self._work: dict[str, LocalWork] = {}
        self._streams: dict[str, Callable[[bytes], Awaitable[bool]]] = {}

    def register(self, work: LocalWork) -> None:
        self._work[work.token] = work

    def unregister(self, work: LocalWork) -> None:
        self._work.pop(work.token, None)

    def register_stream(self, subject: str, on_chunk: Callable[[bytes], Awaitable[bool]]) -> None:
        self._streams[subject] = on_chunk

    def unregister_stream(self, subject: str) -> None:
        self._streams.pop(subject, None)

    def _slot_of(self, subject: str) -> tuple[LocalWork, int] | None:
        """The waiting request and slot a reply subject names (`{token}{slot}`); None for a request no
        longer waiting, or a subject that names no slot of it."""
        token, _, slot = subject.rpartition(".")
        work = self._work.get(token + ".")
        if work is None or not slot.isdigit() or int(slot) >= len(work.results):
            return None
        return work, int(slot)

    def _deliver(self, subject: str, encoded: bytes) -> None:
        """A result for the slot `subject` names; one for a request no longer waiting is dropped."""
        found = self._slot_of(subject)
        if found is not None:
            found[0].set_result(found[1], encoded)

    async def publish_framed(self, replies: wire.FramedReplies) -> bool:
        """Split `PUB <subject> <size>\\r\\n<payload>\\r\\n` frames back into slot results."""
        buf = replies.buffer
        pos, end = 0, len(buf)
        deliver = self._deliver
        while pos < end:
            eol = buf.index(b"\r\n", pos)
            head = buf[pos:eol].split(b" ")
            start = eol + 2
            if head[0] == b"HPUB":  # headers, then the payload
                header_len, total = int(head[2]), int(head[3])
                payload = buf[start + header_len : start + total]
                pos = start + total + 2
            else:
                size = int(head[-1])
                payload = buf[start : start + size]
                pos = start + size + 2
            deliver(head[1].decode(), payload)
        return True

    async def publish_batch(self, replies: list[Reply]) -> list[bool]:
        for reply in replies:
            self._deliver(reply.subject, bytes(wire.encode_work_result(reply.result)))
        return [True] * len(replies)

    async def publish_raw(self, subject: str, payload: bytes) -> bool:
        on_chunk = self._streams.get(subject)
        return await on_chunk(payload) if on_chunk is not None else False

    async def ack_many(self, reply_subjects: Sequence[str]) -> None:
        """The batched ACK (`pipeline.delivery.AckWriter`): a slot ACKed without a result was dropped
        without an outcome (§11). A slot handle's `reply` is its reply subject."""
        for subject in reply_subjects:
            found = self._slot_of(subject)
            if found is not None:
                found[0].acked(found[1])


__all__ = [
    "INBOX_PREFIX",
    "MAX_RETRIES",
    "RETRY_CAP_S",
    "LocalReplies",
    "LocalSource",
    "LocalWork",
    "SlotHandle",
    "new_token",
]
