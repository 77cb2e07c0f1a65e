# SPDX-License-Identifier: Apache-2.0
"""One model lane's §13 instruments: what needs every batch is recorded in one call a batch, what
is a current value is read when a snapshot is taken.

The dispatcher reads `batches[operation]` (`batch(operation)` on a miss or a newer catalog) and
calls its `record(...)` once a formed batch is done, a compiled call
(`wire.histogram.BatchInstruments`) that records each item's queue time and, when the backend
answered, the batch's size and cost, dispatch wait and total. The scheduler writes the cost fill
of each batch it takes into `fills` and the lane adds its starvation recoveries to `resets`: plain
stores, no call. Queue depth, the fill ratios and the adaptive controller's limits are gauges read
at snapshot time from the scheduler and the lane (`watch_queue`, `watch_controller`), as the
registry's observers. A lane without metrics (disabled) has `None` and calls nothing, so the
disabled path costs one attribute test per batch.

Why so few calls: recording ~20 Python calls a batch into gauges, dicts and histograms cost the
sidecar ~3x its instructions' share of CPU (docs/benchmarks.md, "Telemetry on").

The profile attribute comes from the model id (`model:profile`, resolved by the catalog); items'
own `profile_id` fields are not read, which would cost a decode per item.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..wire.histogram import BatchInstruments
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
from .registry import DURATION_BOUNDS_S, Attrs, Registry

#: The adaptive controller's current (wait ms, cost cap, observed p50 ms, target p50 ms); a p50 is
#: None until it has one.
AdaptiveState = tuple[float, int, float | None, float | None]


class LaneMetrics:
    """Records into `registry` with attributes resolved by `catalog`, for one model."""

    def __init__(self, registry: Registry, catalog: ModelCatalog, depth: QueueDepth, model: str) -> None:
        self._registry = registry
        self._depth = depth
        self.model = model
        #: The catalog version `attrs` and `batches` were resolved at (the dispatcher compares it
        #: with `catalog.version` inline before it reads `batches`).
        self.resolved_version = -1
        self.catalog = catalog
        self._attrs: dict[str, Attrs] = {}
        #: `batch(operation)`'s instruments by operation, valid while `resolved_version` is current.
        self.batches: dict[str, BatchInstruments] = {}
        #: The last batch's cost fill (cost / cost cap) per (operation, flush reason), written by the
        #: scheduler as it takes a batch; exported as `sie.worker.batch.fill_ratio`.
        self.fills: dict[tuple[str, str], float] = {}
        #: Starvation recoveries the lane made since the last snapshot (the lane adds to it).
        self.resets = 0
        self._controller: Callable[[], AdaptiveState] | None = None
        registry.observe(self._observe)

    def attrs(self, operation: str) -> Attrs:
        """(operation, model, profile), re-resolved when the catalog changed."""
        if self.resolved_version != self.catalog.version:
            self.resolved_version = self.catalog.version
            self._attrs.clear()
            self.batches.clear()
        found = self._attrs.get(operation)
        if found is None:
            found = self._attrs[operation] = self.catalog.attrs(operation, self.model)
        return found

    def batch(self, operation: str) -> BatchInstruments:
        """The per-batch histograms of `operation`, looked up once per catalog version. The
        dispatcher reads `batches` inline first and calls this on a miss or a newer catalog: a call
        a batch to a function run nowhere else costs its cold code and frame (docs/benchmarks.md)."""
        attrs = self.attrs(operation)  # first: it clears the cache when the catalog changed
        found = self.batches.get(operation)
        if found is None:
            registry = self._registry
            found = self.batches[operation] = BatchInstruments(
                registry.histogram(QUEUE_DURATION, attrs, DURATION_BOUNDS_S),
                registry.histogram(BATCH_SIZE, attrs),
                registry.histogram(BATCH_COST, attrs),
                registry.histogram(DISPATCH_WAIT, attrs, DURATION_BOUNDS_S),
                registry.histogram(REQUEST_BATCH_TOTAL, attrs, DURATION_BOUNDS_S),
            )
        return found

    def watch_queue(self, pending: Callable[[], Mapping[str, int]]) -> None:
        """The scheduler's items pending per operation, read for `sie.worker.queue.depth`."""
        self._depth.watch(self.model, pending)

    def watch_controller(self, state: Callable[[], AdaptiveState]) -> None:
        """The lane's adaptive controller state, read for the adaptive gauges."""
        self._controller = state

    def _observe(self, registry: Registry) -> None:
        """Snapshot time: the fill ratios, the controller's limits and p50s, the recoveries counted."""
        for (operation, reason), fill in list(self.fills.items()):
            attrs = (*self.attrs(operation), ("flush.reason", closed(reason, FLUSH_REASONS)))
            registry.gauge(BATCH_FILL_RATIO, attrs).set(fill)
        if self._controller is None:
            return
        attrs = self.attrs(OTHER)[1:]
        wait_ms, cost, p50_ms, target_p50_ms = self._controller()
        registry.gauge(ADAPTIVE_WAIT, attrs).set(wait_ms / 1000.0)
        registry.gauge(ADAPTIVE_COST, attrs).set(cost)
        for kind, value in (("observed", p50_ms), ("target", target_p50_ms)):
            if value is not None:  # a p50 gauge exists from its first value on
                registry.gauge(ADAPTIVE_P50, (*attrs, ("kind", kind))).set(value / 1000.0)
        resets, self.resets = self.resets, 0
        counter = registry.counter(STARVATION_RESETS, attrs)  # exists from the start, at 0
        if resets > 0:
            counter.add(resets)


__all__ = ["AdaptiveState", "LaneMetrics"]
