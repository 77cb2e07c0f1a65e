# SPDX-License-Identifier: Apache-2.0
"""Validation of IPC request bodies (wire-protocol §3-4): typed reads that raise `BadBody`, which
the server answers as `bad body for <method>: <detail>` before any adapter code runs.

Hand-written reads over the decoded msgpack rather than `msgspec` structs: the error must name the
field and rule in the server's words (`bad body for <m>: <field> is required and must be ...`), and
these bodies are a few per batch, not per item, so a faster decoder would not show (not measured)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class BadBody(Exception):
    """A request body failed validation; answered as `bad body for <method>: <detail>`."""


def req_str(body: Mapping[str, Any], key: str, where: str = "") -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise BadBody(f"{where + '.' if where else ''}{key} is required and must be a string")
    return value


def req_uint(body: Mapping[str, Any], key: str, where: str = "") -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadBody(f"{where + '.' if where else ''}{key} is required and must be an unsigned integer")
    return value


def req_list(body: Mapping[str, Any], key: str, where: str = "") -> list[Any]:
    value = body.get(key)
    if not isinstance(value, list):
        raise BadBody(f"{where + '.' if where else ''}{key} is required and must be an array")
    return value


def opt_bool(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadBody(f"{key} must be a bool")
    return value


def opt_str(body: Mapping[str, Any], key: str, where: str) -> str:
    value = body.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadBody(f"{where}.{key} must be a string")
    return value


def opt_uint(body: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadBody(f"{where}.{key} must be an unsigned integer")
    return value


def opt_str_list(body: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    """An optional array of strings (None when absent or nil)."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadBody(f"{key} must be an array of strings")
    return tuple(value)


__all__ = ["BadBody", "opt_bool", "opt_str", "opt_str_list", "opt_uint", "req_list", "req_str", "req_uint"]
