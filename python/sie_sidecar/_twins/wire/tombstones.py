# SPDX-License-Identifier: Apache-2.0
"""Cancellation tombstones (sidecar-behaviour §7, test-vectors §9).

Work the gateway has given up on is ACK-dropped when its request id is tombstoned. Both sets keep
their entries in an OrderedDict in stamp order: lookups are O(1), and the oldest entry sits at the
front, so eviction and expiry never scan (a plain dict would, over the holes its deletions leave).
Pure-Python twin of the Cython `sie_sidecar._native.wire` tombstones.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable

from sie_sidecar.wire.limits import BATCH_TOMBSTONE_TTL_S, TOMBSTONE_CAPACITY, TOMBSTONE_TTL_S


def _check_ttl(ttl_s: float) -> float:
    ttl = float(ttl_s)
    if math.isnan(ttl) or ttl < 0.0:
        raise ValueError(f"tombstone ttl must be a non-negative number, got {ttl_s!r}")
    return ttl


class TombstoneSet:
    """Request tombstones keyed by (router_id, request_id), bounded by capacity and TTL.

    An entry is live while `clock() < recorded_at + ttl_s`; a TTL of 0 records nothing useful.
    `len()` counts stored entries, including expired ones not yet dropped (expiry is lazy).
    """

    __slots__ = ("_capacity", "_clock", "_entries", "_ttl")

    def __init__(
        self,
        capacity: int = TOMBSTONE_CAPACITY,
        ttl_s: float = TOMBSTONE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 0:
            raise ValueError(f"tombstone capacity must be >= 0, got {capacity!r}")
        self._capacity = int(capacity)
        self._ttl = _check_ttl(ttl_s)
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], float] = OrderedDict()

    def record(self, router_id: str, request_id: str) -> None:
        """Tombstone a request (or re-stamp it, moving it to the young end); evicts the oldest at capacity."""
        if self._capacity == 0:
            return
        entries = self._entries
        now = float(self._clock())
        while entries:
            oldest, expiry = next(iter(entries.items()))
            if now < expiry:
                break
            del entries[oldest]
        key = (router_id, request_id)
        if key in entries:
            entries.move_to_end(key)
        entries[key] = now + self._ttl
        while len(entries) > self._capacity:
            entries.popitem(last=False)

    def is_cancelled(self, router_id: str, request_id: str) -> bool:
        """Whether a live tombstone exists for this request of this router; drops it if expired."""
        key = (router_id, request_id)
        expiry = self._entries.get(key)
        if expiry is None:
            return False
        if float(self._clock()) < expiry:
            return True
        del self._entries[key]
        return False

    def __len__(self) -> int:
        return len(self._entries)


class BatchTombstones:
    """Worker-direct batch_cancel tombstones keyed by request id; no cap, expired entries pruned on every call."""

    __slots__ = ("_clock", "_entries", "_ttl")

    def __init__(self, ttl_s: float = BATCH_TOMBSTONE_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = _check_ttl(ttl_s)
        self._clock = clock
        self._entries: OrderedDict[str, float] = OrderedDict()

    def _prune(self) -> float:
        """Drop expired entries from the old end (amortised O(1) per stamp) and return the time used."""
        now = float(self._clock())
        entries = self._entries
        while entries:
            oldest, expiry = next(iter(entries.items()))
            if now < expiry:
                break
            del entries[oldest]
        return now

    def record(self, request_id: str) -> None:
        """Tombstone a batch request (or re-stamp it, moving it to the young end)."""
        now = self._prune()
        entries = self._entries
        if request_id in entries:
            entries.move_to_end(request_id)
        entries[request_id] = now + self._ttl

    def is_cancelled(self, request_id: str) -> bool:
        """Whether a live tombstone exists for this request id."""
        now = self._prune()
        expiry = self._entries.get(request_id)
        if expiry is None:
            return False
        if now < expiry:
            return True
        # Only reachable when the clock went backwards between stamps; keep the answer exact anyway.
        del self._entries[request_id]
        return False

    def __len__(self) -> int:
        """Live entries (pruning first, like every other operation)."""
        self._prune()
        return len(self._entries)


__all__ = ["BatchTombstones", "TombstoneSet"]
