# SPDX-License-Identifier: Apache-2.0
"""What the backend library checks and groups before an adapter sees a batch (scheduler-and-prep
§1.3, §2.2, §2.3, the [P] rows): a backend that owns inference runs one adapter call per compatible
sub-group, and refuses item shapes the Python backend's builders refuse.

Sub-groups use the IPC-facing keys of §1.3 (the left column): any difference in `options` (its
msgpack bytes, so key order counts), `instruction`, `is_query`, `output_types`, `profile_id`,
`bundle_config_hash` (encode), or the label order and non-empty `options.lora` (extract) starts a
new group. Groups keep the order of their first item, and items keep their order within a group, so
a batch of one kind (what the sidecar normally sends) is one call, exactly as before.

The limits are the builders' (§2.2: 1 to 1000 score candidates; §2.3, newer than v0.7.1: at most
1000 labels, an `output_schema` at most 128 levels deep and of at most 100,000 values). A refused
item is answered `invalid_input` on its own; the rest of the batch runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgpack

MAX_SCORE_CANDIDATES: Final = 1000
MAX_EXTRACT_LABELS: Final = 1000
MAX_SCHEMA_DEPTH: Final = 128
MAX_SCHEMA_VALUES: Final = 100_000

#: `output_types` when the field is absent (an explicit empty list is kept as it is).
DEFAULT_OUTPUT_TYPES: Final = ("dense",)


def _options_bytes(payload: dict[str, Any]) -> bytes:
    """The msgpack bytes of `options` (empty when none): equal bytes, same group."""
    options = payload.get("options")
    return b"" if options is None else bytes(msgpack.packb(options, use_bin_type=True))


def _as_key(value: object) -> object:
    """A hashable stand-in for a list-valued field (lists become tuples, recursively)."""
    if isinstance(value, list):
        return tuple(_as_key(v) for v in value)
    return value


def sub_group_key(op: str, payload: dict[str, Any]) -> tuple[object, ...]:
    """§1.3's queue-executor key of one item of `op`."""
    instruction = payload.get("instruction")
    if op == "encode":
        output_types = payload["output_types"] if "output_types" in payload else list(DEFAULT_OUTPUT_TYPES)
        return (
            _as_key(output_types),
            instruction,
            payload.get("is_query"),
            _options_bytes(payload),
            payload.get("profile_id"),
            payload.get("bundle_config_hash"),
        )
    if op == "score":
        return (instruction, _options_bytes(payload))
    options = payload.get("options")
    lora = options.get("lora") if isinstance(options, dict) else None
    labels = payload.get("labels")
    return (
        lora if isinstance(lora, str) and lora else None,
        _as_key(labels) if isinstance(labels, list) else None,
        instruction,
        _options_bytes(payload),
    )


def sub_groups(op: str, payloads: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """`payloads` split by `sub_group_key`, groups in the order of their first item."""
    groups: dict[tuple[object, ...], list[dict[str, Any]]] = {}
    for payload in payloads:
        groups.setdefault(sub_group_key(op, payload), []).append(payload)
    return list(groups.values())


def schema_shape(schema: object) -> tuple[int, int]:
    """(depth, values) of an `output_schema`: arrays add one level, an object property two (the
    object and the property); every value counts, containers included. Iterative, so a hostile
    schema cannot exhaust the stack; it stops counting once both limits are passed."""
    deepest = 0
    values = 0
    stack: list[tuple[object, int]] = [(schema, 0)]
    while stack:
        node, depth = stack.pop()
        values += 1
        deepest = max(deepest, depth)
        if deepest > MAX_SCHEMA_DEPTH and values > MAX_SCHEMA_VALUES:
            break
        if isinstance(node, dict):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 2) for child in node.values())
        elif isinstance(node, list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in node)
    return deepest, values


def limit_error(op: str, payload: dict[str, Any]) -> str | None:
    """Why the builders refuse this item, or None."""
    if op == "score":
        candidates = len(payload.get("score_items") or ())
        if candidates == 0:
            return "score request has no candidates"
        if candidates > MAX_SCORE_CANDIDATES:
            return f"score request has {candidates} candidates; at most {MAX_SCORE_CANDIDATES} are allowed"
        return None
    if op != "extract":
        return None
    labels = payload.get("labels")
    if isinstance(labels, list) and len(labels) > MAX_EXTRACT_LABELS:
        return f"extract request has {len(labels)} labels; at most {MAX_EXTRACT_LABELS} are allowed"
    schema = payload.get("output_schema")
    if schema is not None:
        depth, values = schema_shape(schema)
        if depth > MAX_SCHEMA_DEPTH:
            return f"output_schema nests deeper than {MAX_SCHEMA_DEPTH} levels"
        if values > MAX_SCHEMA_VALUES:
            return f"output_schema has more than {MAX_SCHEMA_VALUES} values"
    return None


__all__ = [
    "DEFAULT_OUTPUT_TYPES",
    "MAX_EXTRACT_LABELS",
    "MAX_SCHEMA_DEPTH",
    "MAX_SCHEMA_VALUES",
    "MAX_SCORE_CANDIDATES",
    "limit_error",
    "schema_shape",
    "sub_group_key",
    "sub_groups",
]
