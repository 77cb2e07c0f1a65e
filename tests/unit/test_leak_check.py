# SPDX-License-Identifier: Apache-2.0
"""The leak check's verdict on synthetic samples: the fit, the threshold, the warm-up cut and the fds."""

from __future__ import annotations

import pytest
from benches.leak_check import MIB, Sample, judge

ITEMS = 1_000_000
STEP = 20_000  # one sample per 20,000 items: 51 samples


def series(bytes_per_item: float, *, base_mb: float = 40.0, warmup_mb: float = 0.0, fds: int = 12) -> list[Sample]:
    """RSS `base_mb` + a linear leak; `warmup_mb` more is gained over the first 20% of the items only."""
    out = []
    for k, items in enumerate(range(0, ITEMS + 1, STEP)):
        warm = warmup_mb * min(1.0, items / (0.2 * ITEMS))
        jitter = 0.05 * (1 if k % 2 else -1)  # +-50 kB: page-granular noise between samples
        out.append(Sample(float(k), items, items, base_mb + warm + jitter + bytes_per_item * items / MIB, fds))
    return out


def test_flat_series_passes() -> None:
    verdict = judge(series(0.0), warmup_fraction=0.2, max_slope=2.0, fd_growth=2)
    assert verdict.checked and verdict.ok, verdict.reasons
    assert verdict.slope_bytes_per_item is not None
    assert abs(verdict.slope_bytes_per_item) < 0.2
    assert verdict.rss_warmup_end_mb == pytest.approx(40.0, abs=0.1)
    assert verdict.fds_warmup_end == verdict.fds_end == 12


def test_linear_leak_fails_with_its_slope() -> None:
    verdict = judge(series(15.0), warmup_fraction=0.2, max_slope=2.0, fd_growth=2)
    assert verdict.checked and not verdict.ok
    assert verdict.slope_bytes_per_item == pytest.approx(15.0, abs=0.2)
    assert verdict.late_slope_bytes_per_item == pytest.approx(15.0, abs=0.5)
    assert verdict.fitted_growth_mb == pytest.approx(15.0 * 0.8 * ITEMS / MIB, rel=0.02)
    assert any("slope" in reason for reason in verdict.reasons)


def test_leak_just_under_the_threshold_passes() -> None:
    assert judge(series(1.5), warmup_fraction=0.2, max_slope=2.0, fd_growth=2).ok


def test_warmup_is_excluded() -> None:
    """20 MB gained in the first 20% of the items: judged from there it is flat, judged from 0 it is not."""
    warming = series(0.0, warmup_mb=20.0)
    verdict = judge(warming, warmup_fraction=0.2, max_slope=2.0, fd_growth=2)
    assert verdict.ok, verdict.reasons
    assert verdict.warmup_items == 200_000
    assert verdict.judged_samples == 41
    assert verdict.rss_warmup_end_mb == pytest.approx(60.0, abs=0.1)
    assert not judge(warming, warmup_fraction=0.0, max_slope=2.0, fd_growth=2).ok


def test_growing_fds_fail() -> None:
    samples = series(0.0)
    for k, sample in enumerate(samples):
        sample.fds = 12 + k // 10  # one more descriptor every 200,000 items
    verdict = judge(samples, warmup_fraction=0.2, max_slope=2.0, fd_growth=2)
    assert not verdict.ok
    assert any("fds" in reason for reason in verdict.reasons)


def test_one_transient_fd_at_the_end_passes() -> None:
    samples = series(0.0)
    samples[-1].fds += 3
    assert judge(samples, warmup_fraction=0.2, max_slope=2.0, fd_growth=2).ok


def test_too_few_samples_are_not_judged() -> None:
    verdict = judge(series(0.0)[:3], warmup_fraction=0.2, max_slope=2.0, fd_growth=2)
    assert not verdict.checked and not verdict.ok
    assert not judge([], warmup_fraction=0.2, max_slope=2.0, fd_growth=2).checked
