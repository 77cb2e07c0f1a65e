# SPDX-License-Identifier: Apache-2.0
"""The messages both OTLP requests share (opentelemetry-proto `common.proto`, `resource.proto`): an
attribute, the resource and the sidecar's instrumentation scope, written with `protowire`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from .protowire import VARINT, message, string, tag, varint

SCOPE: Final = "sie_sidecar"

# Field numbers: KeyValue, AnyValue, InstrumentationScope, Resource.
_KV_KEY, _KV_VALUE = 1, 2
_ANY_STRING, _ANY_INT = 1, 3
_SCOPE_NAME, _SCOPE_VERSION = 1, 2
_RESOURCE_ATTRIBUTES = 1
_ANY_INT_TAG: Final = tag(_ANY_INT, VARINT)


def key_value(field: int, key: str, value: str | int) -> bytes:
    """An attribute: a `KeyValue` whose `AnyValue` is a string or an int64 (a oneof member, so it is
    written even when empty or zero)."""
    any_value = _ANY_INT_TAG + varint(value) if isinstance(value, int) else message(_ANY_STRING, value.encode())
    return message(field, string(_KV_KEY, key) + message(_KV_VALUE, any_value))


def resource_message(field: int, attributes: Mapping[str, str]) -> bytes:
    return message(field, b"".join(key_value(_RESOURCE_ATTRIBUTES, k, v) for k, v in attributes.items()))


def scope_message(field: int, version: str) -> bytes:
    return message(field, string(_SCOPE_NAME, SCOPE) + string(_SCOPE_VERSION, version))


__all__ = ["SCOPE", "key_value", "resource_message", "scope_message"]
