# SPDX-License-Identifier: Apache-2.0
"""Local-ingest framing (sidecar-behaviour §11, wire-protocol §7): a 4-byte little-endian length, then
one msgpack map of at most 64 MiB. Requests are `{id, op, body}`, responses `{id, ok, error, body}`,
keys in that order (TV-L1, TV-L2).

The backend IPC is big-endian; this socket is little-endian on purpose (v0.7.1), so the two framings
never share code by accident.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from ..errors import LocalFrameError

#: The most bytes one frame's msgpack map may take (the 4-byte header not counted).
MAX_FRAME: Final = 64 * 1024 * 1024
HEADER: Final = struct.Struct("<I")
HEADER_SIZE: Final = HEADER.size
#: Envelope ids are u64.
MAX_ID: Final = 2**64 - 1


def _pack(value: Any) -> bytes:
    return bytes(msgpack.packb(value, use_bin_type=True))


def frame(payload: bytes) -> bytes:
    """The header and the payload; `LocalFrameError` when the payload is over the limit."""
    if len(payload) > MAX_FRAME:
        raise LocalFrameError(f"frame of {len(payload)} bytes exceeds the limit of {MAX_FRAME} bytes")
    return HEADER.pack(len(payload)) + payload


def encode_request(op_id: int, op: str, body: dict[str, Any]) -> bytes:
    """A framed `{id, op, body}` request (TV-L1)."""
    return frame(_pack({"id": op_id, "op": op, "body": body}))


def encode_response(op_id: int, ok: bool, error: str | None, body: dict[str, Any]) -> bytes:
    """A framed `{id, ok, error, body}` response; `error` is nil on success (TV-L2)."""
    return frame(_pack({"id": op_id, "ok": ok, "error": error, "body": body}))


def declared_length(header: bytes) -> int:
    """The payload length a header declares; `LocalFrameError` when over the limit."""
    if len(header) != HEADER_SIZE:
        raise LocalFrameError("header is truncated")
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise LocalFrameError(f"frame declares {length} bytes, over the limit of {MAX_FRAME} bytes")
    return int(length)


def _unpack_map(payload: bytes) -> dict[Any, Any]:
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise LocalFrameError(f"invalid MessagePack: {exc}") from None
    except Exception as exc:  # msgpack raises a few non-ValueError types on hostile input
        raise LocalFrameError(f"invalid MessagePack: {exc!r}") from None
    if not isinstance(value, dict):
        raise LocalFrameError("frame is not a msgpack map")
    return value


def _op_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise LocalFrameError("envelope id must be a u64")
    return value


@dataclass(frozen=True, slots=True)
class Request:
    """One decoded request envelope; `body` is the raw map (fields are defaulted by `request.Body`)."""

    id: int
    op: str
    body: dict[Any, Any]


@dataclass(frozen=True, slots=True)
class Response:
    """One decoded response envelope."""

    id: int
    ok: bool
    error: str | None
    body: dict[Any, Any]


def decode_request(payload: bytes) -> Request:
    """`{id, op, body}`: a u64 id, a string op and a map body (missing body: empty)."""
    env = _unpack_map(payload)
    op = env.get("op")
    if not isinstance(op, str):
        raise LocalFrameError("envelope op must be a string")
    body = env.get("body", {})
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise LocalFrameError("envelope body must be a map")
    return Request(_op_id(env.get("id")), op, body)


def decode_response(payload: bytes) -> Response:
    """`{id, ok, error, body}`: what the client reads."""
    env = _unpack_map(payload)
    ok = env.get("ok")
    error = env.get("error")
    body = env.get("body", {})
    if not isinstance(ok, bool):
        raise LocalFrameError("response ok must be a bool")
    if error is not None and not isinstance(error, str):
        raise LocalFrameError("response error must be a string or nil")
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise LocalFrameError("response body must be a map")
    return Response(_op_id(env.get("id")), ok, error, body)


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame's payload; None at a clean end of stream (between frames). A stream that ends
    inside a header or a payload raises `LocalFrameError`."""
    try:
        header = await reader.readexactly(HEADER_SIZE)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise LocalFrameError("header is truncated") from None
    length = declared_length(header)
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise LocalFrameError(f"frame body is truncated (declared {length} bytes)") from None


__all__ = [
    "HEADER_SIZE",
    "MAX_FRAME",
    "Request",
    "Response",
    "declared_length",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "frame",
    "read_frame",
]
