# SPDX-License-Identifier: Apache-2.0
"""The generation envelopes the sidecar itself writes (wire-protocol §5.2, §5.3).

Generation chunks are per stream, not per batch: one small map at a time, so plain msgpack is the
right tool here (the hot path's batch rules do not apply).

- `terminal_chunk`: the fixed eight-key error chunk published before any IPC (model loading, load
  failed, payload too large, invalid input), test vector TV-G1.
- `stamp_executed_hash`: a backend chunk with `executed_bundle_config_hash` appended as its last key
  (any earlier one removed), test vector TV-G2.
"""

from __future__ import annotations

from typing import Any

import msgpack

from ..errors import DecodeError

#: The `attempt_id` suffix of every sidecar-synthesized terminal chunk, whatever its code.
TERMINAL_ATTEMPT_SUFFIX = ":model-loading"
EXECUTED_HASH_KEY = "executed_bundle_config_hash"


def terminal_chunk(work_item_id: str, request_id: str, code: str, message: str) -> bytes:
    """`{kind, request_id, attempt_id, seq, text_delta, done, finish_reason, error{code, message}}`."""
    return bytes(
        msgpack.packb(
            {
                "kind": "chunk",
                "request_id": request_id,
                "attempt_id": work_item_id + TERMINAL_ATTEMPT_SUFFIX,
                "seq": 0,
                "text_delta": "",
                "done": True,
                "finish_reason": "error",
                "error": {"code": code, "message": message},
            },
            use_bin_type=True,
        )
    )


def stamp_executed_hash(payload: bytes, executed_hash: str) -> bytes:
    """The payload with the executed hash as its last key; unchanged bytes for an empty hash.
    `DecodeError` when the payload is not one msgpack map (the stream then fails, §5.2)."""
    if not executed_hash:
        return payload
    try:
        doc: Any = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise DecodeError(f"generation payload is not msgpack: {exc}") from None
    if not isinstance(doc, dict):
        raise DecodeError("generation payload is not a map")
    doc.pop(EXECUTED_HASH_KEY, None)
    doc[EXECUTED_HASH_KEY] = executed_hash
    return bytes(msgpack.packb(doc, use_bin_type=True))


#: The sidecar's WorkItem re-encoding for `work_item_msgpack` (wire-protocol §7.2): its v0.7.1
#: struct order, every optional written (nil when absent), unknown keys dropped.
SIDECAR_ORDER: tuple[tuple[str, Any], ...] = (
    ("work_item_id", ""),
    ("request_id", ""),
    ("item_index", 0),
    ("total_items", 0),
    ("operation", ""),
    ("model_id", ""),
    ("profile_id", ""),
    ("engine", ""),
    ("pool_name", ""),
    ("admission_pool", ""),
    ("machine_profile", ""),
    ("item", None),
    ("payload_ref", None),
    ("output_types", None),
    ("instruction", None),
    ("is_query", False),
    ("options", None),
    ("query_item", None),
    ("query_payload_ref", None),
    ("score_items", None),
    ("labels", None),
    ("output_schema", None),
    ("generate", None),
    ("routing_key", None),
    ("prompt_cache_key", None),
    ("bundle_config_hash", ""),
    ("router_id", ""),
    ("accepts_result_chunks", False),
    ("reply_subject", ""),
    ("traceparent", None),
    ("tracestate", None),
    ("timestamp", 0.0),
)
#: Newer than v0.7.1: written after `timestamp`, only when present.
SIDECAR_TRAILING = ("deadline", "fallback_reason", "numerical_admission_sha256")


def encode_sidecar_work_item(doc: dict[str, Any]) -> bytes:
    """`doc` (a decoded WorkItem map) in the sidecar's order; `None` values of the fields with a
    non-nil default take that default (`admission_pool` "" when empty)."""
    out: dict[str, Any] = {}
    for key, default in SIDECAR_ORDER:
        value = doc.get(key)
        out[key] = default if value is None else value
    for key in SIDECAR_TRAILING:
        if doc.get(key) is not None:
            out[key] = doc[key]
    return bytes(msgpack.packb(out, use_bin_type=True))


__all__ = [
    "EXECUTED_HASH_KEY",
    "SIDECAR_ORDER",
    "TERMINAL_ATTEMPT_SUFFIX",
    "encode_sidecar_work_item",
    "stamp_executed_hash",
    "terminal_chunk",
]
