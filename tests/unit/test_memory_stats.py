"""telemetry/memory: live memory as the allocators count it, which a leak raises and fragmentation
does not; and the soak's verdict built on it."""

from __future__ import annotations

import gc

import pytest
from benches.chaos.soak import Sample, blocks_trend, flatness

from sie_sidecar.telemetry.memory import memory_stats


def test_python_blocks_count_live_objects() -> None:
    gc.collect()
    before = memory_stats()["python_blocks"]
    held = [object() for _ in range(50_000)]
    # Not `>= 50_000`: the count is process-wide, and an object an earlier test left to a finalizer
    # or another thread may be freed meanwhile (a full run read 49,999).
    assert memory_stats()["python_blocks"] - before >= 45_000
    del held
    gc.collect()
    assert memory_stats()["python_blocks"] - before < 5_000


def test_c_heap_in_use_counts_a_large_block_until_it_is_freed() -> None:
    before = memory_stats()
    if "in_use_bytes" not in before:
        pytest.skip("not glibc: only the Python count is there")
    block = bytearray(8 << 20)  # in use either way: a heap chunk or an mmapped block, by the threshold
    during = memory_stats()
    assert during["in_use_bytes"] - before["in_use_bytes"] >= 8 << 20
    del block
    assert memory_stats()["in_use_bytes"] - before["in_use_bytes"] < 1 << 20


def samples(rss: list[float], blocks: list[int]) -> list[Sample]:
    return [
        Sample(t=10.0 * i, pod=0, pid=1, rss_mb=r, fds=12, python_blocks=b)
        for i, (r, b) in enumerate(zip(rss, blocks, strict=True))
    ]


def test_flat_rss_with_growing_python_blocks_fails() -> None:
    """A leak the allocator's free space hides from RSS still fails the soak."""
    flat_rss = [40.0] * 90
    leaking = [100_000 + 500 * i for i in range(90)]
    (verdict,) = flatness(samples(flat_rss, leaking), 60.0, 10.0, 8, 600.0).values()
    assert verdict["rss_ok"] and not verdict["live_ok"] and not verdict["ok"]


def test_fragmentation_alone_passes_the_live_check() -> None:
    """RSS a little up, live memory flat: the live check passes, RSS is judged by its own allowance."""
    creeping_rss = [40.0 + 0.02 * i for i in range(90)]
    steady = [100_000 + (i % 3) * 100 for i in range(90)]
    (verdict,) = flatness(samples(creeping_rss, steady), 60.0, 10.0, 8, 600.0).values()
    assert verdict["live_ok"] and verdict["rss_ok"] and verdict["ok"]
    (strict,) = flatness(samples(creeping_rss, steady), 60.0, 1.0, 8, 600.0).values()
    assert not strict["rss_ok"] and strict["live_ok"]


def test_old_samples_without_live_memory_are_judged_on_rss_and_fds() -> None:
    old = [Sample(t=10.0 * i, pod=0, pid=1, rss_mb=40.0, fds=12) for i in range(90)]
    (verdict,) = flatness(old, 60.0, 10.0, 8, 600.0).values()
    assert verdict["ok"] and "python_blocks_median" not in verdict


def held_samples(blocks: list[int], held: list[int]) -> list[Sample]:
    return [
        Sample(t=10.0 * i, pod=0, pid=1, rss_mb=40.0, fds=12, python_blocks=b, held=h)
        for i, (b, h) in enumerate(zip(blocks, held, strict=True))
    ]


def test_blocks_that_follow_the_backlog_pass() -> None:
    """~13 blocks per held message (what the census found), the backlog rising for half the run and
    falling back: the blocks swing by 3,400, yet nothing leaks."""
    held = [100 + 6 * min(i, 89 - i) + (7 if i % 2 else -7) for i in range(90)]
    blocks = [135_000 + 13 * h for h in held]
    (verdict,) = flatness(held_samples(blocks, held), 60.0, 10.0, 8, 600.0).values()
    assert verdict["python_blocks_per_held"] == pytest.approx(13.0, abs=0.1)
    assert abs(verdict["python_blocks_trend"]) < 10
    assert verdict["python_blocks_trend_ok"] and verdict["live_ok"] and verdict["ok"]


def test_a_backlog_that_rises_with_time_is_charged_to_time() -> None:
    """Held messages rising in step with time cannot be told from a leak: the fit charges the growth
    to time and fails (safe), rather than splitting it arbitrarily."""
    held = [100 + 3 * i + (7 if i % 2 else -7) for i in range(90)]
    blocks = [135_000 + 13 * h for h in held]
    (verdict,) = flatness(held_samples(blocks, held), 60.0, 10.0, 8, 600.0).values()
    assert verdict["python_blocks_per_held"] == 0.0
    assert verdict["python_blocks_trend"] > 2_000 and not verdict["python_blocks_trend_ok"]


def test_a_leak_under_a_varying_backlog_fails_by_its_trend() -> None:
    """1 block per 50 items at 180 items/s (3.6 blocks/s), hidden in a backlog that swings by 1,300
    blocks: 2.2% over 14 minutes, under the 10% allowance of the median check, over the 1% trend check."""
    held = [150 + (100 if i % 4 < 2 else -100) for i in range(90)]
    blocks = [135_000 + 13 * h + int(3.6 * 10.0 * i) for i, h in enumerate(held)]
    (verdict,) = flatness(held_samples(blocks, held), 60.0, 10.0, 8, 600.0).values()
    assert verdict["python_blocks_trend"] == pytest.approx(3.6 * (890 - 60), rel=0.05)
    assert not verdict["python_blocks_trend_ok"] and not verdict["live_ok"] and not verdict["ok"]
    assert verdict["rss_ok"]


def test_blocks_trend_needs_six_points_and_handles_a_constant_backlog() -> None:
    few = held_samples([1, 2, 3, 4, 5], [0] * 5)
    assert blocks_trend(few) is None
    constant = held_samples([100 + 2 * i for i in range(10)], [7] * 10)
    trend = blocks_trend(constant)
    assert trend is not None
    assert trend[0] == 0.0 and trend[1] == pytest.approx(0.2)
