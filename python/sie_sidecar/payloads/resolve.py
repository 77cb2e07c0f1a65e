# SPDX-License-Identifier: Apache-2.0
"""Inline offloaded payloads into WorkItems, one outcome per item, never an exception for a bad one.

What the blob holds (wire-protocol §7.3, sidecar-behaviour §12):

* encode / extract `payload_ref` → msgpack of the item value: it becomes `item`;
* score `query_payload_ref` → msgpack map `{query, items[]}` (str or UTF-8 bin keys): `query` becomes
  `query_item`, `items` becomes `score_items`.

Settlement (§4.2): too large → `PAYLOAD_TOO_LARGE` "referenced payload exceeds the worker size limit";
anything else, undecodable blobs included → `payload_error` "failed to resolve item". Both are
published and ACKed by the caller. `generate` refs are not resolved here (their rules differ, §4.4).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from sie_sidecar.errors import PAYLOAD_ERROR, PAYLOAD_TOO_LARGE
from sie_sidecar.prep.media import field, unpack_value

from .errors import PayloadError
from .store import PAYLOAD_ENVELOPE_LIMIT, PayloadStore

if TYPE_CHECKING:
    from sie_sidecar.wire.workitem import WorkItem

log = logging.getLogger(__name__)

TOO_LARGE_CODE = PAYLOAD_TOO_LARGE
TOO_LARGE_MESSAGE = "referenced payload exceeds the worker size limit"
PAYLOAD_ERROR_CODE = PAYLOAD_ERROR
PAYLOAD_ERROR_MESSAGE = "failed to resolve item"
DEFAULT_CONCURRENCY = 8  # fetches in flight per call: 8 x 35 MiB bounds the memory one batch can pin


@dataclass(frozen=True, slots=True)
class Resolved:
    """The item ready for IPC: its payload inlined and its ref cleared (or untouched when it had none)."""

    item: WorkItem
    fetched: bool = False
    fetch_ms: float = 0.0
    size: int = 0
    ok: Literal[True] = True


@dataclass(frozen=True, slots=True)
class ResolveFailure:
    """Publish `code` / `message` for `item` and ACK it; `reason` is for telemetry and logs."""

    item: WorkItem
    code: str
    message: str
    reason: str
    fetch_ms: float = 0.0
    ok: Literal[False] = False


ResolveOutcome = Resolved | ResolveFailure


class _Undecodable(Exception):
    """The blob was fetched but is not what its operation needs."""


def payload_ref_of(item: WorkItem) -> str | None:
    """The ref this item's operation reads: `query_payload_ref` for score, `payload_ref` otherwise."""
    if item.operation == "generate":
        return None
    return item.query_payload_ref if item.operation == "score" else item.payload_ref


def inline_payload(item: WorkItem, blob: bytes) -> WorkItem:
    """A copy of `item` with the decoded blob in place of its ref (`_Undecodable` when it does not fit).

    The copy has no `raw` / `spans` (`replace` does not carry them), so the RunBatch writer encodes
    the fetched value instead of splicing the payload that held the ref."""
    try:
        value = unpack_value(blob)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise _Undecodable(f"payload is not msgpack: {type(exc).__name__}") from None
    if item.operation != "score":
        return dataclasses.replace(item, item=value, payload_ref=None)
    if not isinstance(value, dict):
        raise _Undecodable("score payload must be a map")
    n_query, query = field(value, "query")
    _, items = field(value, "items")
    if n_query == 0 or not isinstance(items, list):
        raise _Undecodable("score payload needs a query and an items array")
    return dataclasses.replace(item, query_item=query, score_items=items, query_payload_ref=None)


def _failure(item: WorkItem, exc: PayloadError | _Undecodable, fetch_ms: float) -> ResolveFailure:
    log.warning(
        "payload not resolved",
        extra={"item": item.work_item_id, "reason": getattr(exc, "reason", "decode"), "error": str(exc)},
    )
    if isinstance(exc, PayloadError):
        if exc.too_large:
            return ResolveFailure(item, TOO_LARGE_CODE, TOO_LARGE_MESSAGE, exc.reason, fetch_ms)
        return ResolveFailure(item, PAYLOAD_ERROR_CODE, PAYLOAD_ERROR_MESSAGE, exc.reason, fetch_ms)
    return ResolveFailure(item, PAYLOAD_ERROR_CODE, PAYLOAD_ERROR_MESSAGE, "decode", fetch_ms)


async def resolve_item(store: PayloadStore, item: WorkItem, *, limit: int = PAYLOAD_ENVELOPE_LIMIT) -> ResolveOutcome:
    """Fetch and inline one item's payload; a failure is returned, not raised."""
    ref = payload_ref_of(item)
    if ref is None:
        return Resolved(item)
    start = time.perf_counter()
    try:
        blob = await store.fetch(ref, limit=limit)
        fetch_ms = (time.perf_counter() - start) * 1000.0
        return Resolved(inline_payload(item, blob), fetched=True, fetch_ms=fetch_ms, size=len(blob))
    except (PayloadError, _Undecodable) as exc:
        return _failure(item, exc, (time.perf_counter() - start) * 1000.0)
    except Exception:  # a bug must cost one item, not the batch
        log.exception("payload resolution failed unexpectedly", extra={"item": item.work_item_id})
        return ResolveFailure(item, PAYLOAD_ERROR_CODE, PAYLOAD_ERROR_MESSAGE, "io")


async def resolve_items(
    store: PayloadStore,
    items: Sequence[WorkItem],
    *,
    limit: int = PAYLOAD_ENVELOPE_LIMIT,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> list[ResolveOutcome]:
    """One outcome per item, in input order; items without a ref come back untouched at once."""
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(item: WorkItem) -> ResolveOutcome:
        if payload_ref_of(item) is None:
            return Resolved(item)
        async with gate:
            return await resolve_item(store, item, limit=limit)

    return list(await asyncio.gather(*(one(item) for item in items)))


__all__ = [
    "PAYLOAD_ERROR_CODE",
    "PAYLOAD_ERROR_MESSAGE",
    "TOO_LARGE_CODE",
    "TOO_LARGE_MESSAGE",
    "ResolveFailure",
    "ResolveOutcome",
    "Resolved",
    "inline_payload",
    "payload_ref_of",
    "resolve_item",
    "resolve_items",
]
