# SPDX-License-Identifier: Apache-2.0
"""What metrics-on recording costs one 64-item batch (issue 14): everything the pipeline records per
batch when `SIE_METRICS_ENABLED` is true (the cost fill, each item's queue time, batch size/cost,
dispatch wait and total, the IPC request count, duration and pool wait; queue depth and the
controller's gauges are read at export, not per batch), with the registry's histograms compiled
(`_native.Histogram` and `BatchInstruments`, as shipped) and as their twins (`_twins.histogram`),
side by side. The e2e figure this is a share of:
the sidecar spends ~13 µs of CPU per item, ~830 µs per 64-item batch (docs/benchmarks.md)."""

from __future__ import annotations

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from sie_sidecar import wire
from sie_sidecar._twins import histogram as twin_histogram
from sie_sidecar.telemetry import (
    BATCH_SIZE,
    IPC_ACQUIRE_DURATION,
    IPC_REQUEST_DURATION,
    IPC_REQUESTS,
    QUEUE_DEPTH,
    QUEUE_DURATION,
    ModelCatalog,
    QueueDepth,
    Registry,
)
from sie_sidecar.telemetry import lane_metrics as lane_metrics_module
from sie_sidecar.telemetry import (
    registry as registry_module,
)
from sie_sidecar.telemetry.lane_metrics import LaneMetrics
from sie_sidecar.telemetry.registry import DURATION_BOUNDS_S

ITEMS = 64
MODEL = "org/model-a"


@pytest.mark.parametrize("histograms", ["compiled", "twin"])
def test_metrics_recording_per_64_item_batch(
    benchmark: BenchmarkFixture, histograms: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if histograms == "twin":
        monkeypatch.setattr(registry_module, "Histogram", twin_histogram.Histogram)
        monkeypatch.setattr(lane_metrics_module, "BatchInstruments", twin_histogram.BatchInstruments)
    elif not wire.USING_NATIVE:
        pytest.skip("the compiled histogram")
    benchmark.group = f"metrics on: one {ITEMS}-item batch's recording"
    registry = Registry()
    catalog = ModelCatalog([MODEL])
    lane = LaneMetrics(registry, catalog, QueueDepth(registry, catalog, QUEUE_DEPTH), MODEL)
    enqueued = [100.0 + i * 0.0002 for i in range(ITEMS)]  # arrivals over ~13 ms, as a 64-item batch forms
    now = 100.02
    ipc_attrs = (("method", "run_batch"), ("outcome", "ok"), ("transport", "pool"))

    def record() -> None:  # the pipeline's work for one batch, in its order
        lane.fills["encode", "cost_cap"] = ITEMS / ITEMS  # the scheduler takes the batch
        registry.histogram(IPC_ACQUIRE_DURATION, (("transport", "pool"),), DURATION_BOUNDS_S).record(0.00001)
        registry.add(IPC_REQUESTS, 1, ipc_attrs)
        registry.histogram(IPC_REQUEST_DURATION, ipc_attrs, DURATION_BOUNDS_S).record(0.004)
        lane.batch("encode").record(enqueued, now, ITEMS, ITEMS, now + 0.001, now + 0.005)

    benchmark(record)
    queued = registry.histogram(QUEUE_DURATION, lane.attrs("encode"), DURATION_BOUNDS_S)
    assert queued.count % ITEMS == 0 and queued.count > 0
    assert sum(queued.buckets) == queued.count
    sizes = registry.histogram(BATCH_SIZE, lane.attrs("encode"))
    assert sizes.count == queued.count // ITEMS and sizes.sum == queued.count
