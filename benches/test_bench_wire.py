# SPDX-License-Identifier: Apache-2.0
"""Wire-core benchmarks: every case runs for the native core and the pure-Python twin in one run
(`make bench`), so the report compares ratios measured side by side."""

from __future__ import annotations

import hashlib
from types import ModuleType

import numpy as np
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from .payloads import MiB, chunked_response, run_batch_response

READ_SIZE = 64 * 1024


@pytest.mark.benchmark(group="ipc: split + decode a 256-item RunBatch response")
def test_split_and_decode_run_batch(benchmark: BenchmarkFixture, impl: ModuleType) -> None:
    frame = run_batch_response()
    reads = [frame[i : i + READ_SIZE] for i in range(0, len(frame), READ_SIZE)]

    def run() -> int:
        splitter = impl.FrameSplitter()
        bodies = []
        for read in reads:
            bodies += splitter.feed(read)
        env = impl.decode_response(bodies[0])
        outcome = impl.decode_batch_outcome(impl.response_body(env, "w-17"))
        return len(outcome.outcomes)

    assert benchmark(run) == 256


_ENVELOPE, _FRAMES = chunked_response()


@pytest.mark.benchmark(group="ipc: reassemble a 128 MiB chunked response")
def test_reassemble_128mib(benchmark: BenchmarkFixture, impl: ModuleType) -> None:
    budget = impl.ResponseBudget()  # one per process in production, so it persists across transfers

    def run() -> int:
        asm = impl.IpcChunkAssembler("w-1", budget=budget)
        done = None
        for frame in _FRAMES:
            done = asm.feed(impl.decode_response(frame))
        assert done is not None
        size = len(done)
        done.release()
        return size

    assert benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1) == 128 * MiB


@pytest.mark.benchmark(group="ipc: reassemble a 128 MiB chunked response")
def test_sha256_floor_128mib(benchmark: BenchmarkFixture) -> None:
    """The floor: hashlib.sha256 alone over the same 128 MiB."""
    assert len(benchmark.pedantic(lambda: hashlib.sha256(_ENVELOPE).digest(), rounds=5, iterations=1)) == 32


_MATRIX = np.random.default_rng(3).standard_normal((256, 1024)).astype(np.float32)


@pytest.mark.benchmark(group="outputs: dense framing of 256 x 1024 float32")
def test_frame_dense_batch(benchmark: BenchmarkFixture, impl: ModuleType) -> None:
    out = benchmark(impl.frame_dense_batch, _MATRIX)
    assert len(out) == 256


@pytest.mark.benchmark(group="outputs: dense framing of 256 x 1024 float32")
def test_frame_dense_per_item(benchmark: BenchmarkFixture, impl: ModuleType) -> None:
    out = benchmark(lambda: [impl.frame_dense(row) for row in _MATRIX])
    assert len(out) == 256


@pytest.mark.benchmark(group="outputs: dense framing of 256 x 1024 float32")
def test_memcpy_floor_dense(benchmark: BenchmarkFixture) -> None:
    """The floor: one copy of the 1 MiB array into a new bytes object."""
    assert len(benchmark(_MATRIX.tobytes)) == 256 * 1024 * 4


@pytest.mark.benchmark(group="tombstones: is_cancelled on a full set (100,000 entries)")
def test_tombstone_lookup(benchmark: BenchmarkFixture, impl: ModuleType) -> None:
    tombstones = impl.TombstoneSet()
    for i in range(100_000):
        tombstones.record("gw-1", f"req-{i}")
    assert len(tombstones) == 100_000
    is_cancelled = tombstones.is_cancelled
    keys = [f"req-{i}" for i in range(0, 100_000, 97)] + [f"other-{i}" for i in range(1000)]

    def run() -> int:
        hits = 0
        for key in keys:
            hits += is_cancelled("gw-1", key)
        return hits

    assert benchmark(run) == len(range(0, 100_000, 97))


@pytest.mark.benchmark(group="tombstones: is_cancelled on a full set (100,000 entries)")
def test_tombstone_loop_floor(benchmark: BenchmarkFixture) -> None:
    """The floor: the same Python loop calling a dict lookup (what any implementation pays)."""
    d = {("gw-1", f"req-{i}"): 1.0 for i in range(100_000)}
    get = d.get
    keys = [f"req-{i}" for i in range(0, 100_000, 97)] + [f"other-{i}" for i in range(1000)]

    def run() -> int:
        hits = 0
        for key in keys:
            hits += get(("gw-1", key)) is not None
        return hits

    assert benchmark(run) == len(range(0, 100_000, 97))
