# SPDX-License-Identifier: Apache-2.0
"""Reply publication (sidecar-behaviour §6): one plan per WorkResult, publish a whole batch, and
a flush before the ACKs only when the batch published ResultChunkV1 transfers (§6.2: "publish in
index order, then one client flush as broker barrier, then ACK").

Why single replies need no flush: the ACKs that follow are queued behind the replies on the same
connection, so the server never sees an ACK before its reply; if the connection drops, both are
lost together and JetStream redelivers. Delivery is at least once either way. (A flush would not
be a barrier anyway: nats-py 2.16 writes the flush PING straight to the transport, so it can
overtake PUBs still in the client's pending buffer.) Skipping it saves a PING/PONG round trip per
batch, which with the v0.7.1 count cap of 12 items was a third of nats-server's CPU.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from .. import wire
from ..errors import PayloadTooLarge
from ..logs import Throttled
from ..telemetry import (
    RESULT_CHUNK_SIZE,
    RESULT_CHUNKS_PUBLISHED,
    RESULT_TRANSPORT_ATTEMPTS,
    SIZE_BOUNDS_BYTES,
    Registry,
)
from ..telemetry.registry import Counter as RegistryCounter
from ..wire.types import Reply
from .outbound import FramedWriter

log = logging.getLogger(__name__)
#: Publish failures repeat per batch while NATS is away: rate-limited, with a count.
_warn = Throttled(log)

FLUSH_TIMEOUT_S = 10.0


class NatsPublisher(Protocol):
    """The slice of a nats-py client the publisher needs."""

    @property
    def max_payload(self) -> int: ...
    async def publish(self, subject: str, payload: bytes = b"") -> None: ...
    async def flush(self, timeout: int = ...) -> None: ...


@dataclass(slots=True)
class PublishStats:
    """Counters by transport mode and outcome (telemetry reads them)."""

    single: int = 0
    chunked: int = 0
    compact_error: int = 0
    rejected: int = 0
    publish_error: int = 0
    flush_error: int = 0
    chunks: int = 0


class Publisher:
    """Publishes WorkResults; `publish_batch` says, per reply, whether it is safe to ACK."""

    def __init__(
        self, nc: NatsPublisher, *, writer: FramedWriter | None = None, flush_timeout_s: float = FLUSH_TIMEOUT_S
    ) -> None:
        """`writer`: the connection's one framed writer (replies and ACKs share it, so their order on the
        connection is the order they were written); a new one over `nc` when not given."""
        self._nc = nc
        self._writer = writer if writer is not None else FramedWriter(nc)
        self._flush_timeout_s = flush_timeout_s
        self.stats = PublishStats()
        #: Where `sie.worker.result.transport.attempts` and `.result.chunks.published` are recorded
        #: (§13), once per published batch; None: not recorded.
        self.telemetry: Registry | None = None
        self._attempts: dict[tuple[str, str], tuple[Registry, RegistryCounter]] = {}

    def _record(self, mode: str, outcome: str, n: int) -> None:
        telemetry = self.telemetry
        if telemetry is not None and n:
            found = self._attempts.get((mode, outcome))
            if found is None or found[0] is not telemetry:  # once per series and registry, not per batch
                attrs = (("mode", mode), ("outcome", outcome))
                found = self._attempts[mode, outcome] = (telemetry, telemetry.counter(RESULT_TRANSPORT_ATTEMPTS, attrs))
            found[1].value += n

    @property
    def framed(self) -> bool:
        """Whether pre-framed batches (`publish_framed`) can be sent on this connection."""
        return self._writer.framed

    @property
    def max_payload(self) -> int:
        return self._nc.max_payload

    async def publish_raw(self, subject: str, payload: bytes) -> bool:
        """One message as it is (a generation chunk, §5.2), through the connection's one writer so it
        keeps its place before the ACK that follows; no flush. False when it could not be handed over."""
        try:
            await self._writer.publish_many([(subject, payload)])
        except Exception as exc:
            log.warning("raw publish failed", extra={"subject": subject, "error": repr(exc)})
            return False
        return True

    async def publish_framed(self, replies: wire.FramedReplies) -> bool:
        """Send a batch framed by `wire.frame_outcome_replies` (single replies only) in one write.

        True when every framed reply (and the ACKs framed after them, `acks`) was handed to the
        connection (items without a reply subject were never sent and are always safe to ACK). No
        flush: see the module docstring. With confirmed ACKs the framer wrote the last ACK asking for
        an answer (`ack_reply`).
        """
        if replies.messages == 0 and replies.acks == 0:
            return True
        try:
            await self._writer.publish_framed(
                replies.buffer,
                replies.messages + replies.acks,
                replies.payload_bytes + 4 * replies.acks,
            )
        except Exception as exc:  # nats-py raises its own and OS errors; either way: not published
            self.stats.publish_error += replies.messages
            _warn.warning("reply publish failed", extra={"replies": replies.messages, "error": repr(exc)})
            self._record("single", "publish_error", replies.messages)
            return False
        self.stats.single += replies.messages
        self._record("single", "published", replies.messages)
        return True

    async def _flush(self) -> bool:
        try:
            await self._nc.flush(timeout=max(1, round(self._flush_timeout_s)))
        except Exception as exc:  # a timeout or a lost connection: nothing is known to have arrived
            self.stats.flush_error += 1
            _warn.warning("flush after publish failed; replies stay un-ACKed", extra={"error": repr(exc)})
            return False
        return True

    async def publish_batch(self, replies: list[Reply]) -> list[bool]:
        """Publish every reply (and flush once if any went out as chunks); say which ones went out.

        An empty (or whitespace-only) reply subject is fire-and-forget: nothing is sent and the item
        counts as published. A reply that can not be planned, or whose publish fails, is False: the
        caller leaves that message un-ACKed so JetStream redelivers it.
        """
        ok = [False] * len(replies)
        max_payload = self._nc.max_payload
        queued: list[tuple[str, bytes]] = []
        planned: list[tuple[int, str, int]] = []  # (reply index, mode, messages) of what is in `queued`
        chunk_sizes: list[int] = []  # each chunk message's size (metrics on only)
        for i, reply in enumerate(replies):
            if not reply.subject.strip():
                ok[i] = True
                continue
            try:
                plan = wire.plan_reply(
                    reply.result, accepts_result_chunks=reply.accepts_result_chunks, max_payload=max_payload
                )
            except PayloadTooLarge as exc:
                self.stats.rejected += 1
                self._record("rejected", "planning_error", 1)
                log.warning(
                    "reply dropped: too large even as a compact error",
                    extra={"item": reply.result.work_item_id, "error": str(exc)},
                )
                continue
            queued.extend((reply.subject, message) for message in plan.messages)
            planned.append((i, plan.mode, len(plan.messages)))
            if plan.mode == "chunked" and self.telemetry is not None:
                chunk_sizes.extend(map(len, plan.messages))
        try:
            await self._writer.publish_many(queued)  # one framed write for the whole batch
        except Exception as exc:  # nats-py raises its own and OS errors; either way: not published
            self.stats.publish_error += len(planned)
            _warn.warning("reply publish failed", extra={"replies": len(planned), "error": repr(exc)})
            for mode, n in Counter(mode for _, mode, _ in planned).items():
                self._record(mode, "publish_error", n)
            return ok
        chunked = any(mode == "chunked" for _, mode, _ in planned)
        flushed = not chunked or await self._flush()
        if self.telemetry is not None:
            for mode, n in Counter(mode for _, mode, _ in planned).items():
                self._record(mode, "published" if flushed or mode != "chunked" else "flush_error", n)
            chunks = sum(messages for _, mode, messages in planned if mode == "chunked")
            if chunks and flushed:
                self.telemetry.add(RESULT_CHUNKS_PUBLISHED, chunks)
                self.telemetry.histogram(RESULT_CHUNK_SIZE, (), SIZE_BOUNDS_BYTES).record_many(chunk_sizes)
        for i, mode, messages in planned:
            ok[i] = True
            if mode == "single":
                self.stats.single += 1
            elif mode == "chunked":
                self.stats.chunked += 1
                self.stats.chunks += messages
            else:
                self.stats.compact_error += 1
        if not flushed:
            return [r.subject.strip() == "" for r in replies]
        return ok


__all__ = ["FLUSH_TIMEOUT_S", "NatsPublisher", "PublishStats", "Publisher", "Reply"]
