# SPDX-License-Identifier: Apache-2.0
"""What metrics-on recording costs one 64-item batch (issue 14): everything the pipeline records per
batch when `SIE_METRICS_ENABLED` is true (queue depth in and out, each item's queue time, the cost
fill, batch size/cost, dispatch wait and total, the IPC request count, duration and pool wait),
with the queue times recorded two ways side by side: `record_many` as shipped (sorted, one bisect per
bucket reached) and the per-value `bisect` loop it replaced. The e2e figure this is a share of: the
sidecar spends ~13 µs of CPU per item, ~830 µs per 64-item batch (docs/benchmarks.md)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from sie_sidecar.telemetry import (
    BATCH_FILL_RATIO,
    IPC_ACQUIRE_DURATION,
    IPC_REQUEST_DURATION,
    IPC_REQUESTS,
    QUEUE_DEPTH,
    QUEUE_DURATION,
    ModelCatalog,
    QueueDepth,
    Registry,
)
from sie_sidecar.telemetry.catalog import FLUSH_REASONS, closed
from sie_sidecar.telemetry.lane_metrics import LaneMetrics
from sie_sidecar.telemetry.registry import DURATION_BOUNDS_S, Histogram

ITEMS = 64
MODEL = "org/model-a"


def per_value(histogram: Histogram, values: Sequence[float]) -> None:
    """The loop `record_many` replaced: one bisect and one list store per value."""
    buckets, bounds, where = histogram.buckets, histogram.bounds, bisect.bisect_left
    for value in values:
        buckets[where(bounds, value)] += 1
    histogram.count += len(values)
    histogram.sum += math.fsum(values)
    histogram.min = min(histogram.min, *values)
    histogram.max = max(histogram.max, *values)


@pytest.mark.parametrize("queue_times", ["record_many", "per-value"])
def test_metrics_recording_per_64_item_batch(benchmark: BenchmarkFixture, queue_times: str) -> None:
    benchmark.group = f"metrics on: one {ITEMS}-item batch's recording"
    registry = Registry()
    catalog = ModelCatalog([MODEL])
    lane = LaneMetrics(registry, catalog, QueueDepth(registry, catalog, QUEUE_DEPTH), MODEL)
    enqueued = [100.0 + i * 0.0002 for i in range(ITEMS)]  # arrivals over ~13 ms, as a 64-item batch forms
    now = 100.02
    ipc_attrs = (("method", "run_batch"), ("outcome", "ok"), ("transport", "pool"))

    def taken_per_value() -> None:  # LaneMetrics.taken as it was, with the loop above
        attrs = lane.attrs("encode")
        lane.left("encode", ITEMS)  # the depth move `taken` makes
        per_value(registry.histogram(QUEUE_DURATION, attrs, DURATION_BOUNDS_S), [now - at for at in enqueued])
        registry.gauge(BATCH_FILL_RATIO, (*attrs, ("flush.reason", closed("full", FLUSH_REASONS)))).set(1.0)

    def record() -> None:  # the pipeline's calls for one batch, in its order
        lane.queued("encode", ITEMS)
        if queue_times == "per-value":
            taken_per_value()
        else:
            lane.taken("encode", enqueued, ITEMS, ITEMS, reason="full", now=now)
        registry.histogram(IPC_ACQUIRE_DURATION, (("transport", "pool"),), DURATION_BOUNDS_S).record(0.00001)
        registry.add(IPC_REQUESTS, 1, ipc_attrs)
        registry.histogram(IPC_REQUEST_DURATION, ipc_attrs, DURATION_BOUNDS_S).record(0.004)
        lane.executed("encode", ITEMS, ITEMS, 0.013, 0.02)

    benchmark(record)
    queued = registry.histogram(QUEUE_DURATION, lane.attrs("encode"), DURATION_BOUNDS_S)
    assert queued.count % ITEMS == 0 and queued.count > 0
    assert sum(queued.buckets) == queued.count
    assert registry.total(QUEUE_DEPTH) == 0  # in and out per round
