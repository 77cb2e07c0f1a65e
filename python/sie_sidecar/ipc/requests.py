# SPDX-License-Identifier: Apache-2.0
"""RunBatch and Process*Batch request bodies from WorkItems (wire-protocol §3.10, §4.1-4.3).

`run_batch_body` is what the dispatcher calls: the native one-pass writer (which splices each item's
values from its original payload), or `run_batch_body_py`, its spec and twin, with
`SIE_SIDECAR_NO_EXTENSIONS=1`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack

from ..wire._switch import USING_NATIVE, load
from ..wire.workitem import WorkItem

_batch_ids = itertools.count()

PER_OP_METHOD = {
    "encode": "ProcessEncodeBatch",
    "score": "ProcessScoreBatch",
    "extract": "ProcessExtractBatch",
}


def next_batch_id() -> int:
    """Process-wide monotonic batch id starting at 0 (log correlation only)."""
    return next(_batch_ids)


def lora_from_options(options: object) -> str:
    """The LoRA key `options` asks for (scheduler-and-prep §1.1); "" is the base weights.

    Only a non-empty string under `lora` names an adapter, byte for byte: absent or non-map options,
    a missing key, a non-string value and "" all mean base, so malformed clients cannot fragment the
    batchers of a model."""
    if not isinstance(options, Mapping):
        return ""
    lora = options.get("lora")
    return lora if isinstance(lora, str) else ""


def lora_key(item: WorkItem) -> str:
    """The LoRA adapter an encode/extract item asks for; score always runs on base weights."""
    if item.operation == "score" or not item.options:
        return ""
    return lora_from_options(item.options)


def _common(item: WorkItem) -> dict[str, Any]:
    return {
        "work_item_id": item.work_item_id,
        "request_id": item.request_id,
        "item_index": item.item_index,
        "total_items": item.total_items,
        "timestamp": float(item.timestamp),
    }


def encode_item(
    item: WorkItem, payload_fetch_ms: float = 0.0, prepared_tokens: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """EncodeBatchItem, every key written (nil for absent optionals), in the v0.7.1 order.

    One dict literal (not `_common` merged in): this runs for every encode item of every batch."""
    return {
        "work_item_id": item.work_item_id,
        "request_id": item.request_id,
        "item_index": item.item_index,
        "total_items": item.total_items,
        "timestamp": float(item.timestamp),
        "item": item.item,
        "output_types": item.output_types,
        "instruction": item.instruction,
        "is_query": item.is_query,
        "options": item.options,
        "profile_id": item.profile_id or None,
        "bundle_config_hash": item.bundle_config_hash or None,
        "payload_fetch_ms": float(payload_fetch_ms),
        "prepared_tokens": prepared_tokens,
    }


def score_item(item: WorkItem, payload_fetch_ms: float = 0.0) -> dict[str, Any]:
    """ScoreBatchItem; `bundle_config_hash` after `profile_id` is newer than v0.7.1 (wire-protocol
    §4.3: v0.7.1's had none)."""
    return {
        **_common(item),
        "query_item": item.query_item,
        "score_items": item.score_items if item.score_items is not None else [],
        "instruction": item.instruction,
        "options": item.options,
        "profile_id": item.profile_id or None,
        "bundle_config_hash": item.bundle_config_hash or None,
        "payload_fetch_ms": float(payload_fetch_ms),
        "prepared_tokens": None,
    }


def extract_item(
    item: WorkItem, payload_fetch_ms: float = 0.0, prepared_audio: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """ExtractBatchItem; `prepared_audio` is the PreparedAudioPcm16 the sidecar decoded (the item map
    it goes with no longer carries `audio`: audio preparation removed it)."""
    return {
        **_common(item),
        "item": item.item,
        "labels": item.labels,
        "output_schema": item.output_schema,
        "instruction": item.instruction,
        "options": item.options,
        "profile_id": item.profile_id or None,
        "bundle_config_hash": item.bundle_config_hash or None,
        "payload_fetch_ms": float(payload_fetch_ms),
        "prepared_audio": prepared_audio,
    }


_BUILDERS = {"encode": encode_item, "score": score_item, "extract": extract_item}


def _bodies(
    op: str,
    items: Sequence[WorkItem],
    payload_fetch_ms: Sequence[float] | None,
    prepared_tokens: Sequence[Mapping[str, Any] | None] | None,
    prepared_audio: Sequence[Mapping[str, Any] | None] | None = None,
) -> list[dict[str, Any]]:
    """The per-op item maps; encode items carry their PreparedTokens, extract items their
    PreparedAudioPcm16 (score items neither)."""
    fetch_ms = payload_fetch_ms if payload_fetch_ms is not None else [0.0] * len(items)
    if op == "encode" and prepared_tokens is not None:
        return [encode_item(i, ms, p) for i, ms, p in zip(items, fetch_ms, prepared_tokens, strict=True)]
    if op == "extract" and prepared_audio is not None:
        return [extract_item(i, ms, a) for i, ms, a in zip(items, fetch_ms, prepared_audio, strict=True)]
    build = _BUILDERS[op]
    return [build(i, ms) for i, ms in zip(items, fetch_ms, strict=True)]


def run_batch_body_py(
    model_id: str,
    op: str,
    items: Sequence[WorkItem],
    lora: str,
    total_cost: int,
    *,
    payload_fetch_ms: Sequence[float] | None = None,
    prepared_tokens: Sequence[Mapping[str, Any] | None] | None = None,
    prepared_audio: Sequence[Mapping[str, Any] | None] | None = None,
    batch_id: int | None = None,
    trace: tuple[str, str | None] | None = None,
) -> bytes:
    """An encoded RunBatchRequest: one op, one LoRA key, items wrapped as tagged RunBatchItems.

    The spec of the native writer (`_native.write_run_batch_body`); `batch_id` defaults to the next
    process-wide id. `trace` (traceparent, tracestate): the context every item carries instead of its
    own, the sidecar's span of a sampled batch (wire-protocol §4.2); None leaves each item's own."""
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
        for item, body in zip(items, _bodies(op, items, payload_fetch_ms, prepared_tokens, prepared_audio), strict=True)
    ]
    body = {
        "model_id": model_id,
        "batch_id": next_batch_id() if batch_id is None else batch_id,
        "lora_key": lora,
        "total_cost": total_cost,
        "items": wrapped,
        "accepts_batched_f16_multivectors": True,
    }
    return bytes(msgpack.packb(body, use_bin_type=True))


_core = load("requests")
#: The native one-pass writer (`_native.write_run_batch_body`); None with the twins, whose writer is
#: the spec, `run_batch_body_py`.
_native_writer: Callable[..., bytes] | None = _core.write_run_batch_body if USING_NATIVE else None
#: What a sampled batch's span links to, read from the items the RunBatch writer takes (`wire_item`)
#: without decoding them (`_native.item_traceparents`, or `_twins.requests`). Called only for sampled batches.
item_traceparents: Callable[[Sequence[WorkItem]], list[str | None]] = _core.item_traceparents


def run_batch_body(
    model_id: str,
    op: str,
    items: Sequence[WorkItem],
    lora: str,
    total_cost: int,
    *,
    payload_fetch_ms: Sequence[float] | None = None,
    prepared_tokens: Sequence[Mapping[str, Any] | None] | None = None,
    prepared_audio: Sequence[Mapping[str, Any] | None] | None = None,
    trace: tuple[str, str | None] | None = None,
) -> bytes:
    """An encoded RunBatchRequest (see `run_batch_body_py`), written natively when the core is loaded:
    ~10x cheaper per item, since values are spliced from each item's payload, not re-encoded."""
    if _native_writer is None:
        return run_batch_body_py(
            model_id,
            op,
            items,
            lora,
            total_cost,
            payload_fetch_ms=payload_fetch_ms,
            prepared_tokens=prepared_tokens,
            prepared_audio=prepared_audio,
            trace=trace,
        )
    if trace is None:  # the call of every untraced batch, exactly as before tracing
        return _native_writer(
            model_id, op, lora, total_cost, next_batch_id(), items, payload_fetch_ms, prepared_tokens, prepared_audio
        )
    return _native_writer(
        model_id,
        op,
        lora,
        total_cost,
        next_batch_id(),
        items,
        payload_fetch_ms,
        prepared_tokens,
        prepared_audio,
        trace,
    )


def per_op_body(
    model_id: str,
    op: str,
    items: Sequence[WorkItem],
    payload_fetch_ms: Sequence[float] | None = None,
    prepared_tokens: Sequence[Mapping[str, Any] | None] | None = None,
    *,
    prepared_audio: Sequence[Mapping[str, Any] | None] | None = None,
) -> bytes:
    """An encoded Process{Encode,Score,Extract}BatchRequest, for backends without RunBatch."""
    body: dict[str, Any] = {
        "model_id": model_id,
        "items": _bodies(op, items, payload_fetch_ms, prepared_tokens, prepared_audio),
    }
    if op == "encode":
        body["accepts_batched_f16_multivectors"] = True
    return bytes(msgpack.packb(body, use_bin_type=True))


__all__ = [
    "PER_OP_METHOD",
    "encode_item",
    "extract_item",
    "item_traceparents",
    "lora_from_options",
    "lora_key",
    "next_batch_id",
    "per_op_body",
    "run_batch_body",
    "run_batch_body_py",
    "score_item",
]
