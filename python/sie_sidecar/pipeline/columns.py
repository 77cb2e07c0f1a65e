# SPDX-License-Identifier: Apache-2.0
"""What the dispatcher reads across a whole batch of deliveries, in one native call per batch (issue 30):
the config gate's hashes, the RunBatch writer's columns, the lane's request latencies, the unsettled. No Python loop
over a batch's items runs on the common path; the `_py` functions are the twins (the path with
`SIE_SIDECAR_NO_EXTENSIONS=1`, and the oracle of the parity tests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

Columns = tuple[list[Any], list[float] | None, list[Any] | None, list[Any] | None]


def config_hashes_py(deliveries: Iterable[Any]) -> list[Any]:
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


def unsettled_py(deliveries: list[Any]) -> list[Any]:
    """The deliveries not yet settled, in order: `deliveries` itself when none is."""
    if not any(d.settled for d in deliveries):
        return deliveries
    return [d for d in deliveries if not d.settled]


def run_batch_columns_py(deliveries: list[Any], op: str) -> Columns:
    """`(items, payload_fetch_ms, prepared_tokens, prepared_audio)` for the RunBatch writer: every
    `wire_item` that is not None; the other three one entry per delivery, or None when each entry
    would be 0.0 / None (the writer reads None as exactly that); tokens for encode, audio for extract."""
    items = [item for item in (d.wire_item for d in deliveries) if item is not None]
    fetch_ms = [float(d.payload_fetch_ms) for d in deliveries]
    tokens = [d.prepared_tokens for d in deliveries] if op == "encode" else []
    audio = [d.prepared_audio for d in deliveries] if op == "extract" else []
    return (
        items,
        fetch_ms if any(ms != 0.0 for ms in fetch_ms) else None,
        tokens if any(t is not None for t in tokens) else None,
        audio if any(a is not None for a in audio) else None,
    )


def request_latencies_ms_py(
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


def _select() -> tuple[
    Callable[[Iterable[Any]], list[Any]],
    Callable[[list[Any], str], Columns],
    Callable[[list[str], Sequence[float], Iterable[Any], float], list[float]],
    Callable[[list[Any]], list[Any]],
]:
    from ..wire._switch import USING_NATIVE

    if not USING_NATIVE:
        return config_hashes_py, run_batch_columns_py, request_latencies_ms_py, unsettled_py
    from .._native import config_hashes, request_latencies_ms, run_batch_columns, unsettled

    return config_hashes, run_batch_columns, request_latencies_ms, unsettled


config_hashes, run_batch_columns, request_latencies_ms, unsettled = _select()

__all__ = [
    "Columns",
    "config_hashes",
    "config_hashes_py",
    "request_latencies_ms",
    "request_latencies_ms_py",
    "run_batch_columns",
    "run_batch_columns_py",
    "unsettled",
    "unsettled_py",
]
