# SPDX-License-Identifier: Apache-2.0
"""The NATS WorkItem (wire-protocol §7.2): decoding with the v0.7.1 sidecar's rules (TV-W1)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from ..errors import WorkItemError
from ._switch import load

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


@dataclass(slots=True)
class WorkItem:
    """The fields the runtime reads.

    The native decoder also keeps the payload (`raw`) and where the `SPLICED_FIELDS` values lie in it
    (`spans`, see the twin's `work_item_spans`), so the RunBatch writer copies those values as bytes
    instead of re-encoding them. They describe the item *as decoded*: code that changes a spliced field in
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


#: How deep a value inside the WorkItem map may nest (the native reader's `sie_core::msgpack::MAX_DEPTH`):
#: a value of the top-level map is at depth 0, an element of it at 1, and so on.
MAX_DEPTH = 128

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


if TYPE_CHECKING:
    #: Decode one WorkItem (native one-pass decoder, or the twin with SIE_SIDECAR_NO_EXTENSIONS=1).
    decode_work_item: Callable[[bytes | memoryview], WorkItem]
else:

    def __getattr__(name: str) -> Any:
        """`decode_work_item`, chosen by `wire._switch` on first use, then kept as a plain attribute.

        Not at import: the twin decoder (`_twins.workitem`) imports this module's schema, so it may be
        the one importing this module (a test of the twin, with `SIE_SIDECAR_NO_EXTENSIONS=1`)."""
        if name != "decode_work_item":
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        decoder = functools.partial(load("workitem").decode_work_item, cls=WorkItem)
        globals()[name] = decoder
        return decoder


__all__ = [
    "OPERATIONS",
    "REQUIRED",
    "SPLICED_FIELDS",
    "WorkItem",
    "WorkItemError",
    "decode_work_item",
    "json_shape_error",
]
