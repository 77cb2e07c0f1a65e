# SPDX-License-Identifier: Apache-2.0
"""Pure-Python twin of the native batch former (`sie_sidecar._native.Batcher`, scheduler-and-prep §3).

Same API and the same decisions; the parity tests and the formation benchmark run both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FormedBatch:
    """A formed batch: item handles in packing order, their total cost and the flush reason."""

    ids: list[int]
    total_cost: int
    reason: str

    def __len__(self) -> int:
        return len(self.ids)


_U64 = (1 << 64) - 1


class Batcher:
    """One batch former. Times are seconds on the caller's monotonic clock."""

    def __init__(
        self,
        *,
        max_batch_cost: int = 16384,
        max_batch_requests: int = 12,
        max_batch_wait_ms: float = 15.0,
        coalesce_ms: float = 5.0,
        coalesce_ratio: float = 0.5,
    ) -> None:
        _check(max_batch_requests, max_batch_wait_ms, coalesce_ms, coalesce_ratio)
        self._cost_cap = max_batch_cost
        self._requests = max_batch_requests
        self._wait_ms = max_batch_wait_ms
        self._coalesce_ms = coalesce_ms
        self._ratio = coalesce_ratio
        # (id, cost, arrival, hard cap or None, runs alone)
        self._pending: list[tuple[int, int, float, int | None, bool]] = []
        #: Whether the previous batch was a runs-alone one (None: no batch yet).
        self._last_alone: bool | None = None
        self._total = 0
        self._first: float | None = None
        self._last: float | None = None

    # -- configuration -------------------------------------------------------------------------------

    def update_limits(self, max_batch_cost: int, max_batch_wait_ms: float, now: float) -> bool:
        _check(self._requests, max_batch_wait_ms, self._coalesce_ms, self._ratio)
        self._cost_cap, self._wait_ms = max_batch_cost, max_batch_wait_ms
        return self.flush_reason(now, False) is not None

    @property
    def max_batch_cost(self) -> int:
        return self._cost_cap

    @property
    def max_batch_requests(self) -> int:
        return self._requests

    @property
    def max_batch_wait_ms(self) -> float:
        return self._wait_ms

    @property
    def effective_coalesce_ms(self) -> float:
        return min(self._coalesce_ms, self._wait_ms * self._ratio)

    # -- state ----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def total_cost(self) -> int:
        return self._total

    @property
    def head_arrival(self) -> float | None:
        return min((p[2] for p in self._pending), default=None)

    def _effective_cap(self) -> int:
        return min([self._cost_cap, *(p[3] for p in self._pending if p[3] is not None)])

    # -- submit and triggers --------------------------------------------------------------------------

    def submit_many(
        self,
        ids: list[int],
        costs: list[int],
        now: float,
        hard_caps: list[int | None] | None = None,
        alone: list[bool] | None = None,
    ) -> bool:
        if (
            len(ids) != len(costs)
            or (hard_caps is not None and len(hard_caps) != len(ids))
            or (alone is not None and len(alone) != len(ids))
        ):
            raise ValueError("ids, costs, hard_caps and alone must have the same length")
        wake = False
        for i, (item_id, cost) in enumerate(zip(ids, costs, strict=True)):
            lone = alone is not None and bool(alone[i])
            self._pending.append((item_id, cost, now, None if hard_caps is None else hard_caps[i], lone))
            self._total = min(_U64, self._total + cost)
            self._last = now
            first = self._first is None
            if first:
                self._first = now
            wake = wake or first or self.flush_reason(now, False) is not None
        return wake

    def flush_reason(self, now: float, immediate: bool) -> str | None:
        if not self._pending:
            return None
        cap = self._effective_cap()
        if len(self._pending) == 1 and self._total > cap:
            return "single_oversize"
        if self._total >= cap:
            return "cost_cap"
        if len(self._pending) >= self._requests:
            return "count_cap"
        if self._first is not None and (now - self._first) * 1000.0 >= self._wait_ms:
            return "timeout"
        if self._last is not None and (now - self._last) * 1000.0 >= self.effective_coalesce_ms:
            return "coalesce"
        return "idle_bypass" if immediate else None

    def time_until_next_trigger_ms(self, now: float) -> float | None:
        if self._first is None:
            return None
        a = max(0.0, self._wait_ms - (now - self._first) * 1000.0)
        b = (
            self._coalesce_ms
            if self._last is None
            else max(0.0, self.effective_coalesce_ms - (now - self._last) * 1000.0)
        )
        return min(a, b)

    # -- extraction -----------------------------------------------------------------------------------

    def try_get_batch(self, now: float, immediate: bool) -> FormedBatch | None:
        reason = self.flush_reason(now, immediate)
        return None if reason is None else self._extract(reason, None)

    def try_drain_up_to(self, max_items: int) -> FormedBatch | None:
        if not self._pending or max_items <= 0:
            return None
        return self._extract("drain", max_items)

    def drain_all(self) -> list[int]:
        ordered = sorted(self._pending, key=lambda p: p[2])
        self._pending, self._total, self._first, self._last = [], 0, None, None
        return [p[0] for p in ordered]

    def _order_for_lanes(self) -> None:
        """§3.5 runs-alone lanes: batchable items by cost, then runs-alone ones by arrival; the lanes
        take turns, the first batch from the lane of the oldest item."""
        self._pending.sort(key=lambda p: (p[4], p[2] if p[4] else p[1]))
        h = next((i for i, p in enumerate(self._pending) if p[4]), None)
        if h is None or h == 0:
            return
        oldest_alone = min(self._pending, key=lambda p: p[2])[4]
        if oldest_alone if self._last_alone is None else not self._last_alone:
            self._pending[: h + 1] = [self._pending[h], *self._pending[:h]]

    def _extract(self, reason: str, max_items: int | None) -> FormedBatch:
        if any(p[4] for p in self._pending):
            self._order_for_lanes()
        else:
            self._pending.sort(key=lambda p: p[1])  # stable: FIFO among equal costs
        cap = self._effective_cap()
        limit = max(1, self._requests)
        most = math.inf if max_items is None else max(1, max_items)
        taken = cost = 0
        for p in self._pending:
            if taken >= most:
                break
            if p[4] and taken > 0:
                break  # never shares
            if taken > 0 and cost + p[1] > cap:
                break
            cost = min(_U64, cost + p[1])
            taken += 1
            if p[4] or taken >= limit:
                break
        if taken:
            self._last_alone = self._pending[0][4]
        ids = [p[0] for p in self._pending[:taken]]
        del self._pending[:taken]
        self._total = max(0, self._total - cost)
        arrivals = [p[2] for p in self._pending]
        self._first = min(arrivals, default=None)
        self._last = max(arrivals, default=None)
        return FormedBatch(ids, cost, reason)


def _check(requests: int, wait_ms: float, coalesce_ms: float, ratio: float) -> None:
    if any(not math.isfinite(v) or v < 0 for v in (wait_ms, coalesce_ms, ratio)):
        raise ValueError("batch wait, coalesce window and ratio must be finite and >= 0")
    if requests < 1:
        raise ValueError("max_batch_requests must be >= 1")


__all__ = ["Batcher", "FormedBatch"]
