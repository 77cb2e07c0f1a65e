# SPDX-License-Identifier: Apache-2.0
"""The batch items of the backend requests (wire-protocol §4.1-4.3): EncodeBatchItem, ScoreBatchItem
and ExtractBatchItem as maps, in one place for the Process*Batch bodies (`ipc.requests`, with or
without the extension) and the native RunBatch writer's twin and spec (`_twins.requests`).

Imports nothing at run time, so the twins can use it without an import cycle."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .workitem import WorkItem


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


def batch_items(
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


__all__ = ["batch_items", "encode_item", "extract_item", "score_item"]
