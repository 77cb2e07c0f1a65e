# SPDX-License-Identifier: Apache-2.0
"""The pure-Python twin of `_native.check_local_items` (sie-core `local_items`): the item rules of a
local-ingest request (sidecar-behaviour §11), the same checks in the same order with the same error
text, each item re-packed with its `reply_subject` set. Property tests hold the two to each other."""

from __future__ import annotations

from typing import Any, Final

import msgpack

MAX_ITEMS: Final = 4096
MEDIA_LIMIT: Final = 16 * 1024 * 1024
AUDIO_LIMIT: Final = 24 * 1024 * 1024
MAX_MEDIA_DEPTH: Final = 64
_MEDIA_LIMITS: Final = {"image": MEDIA_LIMIT, "images": MEDIA_LIMIT, "document": MEDIA_LIMIT, "audio": AUDIO_LIMIT}
_STR_FIELDS: Final = frozenset(
    {"request_id", "work_item_id", "operation", "model_id", "engine", "bundle_config_hash", "admission_pool"}
)


def _type_name(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, bytes):
        return "bin"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "map"
    return "ext"


def _str_or_nil(value: Any, where: str, key: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise ValueError(f"{where}: {key} must be a str, got {_type_name(value)}")


def _uint(value: Any, where: str, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"{where}: {key} must be an unsigned int, got {_type_name(value)}")


def _media(value: Any, limit: int | None, where: str, depth: int) -> None:
    if depth > MAX_MEDIA_DEPTH:
        raise ValueError(f"{where}: nested too deeply")
    if isinstance(value, bytes):
        if limit is not None and len(value) > limit:
            raise ValueError(f"{where}: binary of {len(value)} bytes is over the limit of {limit} bytes")
    elif isinstance(value, list):
        for inner in value:
            _media(inner, limit, where, depth + 1)
    elif isinstance(value, dict):
        for key, inner in value.items():
            own = _MEDIA_LIMITS.get(key) if isinstance(key, str) else None
            _media(inner, own if own is not None else limit, where, depth + 1)


class _Items:
    """The array's elements one by one as byte slices (C skip), in step with the checks, so that a
    malformed element is reported where the native reader meets it."""

    def __init__(self, items: bytes) -> None:
        self._items = items
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(items), 1))
        self._unpacker.feed(items)
        try:
            self.count = self._unpacker.read_array_header()
        except Exception as exc:
            raise ValueError(f"items must be a msgpack array ({exc})") from None
        self._start = self._unpacker.tell()

    def next(self) -> bytes:
        try:
            self._unpacker.skip()
        except Exception as exc:
            raise ValueError(f"items are not msgpack: {exc}") from None
        end = self._unpacker.tell()
        raw = self._items[self._start : end]
        self._start = end
        return raw

    def finish(self) -> None:
        if self._start != len(self._items):
            raise ValueError("items have trailing bytes after the array")


def check_local_items(
    items: bytes,
    *,
    request_id: str,
    endpoint: str,
    model: str,
    engine: str,
    bundle_config_hash: str,
    admission_pool: str,
    lane_pool: str,
    reply_prefix: str,
    numbered: bool = True,
) -> tuple[list[bytes], list[int], list[bool]]:
    """`(datas, indexes, admitted)` per slot, or `ValueError` naming the first rule broken; each item's
    `reply_subject` becomes `{reply_prefix}{slot}` (`reply_prefix` alone when not `numbered`)."""
    rid = request_id
    if not rid:
        raise ValueError("request_id is empty")
    if len(rid.encode()) > 128:
        raise ValueError("request_id is over 128 bytes")
    if any(c.isspace() for c in rid):
        raise ValueError("request_id contains whitespace")
    elements = _Items(items)
    count = elements.count
    if count > MAX_ITEMS:
        raise ValueError(f"{count} items is over the limit of {MAX_ITEMS}")
    if count == 0:
        elements.finish()
        raise ValueError("items is empty")
    seen: set[int] = set()
    datas: list[bytes] = []
    indexes: list[int] = []
    admitted: list[bool] = []
    for slot in range(count):
        raw = elements.next()
        where = f"item {slot}"
        try:
            doc = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as exc:
            raise ValueError(f"items are not msgpack: {exc}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"{where}: not a map (got {_type_name(doc)})")
        fields: dict[str, Any] = {}
        refused: str | None = None
        has = set()
        for key, value in doc.items():
            if not isinstance(key, str):
                raise ValueError(f"{where}: map key must be a str, got {_type_name(key)}")
            if key in _STR_FIELDS or key in ("pool_name", "machine_profile", "reply_subject"):
                fields[key] = _str_or_nil(value, where, key)
                has.add(key)
            elif key in ("total_items", "item_index"):
                fields[key] = _uint(value, where, key)
            elif key in ("payload_ref", "query_payload_ref"):
                if _str_or_nil(value, where, key):
                    raise ValueError(f"{where}: payload references are not accepted locally")
            elif key in ("item", "query_item", "score_items"):
                _media(value, None, f"{where} {key}", 0)
            elif key in ("numerical_admission_sha256", "fallback_reason") and refused is None:
                refused = key
        if fields.get("request_id") != rid:
            raise ValueError(f"{where}: request_id differs from the request's")
        if fields.get("total_items") != count:
            raise ValueError(f"{where}: total_items must be {count}")
        index = fields.get("item_index")
        if index is None or index >= count:
            raise ValueError(f"{where}: item_index must be below {count}")
        if index in seen:
            raise ValueError(f"{where}: item_index {index} is repeated")
        seen.add(index)
        if fields.get("work_item_id") != f"{rid}.{index}":
            raise ValueError(f"{where}: work_item_id must be {rid}.{index}")
        operation = fields.get("operation", "")
        if operation == "load":
            raise ValueError(f"{where}: operation load is not accepted")
        if operation != endpoint:
            raise ValueError(f"{where}: operation differs from the endpoint")
        if fields.get("model_id") != model:
            raise ValueError(f"{where}: model_id differs from the request's model")
        if fields.get("engine", "") != engine:
            raise ValueError(f"{where}: engine differs from the request's")
        if fields.get("bundle_config_hash", "") != bundle_config_hash:
            raise ValueError(f"{where}: bundle_config_hash differs from the request's")
        if refused is not None and operation in ("encode", "score"):
            raise ValueError(f"{where}: {refused} is not accepted on {operation}")
        if "pool_name" not in has or "machine_profile" not in has:
            missing = "machine_profile" if "pool_name" in has else "pool_name"
            raise ValueError(f"{where}: missing required field {missing}")
        own = fields.get("admission_pool", "").strip().lower()
        doc["reply_subject"] = f"{reply_prefix}{slot}" if numbered else reply_prefix
        datas.append(bytes(msgpack.packb(doc, use_bin_type=True)))
        indexes.append(index)
        admitted.append(admission_pool == own and (not admission_pool or admission_pool == lane_pool))
    elements.finish()
    return datas, indexes, admitted


__all__ = ["MAX_ITEMS", "check_local_items"]
