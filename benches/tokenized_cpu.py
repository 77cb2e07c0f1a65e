# SPDX-License-Identifier: Apache-2.0
"""Tokenized work (issue 30): the sidecar's CPU per item when the backend's descriptor names
all-MiniLM-L6-v2's tokenizer, against encoding the same texts alone through `tokenizers`' `encode_batch`.

Why: with a tokenizer the sidecar does real work per item (it tokenizes every encode text, costs it by
its tokens and, when the backend's tokenizer identity is its own, sends the tokens as PreparedTokens).
The question is what the sidecar adds to the tokenizer's own cost. Texts are 200-1,500 bytes of words,
as gateway-shaped WorkItems scanned from `MSG` frames (benches/pipeline_cpu.py), against the null
backend over its real socket. Three figures, in one process, rounds alternating:

- `encode_batch alone`: the registered tokenizer's library object (same truncation), `encode_batch`
  over the same texts in 64-item batches, nothing else;
- `sidecar, prepared_tokens`: the backend declares the tokenizer's SHA-256 (the sidecar's identity), so
  every item is tokenized, costed and sent with its tokens;
- `sidecar, cost_only`: the backend declares upstream's 32-hex form, which the sidecar cannot verify:
  it tokenizes only to cost the items and sends no tokens (docs/interop.md).

`--estimate` also measures the cheaper cost estimate a cost-only sidecar could use instead of
tokenizing: per text, its estimate against its true token count (after truncation), and the share of
64-item batches whose estimated total undershoots the true one (a batch over the backend's token
budget) or overshoots it by more than 25 % (a batch smaller than it could be).

Run from the repository root: `python benches/tokenized_cpu.py [--items 4000] [--rounds 3] [--estimate]`.
CPU counts every thread of this process (the tokenizer's own threads included).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benches.null_backend import null_backend
from benches.pipeline_cpu import MODEL, _rounds, gateway_frames
from sie_sidecar.ipc.types import ModelDescriptor
from sie_sidecar.prep import TokenizerRegistry
from sie_sidecar.tools.loadgen import DEFAULT_TEXTS

#: What upstream's backends declare: 32 hex characters of a BLAKE3 hash, which no sidecar here verifies.
FOREIGN_ID = "0123456789abcdef0123456789abcdef"
BATCH = 64
MAX_SEQ_LEN = 512  # what the null backend's descriptor declares


def word_texts(count: int = 1024, *, min_bytes: int = 200, max_bytes: int = 1500, seed: int = 0) -> tuple[str, ...]:
    """`count` texts of words (from the load generator's sentences), each 200-1,500 bytes, seeded."""
    words = [w for text in DEFAULT_TEXTS for w in text.split()]
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        target = rng.randint(min_bytes, max_bytes)
        parts: list[str] = []
        size = -1
        while size + 1 + len(words[0]) <= target:
            word = rng.choice(words)
            if size + 1 + len(word.encode()) > target:
                break
            parts.append(word)
            size += 1 + len(word.encode())
        out.append(" ".join(parts))
    return tuple(out)


def tokenizer_path() -> Path:
    from sie_sidecar.backend.minilm import find_model_dir

    return find_model_dir() / "tokenizer.json"


def encode_batch_alone(texts: Sequence[str], n: int, method: str = "encode_batch") -> float:
    """µs of this process's CPU per text: `encode_batch` (or `method`, e.g. `encode_batch_fast`, what the
    sidecar calls: no character offsets) of `n` texts in 64-text batches."""
    registered = TokenizerRegistry().register(
        MODEL, ModelDescriptor(tokenizer_path=str(tokenizer_path()), max_seq_len=MAX_SEQ_LEN)
    )
    assert registered is not None
    encode = getattr(registered.tokenizer, method)
    batches = [[texts[(s + i) % len(texts)] for i in range(min(BATCH, n - s))] for s in range(0, n, BATCH)]
    encode(batches[0])
    cpu = time.process_time()
    for batch in batches:
        encode(batch)
    return (time.process_time() - cpu) / n * 1e6


async def sidecar(texts: Sequence[str], n: int, rounds: int, declared: str | None) -> list[float]:
    """µs of this process's CPU per item through the pipeline, the backend declaring `declared`."""
    extra = ["--tokenizer", str(tokenizer_path())]
    if declared is not None:
        extra += ["--declared-tokenizer-id", declared]
    async with null_backend(MODEL, *extra) as sock:
        return await _rounds(sock, n, rounds, work="gateway", frames_of=lambda k, tag: gateway_frames(k, tag, texts))


def estimate_quality(texts: Sequence[str]) -> dict[str, float]:
    """A bytes-based estimate (UTF-8 bytes / 4 + 2, capped at max_seq_len) against the true tokens."""
    registered = TokenizerRegistry().register(
        MODEL, ModelDescriptor(tokenizer_path=str(tokenizer_path()), max_seq_len=MAX_SEQ_LEN)
    )
    assert registered is not None
    true = [len(e.ids) for e in registered.tokenizer.encode_batch(list(texts))]
    est = [min(MAX_SEQ_LEN, len(t.encode()) // 4 + 2) for t in texts]
    ratios = sorted(e / t for e, t in zip(est, true, strict=True))
    under = over = 0
    n_batches = 0
    for s in range(0, len(texts) - BATCH + 1, BATCH):
        t_sum, e_sum = sum(true[s : s + BATCH]), sum(est[s : s + BATCH])
        n_batches += 1
        under += e_sum < t_sum
        over += e_sum > 1.25 * t_sum
    return {
        "ratio_p5": ratios[len(ratios) // 20],
        "ratio_p50": ratios[len(ratios) // 2],
        "ratio_p95": ratios[len(ratios) * 19 // 20],
        "batches_under": under / n_batches,
        "batches_over_25pct": over / n_batches,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--items", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--estimate", action="store_true", help="also measure the bytes-based cost estimate")
    args = parser.parse_args(argv)
    texts = word_texts()
    sizes = [len(t.encode()) for t in texts]
    print(f"{len(texts)} texts of {min(sizes)}-{max(sizes)} bytes (median {statistics.median(sizes):.0f})")
    alone: list[float] = []
    fast: list[float] = []
    prepared: list[float] = []
    cost_only: list[float] = []
    for r in range(args.rounds):  # alternating, so drift falls on all three
        alone.append(encode_batch_alone(texts, args.items))
        fast.append(encode_batch_alone(texts, args.items, "encode_batch_fast"))
        prepared += asyncio.run(sidecar(texts, args.items, 1, None))
        cost_only += asyncio.run(sidecar(texts, args.items, 1, FOREIGN_ID))
        print(
            f"round {r + 1}: alone {alone[-1]:.1f} (fast {fast[-1]:.1f})  prepared {prepared[-1]:.1f}"
            f"  cost-only {cost_only[-1]:.1f} us"
        )
    a, f, p, c = (statistics.median(x) for x in (alone, fast, prepared, cost_only))
    print(f"encode_batch alone          {a:7.1f} us per item")
    print(f"encode_batch_fast alone     {f:7.1f} us per item  (what the sidecar calls; sidecar / this:"
          f" {p / f:.2f}x prepared, {c / f:.2f}x cost-only)")  # fmt: skip
    print(f"sidecar, prepared_tokens    {p:7.1f} us per item  ({p / a:.2f}x encode_batch alone; target <= 1.15)")
    print(f"sidecar, cost_only          {c:7.1f} us per item  ({c / a:.2f}x)")
    if args.estimate:
        from benches.gateway_items import gateway_texts

        for name, sample in (("word texts", texts), ("random-byte texts", gateway_texts(seed=1))):
            q = estimate_quality(sample)
            print(
                f"bytes/4 + 2 estimate / true tokens, {name}: p5 {q['ratio_p5']:.2f}, p50 {q['ratio_p50']:.2f},"
                f" p95 {q['ratio_p95']:.2f}; 64-item batches under the true total {q['batches_under']:.0%},"
                f" over it by > 25 % {q['batches_over_25pct']:.0%}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
