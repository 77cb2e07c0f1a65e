# SPDX-License-Identifier: Apache-2.0
"""Twins of the native batch columns (`pipeline.columns`, issue 30): `_native.config_hashes`,
`unsettled`, `run_batch_columns` and `request_latencies_ms`, one Python loop over a batch each (the
path with `SIE_SIDECAR_NO_EXTENSIONS=1`, and the oracle of the parity tests)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from .deadlines import work_item_ages

IMPLEMENTATION = "py"


def config_hashes(deliveries: Iterable[Any]) -> list[Any]:
    """The distinct non-empty `bundle_config_hash` values of the deliveries' items, first seen first
    (a delivery whose `wire_item` is None has none)."""
    found: list[Any] = []
    for d in deliveries:
        item = d.wire_item
        if item is None:
            continue
        h = item.bundle_config_hash
        if h and h not in found:
            found.append(h)
    return found


def unsettled(deliveries: list[Any]) -> list[Any]:
    """The deliveries not yet settled, in order: `deliveries` itself when none is."""
    if not any(d.settled for d in deliveries):
        return deliveries
    return [d for d in deliveries if not d.settled]


def run_batch_columns(
    deliveries: list[Any], op: str, ages: Any | None = None, contexts: list[str] | None = None
) -> tuple[list[Any], list[float] | None, list[Any] | None, list[Any] | None]:
    """`(items, payload_fetch_ms, prepared_tokens, prepared_audio)` for the RunBatch writer: every
    `wire_item` that is not None; the other three one entry per delivery, or None when each entry
    would be 0.0 / None (the writer reads None as exactly that); tokens for encode, audio for extract.
    With `ages` (a histogram), each item's work-item age now is recorded into it first (§5.6); with
    `contexts` (a list), the items' distinct non-empty `traceparent`s are appended to it, in order."""
    if ages is not None:
        aged = work_item_ages(deliveries, time.time())
        if aged:
            ages.record_many(aged)
    items = [item for item in (d.wire_item for d in deliveries) if item is not None]
    if contexts is not None:
        found: dict[str, None] = {}  # distinct within this batch, as the compiled call gathers them
        for item in items:
            value = getattr(item, "traceparent", None)  # as the twin tracer reads an item
            if isinstance(value, str) and value:
                found[value] = None
        contexts.extend(found)
    fetch_ms = [float(d.payload_fetch_ms) for d in deliveries]
    tokens = [d.prepared_tokens for d in deliveries] if op == "encode" else []
    audio = [d.prepared_audio for d in deliveries] if op == "extract" else []
    return (
        items,
        fetch_ms if any(ms != 0.0 for ms in fetch_ms) else None,
        tokens if any(t is not None for t in tokens) else None,
        audio if any(a is not None for a in audio) else None,
    )


def request_latencies_ms(
    request_ids: list[str], enqueued_at: Sequence[float], succeeded: Iterable[Any], finished: float
) -> list[float]:
    """One latency per request of `succeeded`, in its order: from its first item's enqueue in this
    batch to `finished`, in ms; none for a request not in the batch or enqueued at or after `finished`."""
    if len(request_ids) != len(enqueued_at):
        raise ValueError("request_ids and enqueued_at must have the same length")
    if not all(isinstance(r, str) for r in request_ids):
        raise TypeError("request ids must be str")
    first = dict(zip(reversed(request_ids), reversed(enqueued_at), strict=True))
    return [
        (finished - since) * 1000.0
        for since in (first.get(r) if isinstance(r, str) else None for r in succeeded)
        if since is not None and finished > since
    ]


__all__ = ["IMPLEMENTATION", "config_hashes", "request_latencies_ms", "run_batch_columns", "unsettled"]
