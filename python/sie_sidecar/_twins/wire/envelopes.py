# SPDX-License-Identifier: Apache-2.0
"""IPC request/response envelopes and BatchOutcome decoding (wire-protocol §2, §4.5-§4.7, §6.2).

Pure-Python twin of the native decoders. Every failure is a typed `DecodeError`; no msgpack,
`ValueError`, `TypeError` or `KeyError` escapes. Bulky fields (`ResponseEnvelope.body`,
`IpcResponseChunk.payload`) are views into the caller's frame rather than copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from ...errors import DecodeError, FrameTooLarge, IpcServerError, ProtocolError, WireError
from ...wire.limits import DIGEST_LEN, DISPOSITIONS, IPC_CHUNK_KIND, IPC_VERSION, MAX_FRAME, NEWER_UNIT_KEYS, UNIT_KEYS

if TYPE_CHECKING:
    from typing_extensions import Buffer


@dataclass(frozen=True, slots=True)
class ResponseEnvelope:
    """An ordinary response; `body` is the raw msgpack of the body map (a view into the frame)."""

    version: int
    request_id: str
    ok: bool
    body: memoryview | None
    error: str | None


@dataclass(frozen=True, slots=True)
class IpcResponseChunk:
    """One IpcResponseChunkV1 frame; `payload` is a view into the frame, `frame_len` its size."""

    version: int
    request_id: str
    transfer_digest: bytes
    chunk_index: int
    chunk_count: int
    total_bytes: int
    payload: memoryview
    frame_len: int


@dataclass(frozen=True, slots=True)
class ItemOutcome:
    """The backend's verdict on one work item (wire-protocol §4.6)."""

    work_item_id: str
    request_id: str
    item_index: int
    disposition: str
    nak_delay_ms: int | None
    result_msgpack: bytes
    error: str | None
    error_code: str | None
    inference_ms: float | None
    tokenization_ms: float | None
    postprocessing_ms: float | None
    raw_output: dict[str, Any] | None
    units: dict[str, int | None] | None
    retry_after_s: int | None


@dataclass(frozen=True, slots=True)
class BatchedF16Multivector:
    """A shared float16 buffer sliced into per-item multivectors by the publisher (§4.7)."""

    values_f16: bytes
    items: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """The response body of every batch method (§4.5)."""

    outcomes: list[ItemOutcome]
    batched_f16_multivectors: list[BatchedF16Multivector]


# --------------------------------------------------------------------------------------------
# msgpack helpers


def _flat(data: Buffer) -> memoryview:
    """A flat unsigned-byte view of any C-contiguous buffer."""
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _str_header(n: int) -> bytes:
    """The msgpack str-family header for an n-byte utf-8 string (shortest form)."""
    if n < 32:
        return bytes((0xA0 | n,))
    if n < 0x100:
        return bytes((0xD9, n))
    if n < 0x10000:
        return b"\xda" + n.to_bytes(2, "big")
    return b"\xdb" + n.to_bytes(4, "big")


def _pack_str(value: str) -> bytes:
    raw = value.encode("utf-8")
    return _str_header(len(raw)) + raw


# Pre-encoded envelope keys, in spec order (§2.1).
_VERSION_KEY = _pack_str("version") + b"\x01"
_METHOD_KEY = _pack_str("method")
_REQUEST_ID_KEY = _pack_str("request_id")
_ACCEPTS_KEY = _pack_str("accepts_ipc_response_chunks_v1")
_BODY_KEY = _pack_str("body")


def _is_uint(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _unpacker(view: memoryview) -> Any:
    # surrogateescape: a key that is not UTF-8 is an unknown key, skipped as the native decoder skips
    # it; the string fields that are read are checked (`_utf8`).
    unpacker = msgpack.Unpacker(
        raw=False, strict_map_key=False, unicode_errors="surrogateescape", max_buffer_size=max(len(view), 1)
    )
    unpacker.feed(view)
    return unpacker


def _bin_span(view: memoryview, start: int, end: int, what: str) -> memoryview:
    """The content of a msgpack bin value occupying view[start:end], without copying it."""
    marker = view[start]
    header = {0xC4: 2, 0xC5: 3, 0xC6: 5}.get(marker)
    if header is None:
        raise DecodeError(f"{what} must be bin")
    return view[start + header : end]


_MAP_MARKERS = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}


def encode_request(method: str, request_id: str, body: Buffer, accepts_chunks: bool = True) -> bytes:
    """Build a whole request frame with the keys in spec order and `body` spliced in verbatim."""
    body_view = _flat(body)
    parts = (
        b"\x85",
        _VERSION_KEY,
        _METHOD_KEY,
        _pack_str(method),
        _REQUEST_ID_KEY,
        _pack_str(request_id),
        _ACCEPTS_KEY,
        b"\xc3" if accepts_chunks else b"\xc2",
        _BODY_KEY,
    )
    size = sum(len(p) for p in parts) + len(body_view)
    if size > MAX_FRAME:
        raise FrameTooLarge(f"IPC request of {size} bytes exceeds the limit of {MAX_FRAME} bytes")
    return b"".join((size.to_bytes(4, "big"), *parts, body_view))


# Keys of an envelope or chunk that are decoded; every other key is skipped unread.
_DECODED_KEYS = frozenset(
    {"version", "request_id", "ok", "error", "kind", "transfer_digest", "chunk_index", "chunk_count", "total_bytes"}
)


def _top_map(
    view: memoryview, decoded: frozenset[str], spanned: frozenset[str], what: str
) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    """One walk of a top-level map, as the native decoders walk it: string keys only (a key that is
    not UTF-8 is an unknown one), `decoded` keys unpacked, `spanned` keys' values located (not
    decoded), everything else skipped unread; trailing bytes are an error."""
    fields: dict[str, Any] = {}
    spans: dict[str, tuple[int, int]] = {}
    try:
        unpacker = _unpacker(view)
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if not isinstance(key, str):
                raise DecodeError(f"map key must be a str, got {type(key).__name__}")
            if key in spanned:
                start = unpacker.tell()
                unpacker.skip()
                spans[key] = (start, unpacker.tell())
            elif key in decoded:
                fields[key] = unpacker.unpack()
            else:
                unpacker.skip()
        end = unpacker.tell()
    except WireError:
        raise
    except Exception as exc:
        raise DecodeError(f"{what} is not a valid msgpack map: {exc}") from None
    if end != len(view):
        raise DecodeError(f"{what} has {len(view) - end} trailing bytes")
    return fields, spans


_SPANNED_KEYS = frozenset({"body", "payload"})


def decode_response(frame: Buffer) -> ResponseEnvelope | IpcResponseChunk:
    """Classify and decode one response frame body (by `kind`, independent of key order)."""
    view = _flat(frame).toreadonly()
    fields, spans = _top_map(view, _DECODED_KEYS, _SPANNED_KEYS, "response frame")
    if fields.get("kind") == IPC_CHUNK_KIND:
        return _decode_chunk(view, fields, spans)
    return _decode_envelope(view, fields, spans)


def _require(fields: dict[str, Any], key: str, what: str) -> Any:
    if key not in fields:
        raise DecodeError(f"{what} is missing required key {key!r}")
    return fields[key]


def _require_uint(fields: dict[str, Any], key: str, what: str) -> int:
    value = _require(fields, key, what)
    if not _is_uint(value):
        raise DecodeError(f"{what} {key!r} must be an unsigned integer")
    return int(value)


def _require_str(fields: dict[str, Any], key: str, what: str) -> str:
    value = _require(fields, key, what)
    if not isinstance(value, str):
        raise DecodeError(f"{what} {key!r} must be a string")
    return _utf8(value, key)


def _utf8(value: str, key: str) -> str:
    """A string field as read (surrogate escapes: its bytes were not UTF-8, which the native decoder refuses)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise DecodeError(f"{key} is not valid UTF-8") from None
    return value


def _decode_envelope(view: memoryview, fields: dict[str, Any], spans: dict[str, tuple[int, int]]) -> ResponseEnvelope:
    what = "response envelope"
    version = _require_uint(fields, "version", what)
    request_id = _require_str(fields, "request_id", what)
    ok = _require(fields, "ok", what)
    if not isinstance(ok, bool):
        raise DecodeError("response envelope 'ok' must be a bool")
    body: memoryview | None = None
    if "body" in spans:
        start, end = spans["body"]
        marker = view[start]
        if marker in _MAP_MARKERS:
            body = view[start:end]
        elif marker != 0xC0:
            raise DecodeError("response envelope 'body' must be a map or nil")
    error = fields.get("error")
    if error is not None and not isinstance(error, str):
        raise DecodeError("response envelope 'error' must be a string or nil")
    if error is not None:
        _utf8(error, "error")
    return ResponseEnvelope(version=version, request_id=request_id, ok=ok, body=body, error=error)


def _decode_chunk(view: memoryview, fields: dict[str, Any], spans: dict[str, tuple[int, int]]) -> IpcResponseChunk:
    what = "ipc_response_chunk_v1 frame"
    version = _require_uint(fields, "version", what)
    request_id = _require_str(fields, "request_id", what)
    digest = _require(fields, "transfer_digest", what)
    if not isinstance(digest, bytes):
        raise DecodeError(f"{what} 'transfer_digest' must be bin")
    if len(digest) != DIGEST_LEN:
        raise DecodeError(f"{what} 'transfer_digest' must be exactly {DIGEST_LEN} bytes, got {len(digest)}")
    chunk_index = _require_uint(fields, "chunk_index", what)
    chunk_count = _require_uint(fields, "chunk_count", what)
    total_bytes = _require_uint(fields, "total_bytes", what)
    if "payload" not in spans:
        raise DecodeError(f"{what} is missing required key 'payload'")
    payload = _bin_span(view, *spans["payload"], what=f"{what} 'payload'")
    return IpcResponseChunk(
        version=version,
        request_id=request_id,
        transfer_digest=digest,
        chunk_index=chunk_index,
        chunk_count=chunk_count,
        total_bytes=total_bytes,
        payload=payload,
        frame_len=len(view),
    )


def response_body(env: ResponseEnvelope, request_id: str) -> memoryview:
    """Apply the client rules of §2.2 and return the body map's raw bytes."""
    if env.version != IPC_VERSION:
        raise ProtocolError(f"version mismatch: expected {IPC_VERSION}, got {env.version}")
    if env.request_id != request_id:
        raise ProtocolError(f"response request_id {env.request_id!r} does not match {request_id!r}")
    if not env.ok:
        raise IpcServerError(env.error if env.error is not None else "")
    if env.body is None:
        raise ProtocolError("body missing")
    return env.body


def decode_body(raw: Buffer) -> Any:
    """Generic msgpack → Python (str keys, bin → bytes); trailing bytes are an error."""
    try:
        return msgpack.unpackb(_flat(raw), raw=False, strict_map_key=False)
    except WireError:
        raise
    except Exception as exc:
        raise DecodeError(f"invalid msgpack: {exc}") from None


# --------------------------------------------------------------------------------------------
# BatchOutcome


def _opt_uint(obj: dict[Any, Any], key: str, what: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if not _is_uint(value):
        raise DecodeError(f"{what} {key!r} must be an unsigned integer or nil")
    return int(value)


def _opt_str(obj: dict[Any, Any], key: str, what: str) -> str | None:
    value = obj.get(key)
    if value is None or isinstance(value, str):
        return value
    raise DecodeError(f"{what} {key!r} must be a string or nil")


def _opt_float(obj: dict[Any, Any], key: str, what: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DecodeError(f"{what} {key!r} must be a number or nil")
    return float(value)


def _result_bytes(value: Any) -> bytes:
    """`result_msgpack` as bytes: absent/nil → empty; bin, str or an array of byte values."""
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, list):
        if all(_is_uint(b) and b <= 0xFF for b in value):
            return bytes(value)
        raise DecodeError("item outcome 'result_msgpack' array must hold byte values 0..255")
    raise DecodeError("item outcome 'result_msgpack' must be bin, str, an array of bytes or nil")


def _unit_count(value: Any, key: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise DecodeError(f"unit count {key!r} must be an unsigned integer or nil")
    if value < 0:
        raise DecodeError(f"unit count {key!r} must not be negative (got {value})")
    return value


def _units(value: Any) -> dict[str, int | None] | None:
    """UnitCounts from a named map (unknown keys dropped; the newer keys kept only when present) or
    a legacy positional array (the five v0.7.1 keys only)."""
    if value is None:
        return None
    if isinstance(value, dict):
        counts = {key: _unit_count(value.get(key), key) for key in UNIT_KEYS}
        for key in NEWER_UNIT_KEYS:
            count = _unit_count(value.get(key), key)
            if count is not None:
                counts[key] = count
        return counts
    if isinstance(value, list):
        slots = value[: len(UNIT_KEYS)] + [None] * (len(UNIT_KEYS) - min(len(value), len(UNIT_KEYS)))
        return {key: _unit_count(slot, key) for key, slot in zip(UNIT_KEYS, slots, strict=True)}
    raise DecodeError("item outcome 'units' must be a map, an array or nil")


def _item_outcome(obj: Any) -> ItemOutcome:
    what = "item outcome"
    if not isinstance(obj, dict):
        raise DecodeError("each item outcome must be a map")
    disposition = _require_str(obj, "disposition", what)
    if disposition not in DISPOSITIONS:
        raise DecodeError(f"item outcome has unknown disposition {disposition!r}")
    raw_output = obj.get("raw_output")
    if raw_output is not None and not isinstance(raw_output, dict):
        raise DecodeError("item outcome 'raw_output' must be a map or nil")
    return ItemOutcome(
        work_item_id=_require_str(obj, "work_item_id", what),
        request_id=_require_str(obj, "request_id", what),
        item_index=_require_uint(obj, "item_index", what),
        disposition=disposition,
        nak_delay_ms=_opt_uint(obj, "nak_delay_ms", what),
        result_msgpack=_result_bytes(obj.get("result_msgpack")),
        error=_opt_str(obj, "error", what),
        error_code=_opt_str(obj, "error_code", what),
        inference_ms=_opt_float(obj, "inference_ms", what),
        tokenization_ms=_opt_float(obj, "tokenization_ms", what),
        postprocessing_ms=_opt_float(obj, "postprocessing_ms", what),
        raw_output=raw_output,
        units=_units(obj.get("units")),
        retry_after_s=_opt_uint(obj, "retry_after_s", what),
    )


_F16_ITEM_UINTS = ("byte_offset", "byte_len", "num_tokens", "token_dims")


def _f16_item(obj: Any) -> dict[str, Any]:
    what = "batched f16 multivector item"
    if not isinstance(obj, dict):
        raise DecodeError(f"each {what} must be a map")
    item: dict[str, Any] = {"work_item_id": _require_str(obj, "work_item_id", what)}
    for key in _F16_ITEM_UINTS:
        item[key] = _require_uint(obj, key, what)
    return item


def _f16_multivector(obj: Any) -> BatchedF16Multivector:
    what = "batched f16 multivector"
    if not isinstance(obj, dict):
        raise DecodeError(f"each {what} must be a map")
    values = _require(obj, "values_f16", what)
    if not isinstance(values, bytes):
        raise DecodeError(f"{what} 'values_f16' must be bin")
    if len(values) % 2:
        raise DecodeError(f"{what} 'values_f16' has an odd length ({len(values)} bytes)")
    items = _require(obj, "items", what)
    if not isinstance(items, list):
        raise DecodeError(f"{what} 'items' must be an array")
    return BatchedF16Multivector(values_f16=values, items=[_f16_item(i) for i in items])


_BATCH_KEYS = frozenset({"outcomes", "batched_f16_multivectors"})


def _batch_fields(raw: Buffer) -> dict[str, Any]:
    """The BatchOutcome map's two known fields, each decoded strictly (as `decode_body` does); the
    other values are skipped unread, as in the native decoder."""
    view = _flat(raw).toreadonly()
    if view[:1] and view[0] not in _MAP_MARKERS:
        raise DecodeError("BatchOutcome must be a map")
    _, spans = _top_map(view, frozenset(), _BATCH_KEYS, "BatchOutcome")
    return {key: decode_body(view[start:end]) for key, (start, end) in spans.items()}


def decode_batch_outcome(raw: Buffer) -> BatchOutcome:
    """Decode and type-check a BatchOutcome body; any violation fails the whole batch."""
    root = _batch_fields(raw)
    outcomes = _require(root, "outcomes", "BatchOutcome")
    if not isinstance(outcomes, list):
        raise DecodeError("BatchOutcome 'outcomes' must be an array")
    multivectors = root.get("batched_f16_multivectors")
    if multivectors is None:
        multivectors = []
    elif not isinstance(multivectors, list):
        raise DecodeError("BatchOutcome 'batched_f16_multivectors' must be an array")
    return BatchOutcome(
        outcomes=[_item_outcome(o) for o in outcomes],
        batched_f16_multivectors=[_f16_multivector(m) for m in multivectors],
    )


__all__ = [
    "BatchOutcome",
    "BatchedF16Multivector",
    "IpcResponseChunk",
    "ItemOutcome",
    "ResponseEnvelope",
    "decode_batch_outcome",
    "decode_body",
    "decode_response",
    "encode_request",
    "response_body",
]
