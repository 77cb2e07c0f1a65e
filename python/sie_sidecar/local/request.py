# SPDX-License-Identifier: Apache-2.0
"""A local-ingest request body and the item rules of sidecar-behaviour §11.

Every body field is defaulted on decode and unknown fields are ignored; a field of the wrong type is
a `ValueError`. `check_items` applies the item rules to a `publish_work` or
`publish_generate_stream` body and gives back one decoded WorkItem map per slot, its reply subject
still to be bound by the caller.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from ..errors import InvalidTransportBinding
from .digest import DIGEST_SIZE, payload_digest

MAX_ITEMS: Final = 4096
MAX_REQUEST_ID_BYTES: Final = 128
#: Binary values under these keys of an item are media, bounded as §11 says.
MEDIA_LIMITS: Final = {"image": 16 * 1024 * 1024, "images": 16 * 1024 * 1024, "document": 16 * 1024 * 1024}
AUDIO_LIMIT: Final = 24 * 1024 * 1024
#: `publish_work` waits at most this long; 0 means this default (§11).
MAX_TIMEOUT_MS: Final = 300_000
#: Fields refused on encode and score (newer than v0.7.1).
_REFUSED_FIELDS: Final = ("numerical_admission_sha256", "fallback_reason")
_STR_FIELDS: Final = ("lane", "endpoint", "model", "engine", "admission_pool", "bundle_config_hash", "request_id")
_BIN_FIELDS: Final = ("params", "items", "dispatch_context", "payload_digest")
_TRACE_MAX: Final = 512


@dataclass(frozen=True, slots=True)
class Body:
    """The fields of a `publish_work` / `publish_generate_stream` body (§11)."""

    lane: str = ""
    endpoint: str = ""
    model: str = ""
    engine: str = ""
    admission_pool: str = ""
    bundle_config_hash: str = ""
    request_id: str = ""
    params: bytes = b""
    items: bytes = b""
    dispatch_context: bytes = b""
    payload_digest: bytes = b""
    timeout_ms: int = 0
    traceparent: str | None = None
    tracestate: str | None = None

    @classmethod
    def decode(cls, raw: dict[Any, Any]) -> Body:
        values: dict[str, Any] = {}
        for key in _STR_FIELDS:
            value = raw.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                raise ValueError(f"body field {key} must be a string")
            values[key] = value
        for key in _BIN_FIELDS:
            value = raw.get(key)
            if value is None:
                continue
            if not isinstance(value, bytes):
                raise ValueError(f"body field {key} must be binary")
            values[key] = value
        timeout = raw.get("timeout_ms")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int) or not -(2**63) <= timeout < 2**63:
                raise ValueError("body field timeout_ms must be an i64")
            values["timeout_ms"] = timeout
        for key in ("traceparent", "tracestate"):  # ignored when too long or not strings
            value = raw.get(key)
            if isinstance(value, str) and len(value.encode()) <= _TRACE_MAX:
                values[key] = value
        return cls(**values)

    @property
    def lane_pool(self) -> str:
        """The queue pool of the lane (`<pool>|<machine-profile>|<bundle>`), trimmed and lowercase."""
        return self.lane.split("|", 1)[0].strip().lower()

    def check_binding(self) -> None:
        """The dispatch context must be non-empty and the digest must bind the body (TV-L3)."""
        if not self.dispatch_context:
            raise InvalidTransportBinding("dispatch_context is empty")
        if len(self.payload_digest) != DIGEST_SIZE:
            raise InvalidTransportBinding(f"payload_digest must be {DIGEST_SIZE} bytes")
        expected = payload_digest(
            dispatch_context=self.dispatch_context,
            lane=self.lane,
            endpoint=self.endpoint,
            model=self.model,
            engine=self.engine,
            admission_pool=self.admission_pool,
            bundle_config_hash=self.bundle_config_hash,
            request_id=self.request_id,
            params=self.params,
            items=self.items,
            timeout_ms=self.timeout_ms,
        )
        if not hmac.compare_digest(expected, self.payload_digest):
            raise InvalidTransportBinding("payload_digest does not match the request")

    def publish_timeout_ms(self) -> int:
        """`publish_work`'s wait: 0..300000 ms, 0 meaning 300000 (§11)."""
        if not 0 <= self.timeout_ms <= MAX_TIMEOUT_MS:
            raise ValueError(f"timeout_ms must be 0..{MAX_TIMEOUT_MS}, got {self.timeout_ms}")
        return self.timeout_ms or MAX_TIMEOUT_MS


def _check_request_id(request_id: str) -> None:
    if not request_id:
        raise ValueError("request_id is empty")
    if len(request_id.encode()) > MAX_REQUEST_ID_BYTES:
        raise ValueError(f"request_id is over {MAX_REQUEST_ID_BYTES} bytes")
    if any(c.isspace() for c in request_id):
        raise ValueError("request_id contains whitespace")


def _check_media(value: Any, limit: int | None, where: str, depth: int = 0) -> None:
    """Binary values under a media key (or nested inside one) within its limit; the key of a nested
    map of another name keeps the enclosing limit."""
    if depth > 64:
        raise ValueError(f"{where}: nested too deeply")
    if isinstance(value, bytes):
        if limit is not None and len(value) > limit:
            raise ValueError(f"{where}: binary of {len(value)} bytes is over the limit of {limit} bytes")
    elif isinstance(value, dict):
        for key, inner in value.items():
            own = AUDIO_LIMIT if key == "audio" else MEDIA_LIMITS.get(key) if isinstance(key, str) else None
            _check_media(inner, own if own is not None else limit, where, depth + 1)
    elif isinstance(value, list):
        for inner in value:
            _check_media(inner, limit, where, depth + 1)


def check_items(body: Body) -> list[dict[str, Any]]:
    """The §11 item rules; the decoded WorkItem maps in slot order (`ValueError` names the rule)."""
    _check_request_id(body.request_id)
    try:
        items = msgpack.unpackb(body.items, raw=False, strict_map_key=False)
    except Exception as exc:
        raise ValueError(f"items are not msgpack: {exc}") from None
    if not isinstance(items, list):
        raise ValueError("items must be a msgpack array")
    count = len(items)
    if count == 0:
        raise ValueError("items is empty")
    if count > MAX_ITEMS:
        raise ValueError(f"{count} items is over the limit of {MAX_ITEMS}")
    seen: set[int] = set()
    for slot, item in enumerate(items):
        where = f"item {slot}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: not a map")
        if item.get("request_id") != body.request_id:
            raise ValueError(f"{where}: request_id differs from the request's")
        if item.get("total_items") != count:
            raise ValueError(f"{where}: total_items must be {count}")
        index = item.get("item_index")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise ValueError(f"{where}: item_index must be below {count}")
        if index in seen:
            raise ValueError(f"{where}: item_index {index} is repeated")
        seen.add(index)
        if item.get("work_item_id") != f"{body.request_id}.{index}":
            raise ValueError(f"{where}: work_item_id must be {body.request_id}.{index}")
        operation = item.get("operation")
        if operation == "load":
            raise ValueError(f"{where}: operation load is not accepted")
        if operation != body.endpoint:
            raise ValueError(f"{where}: operation differs from the endpoint")
        if item.get("model_id") != body.model:
            raise ValueError(f"{where}: model_id differs from the request's model")
        if (item.get("engine") or "") != body.engine:
            raise ValueError(f"{where}: engine differs from the request's")
        if (item.get("bundle_config_hash") or "") != body.bundle_config_hash:
            raise ValueError(f"{where}: bundle_config_hash differs from the request's")
        if item.get("payload_ref") or item.get("query_payload_ref"):
            raise ValueError(f"{where}: payload references are not accepted locally")
        if operation in ("encode", "score"):
            for key in _REFUSED_FIELDS:
                if key in item:
                    raise ValueError(f"{where}: {key} is not accepted on {operation}")
        for key in ("item", "query_item", "score_items"):
            _check_media(item.get(key), None, f"{where} {key}")
    return items


def admitted(body: Body, item: dict[str, Any]) -> bool:
    """The batch-meta pool and the item's pool agree and are empty or the lane's pool (§11)."""
    meta = body.admission_pool.strip().lower()
    own = item.get("admission_pool")
    own = own.strip().lower() if isinstance(own, str) else ""
    return meta == own and (not meta or meta == body.lane_pool)


__all__ = ["MAX_ITEMS", "MAX_TIMEOUT_MS", "Body", "admitted", "check_items"]
