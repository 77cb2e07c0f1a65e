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
    #: Absolute Unix seconds after which nobody waits (newer than v0.7.1; None: absent). Lenient: a
    #: value that is not a number decodes as absent (wire-protocol §7.2, sidecar-behaviour §15.3).
    deadline: float | None = None
    #: A remote attempt standing in for a local refusal names that refusal (newer than v0.7.1): a
    #: backend `nak_retry` of such an item is answered as a refusal instead (wire-protocol §4.6).
    fallback_reason: str | None = None
    raw: bytes | None = field(default=None, init=False, repr=False, compare=False)
    spans: bytes | None = field(default=None, init=False, repr=False, compare=False)


_STR_FIELDS = ("work_item_id", "request_id", "operation", "model_id", "pool_name", "machine_profile", "reply_subject")
_OPT_STR_DEFAULT_EMPTY = ("profile_id", "engine", "admission_pool", "bundle_config_hash", "router_id")
_OPT_STR_NONE = ("payload_ref", "instruction", "query_payload_ref", "traceparent", "tracestate", "fallback_reason")


#: How deep a value inside the WorkItem map may nest (the native reader's `sie_core::msgpack::MAX_DEPTH`):
#: a value of the top-level map is at depth 0, an element of it at 1, and so on.
MAX_DEPTH = 128

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


#: Fields the Rust side decodes as JSON values (wire-protocol §0 rule 6): no bin, no ext inside.
JSON_SHAPED = ("options", "output_schema")


def json_shape_error(key: str, value: Any) -> str | None:
    """Why a decoded `options` / `output_schema` value is not JSON-shaped, or None when it is: the
    first bin or ext value (a Timestamp included) in document order, map keys included.

    The native decoder applies the same rule with the same messages (`json_shape_violation` in
    native/py/src/workitem.rs; native/py/src/lazy.rs leaves such an item to that decoder)."""
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, bytes | bytearray):
            return f"{key} must be JSON-shaped: binary values are not allowed"
        if isinstance(node, msgpack.ExtType | msgpack.Timestamp):
            return f"{key} must be JSON-shaped: ext values are not allowed"
        if isinstance(node, list):
            stack.extend(reversed(node))
        elif isinstance(node, dict):
            stack.extend(child for pair in reversed(node.items()) for child in reversed(pair))
    return None


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


def decode_work_item_py(data: bytes | memoryview) -> WorkItem:
    """Decode one WorkItem; `WorkItemError` when it is not msgpack, not a map, or misses a key.

    The pure-Python twin of the native decoder (`sie_sidecar._native.decode_work_item`), with its
    rules (`_read_fields`): every occurrence of a known key type-checked, a key that is not a str
    skipped undecoded, values nested at most `MAX_DEPTH` deep.
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
    "json_shape_error",
    "work_item_spans_py",
]
