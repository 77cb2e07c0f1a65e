# SPDX-License-Identifier: Apache-2.0
"""The NATS WorkItem (wire-protocol §7.2): decoding with the v0.7.1 sidecar's rules (TV-W1)."""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import WorkItemError

OPERATIONS = ("encode", "score", "extract", "generate")
REQUIRED = (
    "work_item_id",
    "request_id",
    "item_index",
    "total_items",
    "operation",
    "model_id",
    "pool_name",
    "machine_profile",
    "reply_subject",
)
#: The fields whose encoded values a RunBatch body splices from `WorkItem.raw`, in `spans` order.
SPLICED_FIELDS = (
    "item",
    "output_types",
    "instruction",
    "options",
    "query_item",
    "score_items",
    "labels",
    "output_schema",
    "traceparent",
    "tracestate",
)
_SPAN_SLOT = {name: slot for slot, name in enumerate(SPLICED_FIELDS)}
_SPANS = struct.Struct(f"<{2 * len(SPLICED_FIELDS)}I")


@dataclass(slots=True)
class WorkItem:
    """The fields the runtime reads.

    The native decoder also keeps the payload (`raw`) and where the `SPLICED_FIELDS` values lie in it
    (`spans`, see `work_item_spans_py`), so the RunBatch writer copies those values as bytes instead
    of re-encoding them. They describe the item *as decoded*: code that changes a spliced field in
    place must set `raw = None` (the writer then encodes the attributes). `dataclasses.replace`
    drops them by itself (they are not `__init__` fields). The twin decoder leaves them None.
    """

    work_item_id: str
    request_id: str
    item_index: int
    total_items: int
    operation: str
    model_id: str
    pool_name: str
    machine_profile: str
    reply_subject: str
    profile_id: str = ""
    engine: str = ""
    admission_pool: str = ""
    item: Any = None
    payload_ref: str | None = None
    output_types: list[str] | None = None
    instruction: str | None = None
    is_query: bool = False
    options: dict[str, Any] | None = None
    query_item: Any = None
    query_payload_ref: str | None = None
    score_items: list[Any] | None = None
    labels: list[str] | None = None
    output_schema: Any = None
    bundle_config_hash: str = ""
    router_id: str = ""
    timestamp: float = 0.0
    accepts_result_chunks: bool = False
    traceparent: str | None = None
    tracestate: str | None = None
    raw: bytes | None = field(default=None, init=False, repr=False, compare=False)
    spans: bytes | None = field(default=None, init=False, repr=False, compare=False)


_STR_FIELDS = ("work_item_id", "request_id", "operation", "model_id", "pool_name", "machine_profile", "reply_subject")
_OPT_STR_DEFAULT_EMPTY = ("profile_id", "engine", "admission_pool", "bundle_config_hash", "router_id")
_OPT_STR_NONE = ("payload_ref", "instruction", "query_payload_ref", "traceparent", "tracestate")


def _uint(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise WorkItemError(f"{key} must be an unsigned int")
    return value


def decode_work_item_py(data: bytes | memoryview) -> WorkItem:
    """Decode one WorkItem; `WorkItemError` when it is not msgpack, not a map, or misses a key.

    The pure-Python twin of the native decoder (`sie_sidecar._native.decode_work_item`).
    """
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise WorkItemError(f"not msgpack: {exc}") from None
    if not isinstance(raw, dict):
        raise WorkItemError("WorkItem must be a map")
    missing = [key for key in REQUIRED if key not in raw]
    if missing:
        raise WorkItemError(f"WorkItem is missing {', '.join(missing)}")
    for key in _STR_FIELDS:
        if not isinstance(raw[key], str):
            raise WorkItemError(f"{key} must be a str")
    fields: dict[str, Any] = {key: raw[key] for key in _STR_FIELDS}
    fields["item_index"] = _uint(raw["item_index"], "item_index")
    fields["total_items"] = _uint(raw["total_items"], "total_items")
    for key in _OPT_STR_DEFAULT_EMPTY:
        value = raw.get(key)
        if value is not None and not isinstance(value, str):
            raise WorkItemError(f"{key} must be a str")
        fields[key] = value or ""
    for key in _OPT_STR_NONE:
        value = raw.get(key)
        if value is not None and not isinstance(value, str):
            raise WorkItemError(f"{key} must be a str or nil")
        fields[key] = value
    for key in ("is_query", "accepts_result_chunks"):
        value = raw.get(key, False)
        if value is None:
            value = False
        if not isinstance(value, bool):
            raise WorkItemError(f"{key} must be a bool")
        fields[key] = value
    timestamp = raw.get("timestamp", 0.0)
    if timestamp is None:
        timestamp = 0.0
    if isinstance(timestamp, bool) or not isinstance(timestamp, int | float):
        raise WorkItemError("timestamp must be a number")
    fields["timestamp"] = float(timestamp)
    for key in ("output_types", "labels", "score_items"):
        value = raw.get(key)
        if value is not None and not isinstance(value, list):
            raise WorkItemError(f"{key} must be an array or nil")
        fields[key] = value
    options = raw.get("options")
    if options is not None and not isinstance(options, dict):
        raise WorkItemError("options must be a map or nil")
    fields["options"] = options
    for key in ("item", "query_item", "output_schema"):
        fields[key] = raw.get(key)
    return WorkItem(**fields)


def work_item_spans_py(data: bytes) -> bytes:
    """The span table the native decoder stores in `WorkItem.spans`, for a payload it accepts: per
    `SPLICED_FIELDS` entry, the little-endian u32 offset and length of its value in `data` (0, 0 when
    the key is absent; the last one when it repeats). The twin of the native span recording."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    spans = [0] * (2 * len(SPLICED_FIELDS))
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        start = unpacker.tell()
        unpacker.skip()
        slot = _SPAN_SLOT.get(key) if isinstance(key, str) else None
        if slot is not None:
            spans[2 * slot], spans[2 * slot + 1] = start, unpacker.tell() - start
    return _SPANS.pack(*spans)


def _select_decoder() -> Callable[[bytes | memoryview], WorkItem]:
    """The native one-pass decoder unless the pure-Python twin was asked for."""
    from ._switch import USING_NATIVE

    if not USING_NATIVE:
        return decode_work_item_py
    from .._native import decode_work_item as native

    return functools.partial(native, cls=WorkItem)


#: Decode one WorkItem (native one-pass decoder, or the twin with SIE_SIDECAR_NO_EXTENSIONS=1).
decode_work_item: Callable[[bytes | memoryview], WorkItem] = _select_decoder()

__all__ = [
    "OPERATIONS",
    "REQUIRED",
    "SPLICED_FIELDS",
    "WorkItem",
    "WorkItemError",
    "decode_work_item",
    "decode_work_item_py",
    "work_item_spans_py",
]
