# SPDX-License-Identifier: Apache-2.0
"""A whole batch of backend outcomes to one buffer of NATS `PUB` commands (twin of the native
`frame_outcome_replies`).

The common case of a batch, every outcome in delivery order and either framed by the backend or
an error, each reply under `max_payload`, is framed here in one call. Anything else returns
`None` and the dispatcher takes the general per-item path (`results.outcome_result` and
`plan_reply`), which produces the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...wire.result_fields import executed_hash, queue_ms
from ...wire.types import WorkResult
from .envelopes import ItemOutcome, decode_batch_outcome
from .results import encode_work_result


@dataclass(frozen=True, slots=True)
class FramedReplies:
    """The PUB commands of a batch, and per delivery whether one was written (1) or the reply
    subject was empty, so nothing was sent (0)."""

    buffer: bytes
    sent: bytes
    messages: int
    payload_bytes: int
    acks: int = 0
    #: The reply subject the last ACK carries (confirmed ACKs), when one was asked for and written.
    ack_reply: str | None = None


def _fetch_ms(delivery: Any) -> float | None:
    """§6.1: `payload_fetch_ms` only when a payload was fetched (> 0)."""
    ms = float(getattr(delivery, "payload_fetch_ms", 0.0))
    return ms if ms > 0 else None


def frame_outcome_replies(
    deliveries: Sequence[Any],
    outcomes: Sequence[Any],
    *,
    worker_id: str,
    current_hash: str | None,
    now: float,
    max_payload: int,
    acks: bool = False,
    ack_reply: str | None = None,
) -> FramedReplies | None:
    """Frame every reply, or `None` when the batch needs the general path. `deliveries` have
    `.item` (a WorkItem) and `.worker_direct` (and `.msg.reply`, the ACK subject, with `acks`);
    `now` is `time.time()` for `queue_ms`. With `acks`, every delivery's `+ACK` follows the
    replies in the same buffer."""
    if ack_reply is not None and not _subject_ok(ack_reply.encode()):
        raise ValueError(f"ack_reply {ack_reply!r} is not a valid reply subject")
    if len(outcomes) != len(deliveries):
        return None
    ack_subjects: list[bytes] = []
    if acks:
        for delivery in deliveries:
            subject = str(delivery.msg.reply).encode()
            if not _subject_ok(subject):
                return None  # the general path settles it one by one
            ack_subjects.append(subject)
    parts: list[bytes] = []
    sent = bytearray(len(deliveries))
    messages = payload_bytes = 0
    for i, (delivery, o) in enumerate(zip(deliveries, outcomes, strict=True)):
        item = delivery.item
        if not isinstance(o, ItemOutcome) or o.work_item_id != item.work_item_id or o.raw_output is not None:
            return None
        if o.disposition == "publish_and_ack" and o.result_msgpack:
            success = True
        elif o.disposition == "publish_error_and_ack":
            success = False
        else:
            return None
        if not item.reply_subject.strip():
            continue
        encoded = encode_work_result(
            WorkResult(
                work_item_id=item.work_item_id,
                request_id=item.request_id,
                item_index=item.item_index,
                success=success,
                result_msgpack=o.result_msgpack if success else b"",
                error=None if success else o.error,
                error_code=None if success else o.error_code,
                inference_ms=o.inference_ms,
                queue_ms=queue_ms(item, now),
                processing_ms=0.0,
                worker_id=worker_id,
                tokenization_ms=o.tokenization_ms,
                postprocessing_ms=o.postprocessing_ms,
                payload_fetch_ms=_fetch_ms(delivery),
                units=o.units,
                worker_direct=bool(delivery.worker_direct),
                executed_bundle_config_hash=executed_hash(item, current_hash),
                retry_after_s=o.retry_after_s,  # passed through unchanged (newer than v0.7.1)
            )
        )
        if len(encoded) > max_payload:
            return None
        parts += (b"PUB %s %d\r\n" % (item.reply_subject.encode(), len(encoded)), encoded, b"\r\n")
        sent[i] = 1
        messages += 1
        payload_bytes += len(encoded)
    reply = ack_reply if ack_subjects else None
    if reply is not None:  # the confirmed ACK, the last: `PUB <subject> <reply> 4`
        ack_subjects[-1] += b" " + reply.encode()
    for subject in ack_subjects:
        parts.append(b"PUB %s 4\r\n+ACK\r\n" % subject)
    return FramedReplies(b"".join(parts), bytes(sent), messages, payload_bytes, len(ack_subjects), reply)


def _subject_ok(subject: bytes) -> bool:
    """A subject that is one token of the protocol line: non-empty, no whitespace or control bytes."""
    return bool(subject) and not any(b <= 0x20 or b == 0x7F for b in subject)


@dataclass(frozen=True, slots=True)
class FramedResponse:
    """A RunBatch response framed into replies, and what the pipeline learns from it: the first
    outcome's `inference_ms`, per delivery whether it succeeded (1), the quantum samples
    (inference + postprocessing ms of each success that was sent) and every delivery's
    `request_id` in delivery order (what per-request latencies are keyed by)."""

    replies: FramedReplies
    inference_ms: float | None
    success: bytes
    totals: list[float]
    request_ids: list[str]


def frame_batch_response(
    response: bytes | memoryview,
    deliveries: Sequence[Any],
    *,
    worker_id: str,
    current_hash: str | None,
    now: float,
    max_payload: int,
    acks: bool = False,
    ack_reply: str | None = None,
) -> FramedResponse | None:
    """`frame_outcome_replies` over the decoded response, or `None` when the general path must
    decide (batched f16 multivectors, anything the framing refuses, or a response that does not
    decode: `decode_batch_outcome` then raises its own error)."""
    try:
        batch = decode_batch_outcome(response)
    except Exception:  # the general path decodes it again and reports the error
        return None
    if batch.batched_f16_multivectors:
        return None
    outcomes = list(batch.outcomes)
    replies = frame_outcome_replies(
        deliveries,
        outcomes,
        worker_id=worker_id,
        current_hash=current_hash,
        now=now,
        max_payload=max_payload,
        acks=acks,
        ack_reply=ack_reply,
    )
    if replies is None:
        return None
    success = bytes(int(o.disposition == "publish_and_ack") for o in outcomes)
    totals = [
        (o.inference_ms or 0.0) + (o.postprocessing_ms or 0.0)
        for o, ok, sent in zip(outcomes, success, replies.sent, strict=True)
        if ok and sent
    ]
    request_ids = [d.item.request_id for d in deliveries]
    return FramedResponse(replies, outcomes[0].inference_ms if outcomes else None, success, totals, request_ids)


__all__ = ["FramedReplies", "FramedResponse", "frame_batch_response", "frame_outcome_replies"]
