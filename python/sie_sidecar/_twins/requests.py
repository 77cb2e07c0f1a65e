# SPDX-License-Identifier: Apache-2.0
"""Twin of the native RunBatch writer (`ipc.requests`): `_native.write_run_batch_body`.

`write_run_batch_body` is the writer's spec (dicts + msgpack): it builds each item with the per-op
item builders of `wire.batch_items`, which the Process*Batch bodies share with or without the
extension; the native writer splices each item's values from its original payload instead."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from ..wire.batch_items import batch_items

IMPLEMENTATION = "py"


def write_run_batch_body(  # noqa: PLR0917 (the native writer's signature)
    model_id: str,
    op: str,
    lora: str,
    total_cost: int,
    batch_id: int,
    items: Sequence[Any],
    payload_fetch_ms: Sequence[float] | None = None,
    prepared_tokens: Sequence[Mapping[str, Any] | None] | None = None,
    prepared_audio: Sequence[Mapping[str, Any] | None] | None = None,
    trace: tuple[str, str | None] | None = None,
    *,
    room: bool = False,  # the native writer's room for the IPC envelope: the twin's body is bytes
) -> bytes:
    """An encoded RunBatchRequest: one op, one LoRA key, items wrapped as tagged RunBatchItems.

    `trace` (traceparent, tracestate): the context every item carries instead of its own, the
    sidecar's span of a sampled batch (wire-protocol §4.2); None leaves each item's own."""
    wrapped = [
        {
            "op": op,
            "work_item_id": item.work_item_id,
            "request_id": item.request_id,
            "item_index": item.item_index,
            "encode": body if op == "encode" else None,
            "score": body if op == "score" else None,
            "extract": body if op == "extract" else None,
            "traceparent": item.traceparent if trace is None else trace[0],
            "tracestate": item.tracestate if trace is None else trace[1],
        }
        for item, body in zip(
            items, batch_items(op, items, payload_fetch_ms, prepared_tokens, prepared_audio), strict=True
        )
    ]
    body = {
        "model_id": model_id,
        "batch_id": batch_id,
        "lora_key": lora,
        "total_cost": total_cost,
        "items": wrapped,
        "accepts_batched_f16_multivectors": True,
    }
    return bytes(msgpack.packb(body, use_bin_type=True))


__all__ = ["IMPLEMENTATION", "write_run_batch_body"]
