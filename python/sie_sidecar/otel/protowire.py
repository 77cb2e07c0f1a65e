# SPDX-License-Identifier: Apache-2.0
"""The few protobuf wire encodings the OTLP requests use, written by hand.

Why not the generated opentelemetry-proto classes: importing them (protobuf's runtime and the OTLP
descriptors) cost ~40 ms of CPU, and the first encode ~10 ms more, paid either before the sidecar's
first reply or as an event-loop stall at its first push. An OTLP request is a handful of nested
messages; these helpers write them in field-number order with proto3's presence rules, so the bytes
equal what protobuf's own serializer writes (tests/unit/test_otlp_bytes.py checks byte for byte
against it, opentelemetry-proto being a test dependency only).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Final

VARINT: Final = 0
FIXED64: Final = 1
LEN: Final = 2
FIXED32: Final = 5

_DOUBLE: Final = struct.Struct("<d")
_FIXED64: Final = struct.Struct("<Q")
_FIXED32: Final = struct.Struct("<I")


def varint(value: int) -> bytes:
    """Base-128 varint; a negative int64 is its 64-bit two's complement (ten bytes)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def message(field: int, payload: bytes) -> bytes:
    """A length-delimited field: a submessage, bytes or a packed repeated field (written even when
    empty: a set submessage has presence; callers skip what proto3 would omit)."""
    return tag(field, LEN) + varint(len(payload)) + payload


def string(field: int, text: str) -> bytes:
    """A string field; proto3 omits the empty string (use `message` for a oneof member)."""
    return message(field, text.encode()) if text else b""


def uint(field: int, value: int) -> bytes:
    """A varint field (uint32/uint64/int64/enum/bool); proto3 omits zero."""
    return tag(field, VARINT) + varint(value) if value else b""


def fixed64(field: int, value: int) -> bytes:
    """A fixed64 field; proto3 omits zero."""
    return tag(field, FIXED64) + _FIXED64.pack(value) if value else b""


def fixed32(field: int, value: int) -> bytes:
    """A fixed32 field; proto3 omits zero."""
    return tag(field, FIXED32) + _FIXED32.pack(value) if value else b""


def double(field: int, value: float) -> bytes:
    """A double with presence (a oneof member or an `optional` field): written even when zero."""
    return tag(field, FIXED64) + _DOUBLE.pack(value)


def packed_fixed64(field: int, values: Iterable[int]) -> bytes:
    payload = b"".join(_FIXED64.pack(v) for v in values)
    return message(field, payload) if payload else b""


def packed_double(field: int, values: Iterable[float]) -> bytes:
    payload = b"".join(_DOUBLE.pack(v) for v in values)
    return message(field, payload) if payload else b""


__all__ = [
    "double",
    "fixed32",
    "fixed64",
    "message",
    "packed_double",
    "packed_fixed64",
    "string",
    "tag",
    "uint",
    "varint",
]
