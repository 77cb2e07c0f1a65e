# SPDX-License-Identifier: Apache-2.0
"""Twin of the native WorkItem decoder (`_native.decode_work_item`, `wire.workitem`): the v0.7.1
sidecar's rules (TV-W1) walked as the native reader walks the map, and the span table the native
decoder records for the RunBatch writer (`work_item_spans`)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from ..errors import WorkItemError
from ..wire.workitem import JSON_SHAPED, MAX_DEPTH, REQUIRED, SPLICED_FIELDS, WorkItem, json_shape_error

IMPLEMENTATION = "py"

_SPAN_SLOT = {name: slot for slot, name in enumerate(SPLICED_FIELDS)}
_SPANS = struct.Struct(f"<{2 * len(SPLICED_FIELDS)}I")

_STR_FIELDS = ("work_item_id", "request_id", "operation", "model_id", "pool_name", "machine_profile", "reply_subject")
_OPT_STR_DEFAULT_EMPTY = ("profile_id", "engine", "admission_pool", "bundle_config_hash", "router_id")
_OPT_STR_NONE = ("payload_ref", "instruction", "query_payload_ref", "traceparent", "tracestate", "fallback_reason")


_MARKERS = {0xC0: "nil", 0xC1: "invalid", 0xC2: "bool", 0xC3: "bool", 0xCA: "float", 0xCB: "float"}
_MARKERS.update({0xC4: "bin", 0xC5: "bin", 0xC6: "bin"})


def _family(marker: int) -> str:
    """The msgpack family of a value starting with `marker` (the native reader's token kinds)."""
    if marker <= 0x7F or 0xCC <= marker <= 0xD3 or marker >= 0xE0:
        return "int"
    if marker <= 0x8F or marker in (0xDE, 0xDF):
        return "map"
    if marker <= 0x9F or marker in (0xDC, 0xDD):
        return "array"
    if marker <= 0xBF or 0xD9 <= marker <= 0xDB:
        return "str"
    return _MARKERS.get(marker, "ext")  # ext: 0xc7-0xc9 and 0xd4-0xd8


@dataclass(frozen=True, slots=True)
class _Kind:
    """How a known key's value is checked: the families taken (None: any value, decoded generically),
    the error for another one, and the field value made from a decoded one."""

    families: frozenset[str] | None
    message: str
    convert: Callable[[Any], Any] = lambda value: value


def _uint(value: int) -> int:
    if value < 0:
        raise ValueError
    return value


def _float(value: float | None) -> float:
    return 0.0 if value is None else float(value)


def _lenient_float(value: Any) -> float | None:
    """`deadline`: an int or float as a float; anything else (nil, a str, a bool...) is absent."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _kinds() -> dict[str, _Kind]:
    kinds = {key: _Kind(frozenset({"str"}), f"{key} must be a str") for key in _STR_FIELDS}
    for key in ("item_index", "total_items"):
        kinds[key] = _Kind(frozenset({"int"}), f"{key} must be an unsigned int", _uint)
    for key in _OPT_STR_DEFAULT_EMPTY:
        kinds[key] = _Kind(frozenset({"str", "nil"}), f"{key} must be a str", lambda value: value or "")
    for key in _OPT_STR_NONE:
        kinds[key] = _Kind(frozenset({"str", "nil"}), f"{key} must be a str or nil")
    for key in ("is_query", "accepts_result_chunks"):
        kinds[key] = _Kind(frozenset({"bool", "nil"}), f"{key} must be a bool", bool)
    kinds["timestamp"] = _Kind(frozenset({"int", "float", "nil"}), "timestamp must be a number", _float)
    for key in ("output_types", "labels", "score_items"):
        kinds[key] = _Kind(frozenset({"array", "nil"}), f"{key} must be an array or nil")
    kinds["options"] = _Kind(frozenset({"map", "nil"}), "options must be a map or nil")
    for key in ("item", "query_item", "output_schema"):
        kinds[key] = _Kind(None, "")
    kinds["deadline"] = _Kind(None, "", _lenient_float)
    return kinds


#: Every known key (all `WorkItem` fields but `raw` and `spans`) and how its value is checked.
_KINDS = _kinds()


def _check_depth(value: Any) -> None:
    """Refuse a decoded value nested deeper than the native reader takes (`MAX_DEPTH`)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise WorkItemError("not msgpack: msgpack nesting too deep")
        if isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
        elif isinstance(node, dict):
            stack.extend((child, depth + 1) for pair in node.items() for child in pair)


def _decoded(unpacker: Any) -> Any:
    value = unpacker.unpack()
    _check_depth(value)
    return value


def _family_at(buf: bytes, at: int) -> str:
    if at >= len(buf):
        raise WorkItemError("not msgpack: truncated")
    return _family(buf[at])


def _read_fields(buf: bytes) -> dict[str, Any]:
    """The known fields of the WorkItem map in `buf`, walked as the native decoder walks it.

    Each occurrence of a known key is checked (a repeated key keeps its last value, but an earlier
    bad one is refused), `options` and `output_schema` for their JSON shape too (`json_shape_error`);
    a value of the wrong family is refused undecoded (an ext value of any type code in a str field,
    say). An unknown key's value is decoded and dropped. A key that is not a str
    is skipped without being decoded (an ext key of any type code, a bad Timestamp included), its
    value decoded and dropped; an array or map key is refused. Trailing bytes are refused.
    """
    if _family_at(buf, 0) != "map":
        raise WorkItemError("WorkItem must be a map")
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(buf), 1))
    unpacker.feed(buf)
    fields: dict[str, Any] = {}
    for _ in range(unpacker.read_map_header()):
        family = _family_at(buf, unpacker.tell())
        if family in ("array", "map"):
            raise WorkItemError("not msgpack: unhashable map key")
        if family != "str":
            unpacker.skip()
            _decoded(unpacker)
            continue
        key = unpacker.unpack()
        kind = _KINDS.get(key)
        if kind is None:
            _decoded(unpacker)
            continue
        family = _family_at(buf, unpacker.tell())
        if kind.families is not None and family != "invalid" and family not in kind.families:
            raise WorkItemError(kind.message)
        value = _decoded(unpacker)
        if key in JSON_SHAPED and (shape_error := json_shape_error(key, value)) is not None:
            raise WorkItemError(shape_error)
        try:
            fields[key] = kind.convert(value)
        except ValueError:
            raise WorkItemError(kind.message) from None
    if unpacker.tell() != len(buf):
        raise WorkItemError(f"not msgpack: {len(buf) - unpacker.tell()} trailing bytes")
    return fields


def decode_work_item(data: bytes | memoryview, cls: type[Any] = WorkItem) -> Any:
    """Decode one WorkItem into a `cls` (the native decoder's argument; `WorkItem` by default);
    `WorkItemError` when it is not msgpack, not a map, or misses a key.

    The pure-Python twin of the native decoder (`sie_sidecar._native.decode_work_item`), with its
    rules (`_read_fields`): every occurrence of a known key type-checked, a key that is not a str
    skipped undecoded, values nested at most `MAX_DEPTH` deep. It leaves `raw` and `spans` None.
    """
    try:
        fields = _read_fields(bytes(data))
    except WorkItemError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise WorkItemError(f"not msgpack: {exc}") from None
    missing = [key for key in REQUIRED if key not in fields]
    if missing:
        raise WorkItemError(f"WorkItem is missing {', '.join(missing)}")
    return cls(**fields)


def work_item_spans(data: bytes) -> bytes:
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


__all__ = ["IMPLEMENTATION", "decode_work_item", "work_item_spans"]
