# SPDX-License-Identifier: Apache-2.0
"""Twin of `_native.Histogram`: the telemetry registry's explicit-bucket histogram (count, sum, min,
max, bucket counts over fixed upper bounds). The registry uses the compiled one (`wire.histogram`):
a batch's 64 queue times cost ~6 µs here and ~0.5 µs there (docs/benchmarks.md)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from typing import Final

IMPLEMENTATION = "py"
Attrs = tuple[tuple[str, str], ...]


class Histogram:
    """Bucket counts over fixed bounds, plus count, sum, min and max (an explicit-bucket histogram)."""

    __slots__ = ("attrs", "bounds", "buckets", "count", "max", "min", "name", "sum")
    kind: Final = "histogram"

    def __init__(self, name: str, attrs: Attrs, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram {name} bounds must be strictly increasing")
        self.name, self.attrs = name, attrs
        self.bounds: tuple[float, ...] = tuple(bounds)
        self.buckets = [0] * (len(self.bounds) + 1)  # the last one is (bounds[-1], +inf)
        self.count = 0
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf

    def record(self, value: float) -> None:
        self.buckets[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value
        # Comparisons, not min()/max(): the two builtin calls were a third of a record's cost.
        if value < self.min:  # noqa: PLR1730
            self.min = value
        if value > self.max:  # noqa: PLR1730
            self.max = value

    def record_n(self, value: float, n: int) -> None:
        """`n` observations of one value (a batch whose items share it), in one step."""
        if n <= 0:
            return
        self.buckets[bisect.bisect_left(self.bounds, value)] += n
        self.count += n
        self.sum += value * n
        self.min = min(self.min, value)
        self.max = max(self.max, value)

    def record_many(self, values: Iterable[float]) -> None:
        """One observation per value: a batch's items at once, with one attribute lookup for all.

        Sorted first (in C), the values fill each bucket they reach with one bisect, so the
        Python work is per bucket reached, not per value: a batch's queue times span a few
        buckets, and a per-value `bisect` loop was most of the metrics-on CPU (docs/benchmarks.md)."""
        ordered = sorted(values)
        if not ordered:
            return
        buckets, bounds, n = self.buckets, self.bounds, len(ordered)
        last = len(bounds)
        lo, b = 0, bisect.bisect_left(bounds, ordered[0])
        while b < last:
            hi = bisect.bisect_right(ordered, bounds[b], lo)  # bucket b holds (bounds[b-1], bounds[b]]
            buckets[b] += hi - lo
            if hi == n:
                break
            lo, b = hi, bisect.bisect_left(bounds, ordered[hi], b + 1)
        else:
            buckets[last] += n - lo
        self.count += n
        self.sum += math.fsum(ordered)
        self.min = min(self.min, ordered[0])
        self.max = max(self.max, ordered[-1])


class BatchInstruments:
    """A model lane's per-batch histograms for one operation, recorded in one call a batch (the
    twin of `_native.BatchInstruments`)."""

    __slots__ = ("cost", "dispatch_wait", "queue_duration", "size", "total")

    def __init__(
        self, queue_duration: Histogram, size: Histogram, cost: Histogram, dispatch_wait: Histogram, total: Histogram
    ) -> None:
        self.queue_duration, self.size, self.cost = queue_duration, size, cost
        self.dispatch_wait, self.total = dispatch_wait, total

    def record(  # noqa: PLR0917  (positional, as the compiled one's: one call a batch)
        self,
        enqueued_at: Iterable[float],
        taken_at: float,
        items: int,
        cost: int,
        dispatched: float,
        answered: float | None = None,
    ) -> float | None:
        """Each item's queue time (`taken_at - t`) and, when the backend answered, the batch's size,
        cost and its oldest item's enqueue → `dispatched` and → `answered`. Returns the oldest
        enqueue time (None for no items)."""
        times = list(enqueued_at)
        self.queue_duration.record_many([taken_at - t for t in times])
        oldest = min(times) if times else None
        if answered is not None:
            first = dispatched if oldest is None else oldest
            self.size.record(float(items))
            self.cost.record(float(cost))
            self.dispatch_wait.record(dispatched - first)
            self.total.record(answered - first)
        return oldest


__all__ = ["IMPLEMENTATION", "BatchInstruments", "Histogram"]
