# SPDX-License-Identifier: Apache-2.0
"""Batch formation cost per item: the native former against the pure-Python twin, side by side.

One round = submit 1,024 items in groups of 64 (one `submit_many` per group, as the dispatcher does)
and take batches until the former is empty (`try_get_batch`, then drains), with random costs under a
16,384 cap and the v0.7.1 count cap of 12, so the packing sort and the caps do real work. Time per
item = round time / 1,024."""

from __future__ import annotations

import random
from types import ModuleType

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from sie_sidecar import _native as native_mod
from sie_sidecar._twins import batcher as _batcher_py

ITEMS = 1024
GROUP = 64
_rng = random.Random(7)
_COSTS = [_rng.randint(1, 512) for _ in range(ITEMS)]
_GROUPS = [(list(range(i, i + GROUP)), _COSTS[i : i + GROUP]) for i in range(0, ITEMS, GROUP)]


@pytest.fixture(params=["native", "py"])
def former_impl(request: pytest.FixtureRequest) -> ModuleType:
    return native_mod if request.param == "native" else _batcher_py


def _form(impl: ModuleType) -> int:
    b = impl.Batcher()
    formed = 0
    now = 0.0
    for ids, costs in _GROUPS:
        b.submit_many(ids, costs, now)
        batch = b.try_get_batch(now, False)
        while batch is not None:
            formed += len(batch.ids)
            batch = b.try_drain_up_to(GROUP)
        now += 0.001
    while (batch := b.try_drain_up_to(GROUP)) is not None:
        formed += len(batch.ids)
    return formed


@pytest.mark.benchmark(group="batch formation: 1,024 items in groups of 64")
def test_formation(benchmark: BenchmarkFixture, former_impl: ModuleType) -> None:
    assert benchmark(_form, former_impl) == ITEMS
