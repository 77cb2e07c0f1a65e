# SPDX-License-Identifier: Apache-2.0
"""One model lane's §13 instruments, recorded once per group or batch where the decision is made.

The scheduler calls `queued` when a group joins a former and `taken` when a batch leaves it (queue
depth, queue duration, fill ratio by flush reason); the dispatcher calls `executed` when the
backend answered (batch size and cost, dispatch wait and total); the lane calls
`adapted` after each controller step (adaptive gauges, starvation resets). A lane without metrics
(disabled) has `None` and calls nothing, so the disabled path costs one attribute test per batch.

The profile attribute comes from the model id (`model:profile`, resolved by the catalog); items'
own `profile_id` fields are not read, which would cost a decode per item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .catalog import FLUSH_REASONS, OTHER, ModelCatalog, QueueDepth, closed
from .names import (
    ADAPTIVE_COST,
    ADAPTIVE_P50,
    ADAPTIVE_WAIT,
    BATCH_COST,
    BATCH_FILL_RATIO,
    BATCH_SIZE,
    DISPATCH_WAIT,
    QUEUE_DURATION,
    REQUEST_BATCH_TOTAL,
    STARVATION_RESETS,
)
from .registry import DURATION_BOUNDS_S, Attrs, Gauge, Histogram, Registry


@dataclass(frozen=True, slots=True)
class _BatchInstruments:
    queue_duration: Histogram
    size: Histogram
    cost: Histogram
    dispatch_wait: Histogram
    total: Histogram


class LaneMetrics:
    """Records into `registry` with attributes resolved by `catalog`, for one model."""

    def __init__(self, registry: Registry, catalog: ModelCatalog, depth: QueueDepth, model: str) -> None:
        self._registry = registry
        self._catalog = catalog
        self._depth = depth
        self.model = model
        self._version = -1
        self._attrs: dict[str, Attrs] = {}
        self._batch: dict[str, _BatchInstruments] = {}
        self._fill: dict[tuple[str, str], Gauge] = {}
        self._adaptive: tuple[int, Gauge, Gauge, dict[str, Gauge], Attrs] | None = None

    def attrs(self, operation: str) -> Attrs:
        """(operation, model, profile), re-resolved when the catalog changed."""
        if self._version != self._catalog.version:
            self._version = self._catalog.version
            self._attrs.clear()
            self._batch.clear()
            self._fill.clear()
        found = self._attrs.get(operation)
        if found is None:
            found = self._attrs[operation] = self._catalog.attrs(operation, self.model)
        return found

    def _instruments(self, operation: str) -> _BatchInstruments:
        """The per-batch histograms of `operation`, looked up once per catalog version (five
        registry lookups per batch were half of the recording's cost)."""
        attrs = self.attrs(operation)  # first: it clears the cache when the catalog changed
        found = self._batch.get(operation)
        if found is None:
            registry = self._registry
            found = self._batch[operation] = _BatchInstruments(
                queue_duration=registry.histogram(QUEUE_DURATION, attrs, DURATION_BOUNDS_S),
                size=registry.histogram(BATCH_SIZE, attrs),
                cost=registry.histogram(BATCH_COST, attrs),
                dispatch_wait=registry.histogram(DISPATCH_WAIT, attrs, DURATION_BOUNDS_S),
                total=registry.histogram(REQUEST_BATCH_TOTAL, attrs, DURATION_BOUNDS_S),
            )
        return found

    def queued(self, operation: str, n: int) -> None:
        self._depth.move(operation, self.model, "", n)

    def taken(
        self, operation: str, enqueued_at: Sequence[float], cost: int, cost_cap: int, *, reason: str, now: float
    ) -> float | None:
        """A batch left its former: depth down, each item's queue time, the cost fill under its flush
        reason. Returns the longest queue time (None for no items): the dispatcher's oldest item."""
        self._depth.move(operation, self.model, "", -len(enqueued_at))
        waited = self._instruments(operation).queue_duration.record_since(now, enqueued_at)
        if cost_cap > 0:
            fill = self._fill.get((operation, reason))  # valid: `_instruments` cleared it on a catalog change
            if fill is None:
                attrs = (*self.attrs(operation), ("flush.reason", closed(reason, FLUSH_REASONS)))
                fill = self._fill[(operation, reason)] = self._registry.gauge(BATCH_FILL_RATIO, attrs)
            fill.set(cost / cost_cap)
        return waited

    def left(self, operation: str, n: int) -> None:
        """Items handed back unsent at shutdown leave the queue too."""
        self._depth.move(operation, self.model, "", -n)

    def executed(self, operation: str, items: int, cost: int, dispatch_wait_s: float, total_s: float) -> None:
        """The backend answered a batch: its size and cost; its oldest item's enqueue → dispatch
        (`request_batch.dispatch_wait`) and enqueue → answer (`request_batch.total`)."""
        instruments = self._instruments(operation)
        instruments.size.record(items)
        instruments.cost.record(cost)
        instruments.dispatch_wait.record(dispatch_wait_s)
        instruments.total.record(total_s)

    def adapted(
        self, wait_ms: float, cost: int, *, p50_ms: float | None, target_p50_ms: float | None, resets: int
    ) -> None:
        """The adaptive controller stepped: its wait, cost cap, observed / target p50, and the
        starvation recoveries (`resets`: how many this step made)."""
        found = self._adaptive
        if found is None or found[0] != self._catalog.version:  # looked up once per catalog version
            attrs = self.attrs(OTHER)[1:]
            found = self._adaptive = (
                self._catalog.version,
                self._registry.gauge(ADAPTIVE_WAIT, attrs),
                self._registry.gauge(ADAPTIVE_COST, attrs),
                {},
                attrs,
            )
        _, wait, cost_cap, p50, attrs = found
        wait.set(wait_ms / 1000.0)
        cost_cap.set(cost)
        for kind, value in (("observed", p50_ms), ("target", target_p50_ms)):
            if value is not None:  # a p50 gauge exists from its first value on
                gauge = p50.get(kind)
                if gauge is None:
                    gauge = p50[kind] = self._registry.gauge(ADAPTIVE_P50, (*attrs, ("kind", kind)))
                gauge.set(value / 1000.0)
        if resets > 0:
            self._registry.counter(STARVATION_RESETS, attrs).add(resets)


__all__ = ["LaneMetrics"]
