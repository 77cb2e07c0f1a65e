# SPDX-License-Identifier: Apache-2.0
"""RunBatch and Process*Batch request bodies from WorkItems (wire-protocol §3.10, §4.1-4.3).

`run_batch_body` is what the dispatcher calls: the native one-pass writer (which splices each item's
values from its original payload), or its spec and twin (`_twins.requests`), with
`SIE_SIDECAR_NO_EXTENSIONS=1`, chosen by `wire._switch`. Both bodies take their per-op items from
`wire.batch_items` (the native writer mirrors those builders).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeAlias, cast

import msgpack

from ..wire._switch import load
from ..wire.batch_items import batch_items, encode_item, extract_item, score_item
from ..wire.workitem import WorkItem

if TYPE_CHECKING:
    from typing_extensions import Buffer

P = ParamSpec("P")
_batch_ids = itertools.count()

PER_OP_METHOD = {
    "encode": "ProcessEncodeBatch",
    "score": "ProcessScoreBatch",
    "extract": "ProcessExtractBatch",
}


def next_batch_id() -> int:
    """Process-wide monotonic batch id starting at 0 (log correlation only)."""
    return next(_batch_ids)


def lora_from_options(options: object) -> str:
    """The LoRA key `options` asks for (scheduler-and-prep §1.1); "" is the base weights.

    Only a non-empty string under `lora` names an adapter, byte for byte: absent or non-map options,
    a missing key, a non-string value and "" all mean base, so malformed clients cannot fragment the
    batchers of a model."""
    if not isinstance(options, Mapping):
        return ""
    lora = options.get("lora")
    return lora if isinstance(lora, str) else ""


def lora_key(item: WorkItem) -> str:
    """The LoRA adapter an encode/extract item asks for; score always runs on base weights."""
    if item.operation == "score" or not item.options:
        return ""
    return lora_from_options(item.options)


_core = load("requests")
#: The RunBatch writer: `_native.write_run_batch_body` (one pass, values spliced from each item's
#: payload), or its twin and spec with the twins (`_twins.requests`: dicts + msgpack). With
#: `room=True` the native one returns a `RequestBody` (room in front for the IPC envelope, so the
#: first request frame is the body's own memory); the twin's is `bytes` either way.
_write_run_batch_body: Callable[..., Any] = _core.write_run_batch_body

#: A request body as the IPC clients take it: `bytes`, or the native writer's `RequestBody` (a
#: read-only buffer; named here only as one, `_native` being the facades' to import).
EncodedBody: TypeAlias = "bytes | Buffer"


def run_batch_request(
    model_id: str,
    op: str,
    items: Sequence[WorkItem],
    lora: str,
    total_cost: int,
    *,
    payload_fetch_ms: Sequence[float] | None = None,
    prepared_tokens: Sequence[Mapping[str, Any] | None] | None = None,
    prepared_audio: Sequence[Mapping[str, Any] | None] | None = None,
    trace: tuple[str, str | None] | None = None,
) -> EncodedBody:
    """An encoded RunBatchRequest: one op, one LoRA key, items wrapped as tagged RunBatchItems, under
    the next process-wide batch id, as the dispatcher sends it. Written natively when the core is
    loaded (~10x cheaper per item than the twin: values are spliced from each item's payload, not
    re-encoded), as a `RequestBody` whose request frame `wire.encode_request` writes around the
    body in place (no copy of the ~45 KB of a 64-item batch; a second frame of it is a copy).

    `trace` (traceparent, tracestate): the context every item carries instead of its own, the
    sidecar's span of a sampled batch (wire-protocol §4.2); None leaves each item's own."""
    args = (model_id, op, lora, total_cost, next_batch_id(), items, payload_fetch_ms, prepared_tokens, prepared_audio)
    if trace is None:  # the call of every untraced batch, exactly as before tracing
        return cast("EncodedBody", _write_run_batch_body(*args, room=True))
    return cast("EncodedBody", _write_run_batch_body(*args, trace, room=True))


def _as_bytes(write: Callable[P, EncodedBody]) -> Callable[P, bytes]:
    def as_bytes(*args: P.args, **kwargs: P.kwargs) -> bytes:
        body = write(*args, **kwargs)
        return body if isinstance(body, bytes) else bytes(body)

    return as_bytes


#: `run_batch_request`'s body as `bytes` (a copy of a `RequestBody`), for callers that keep or
#: inspect it rather than send it.
run_batch_body = _as_bytes(run_batch_request)


def per_op_body(
    model_id: str,
    op: str,
    items: Sequence[WorkItem],
    payload_fetch_ms: Sequence[float] | None = None,
    prepared_tokens: Sequence[Mapping[str, Any] | None] | None = None,
    *,
    prepared_audio: Sequence[Mapping[str, Any] | None] | None = None,
) -> bytes:
    """An encoded Process{Encode,Score,Extract}BatchRequest, for backends without RunBatch."""
    body: dict[str, Any] = {
        "model_id": model_id,
        "items": batch_items(op, items, payload_fetch_ms, prepared_tokens, prepared_audio),
    }
    if op == "encode":
        body["accepts_batched_f16_multivectors"] = True
    return bytes(msgpack.packb(body, use_bin_type=True))


__all__ = [
    "PER_OP_METHOD",
    "EncodedBody",
    "encode_item",
    "extract_item",
    "lora_from_options",
    "lora_key",
    "next_batch_id",
    "per_op_body",
    "run_batch_body",
    "run_batch_request",
    "score_item",
]
