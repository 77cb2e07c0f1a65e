# SPDX-License-Identifier: Apache-2.0
"""Loading all-MiniLM-L6-v2's weights: HF `safetensors` (numpy API) against a hand-written reader.

Why: the reference backend reads model.safetensors through the `safetensors` library (issue 32); it
used to carry its own numpy reader. This measures whether the library costs start-up time or memory.
Each sample is a fresh process (page cache warm), so the figures include importing the reader:

- `library read`: `safe_open(path, framework="np", backend="pread")` (as the backend opens it), every
  tensor fetched and summed (pages touched);
- `hand read`: the same with the earlier hand-written reader, when `--hand-written FILE` names a copy
  of it (`git show bd84874:python/sie_sidecar/backend/safetensors.py > /tmp/st_hand.py`);
- `model`: importing `sie_sidecar.backend.minilm` and constructing `MiniLMModel()` (tokenizer, config,
  weights, the fused layer matrices): what the backend's first EnsureModelReady waits for;
- `model before`: the same from an earlier tree, when `--before DIR` names its `python/` directory
  (`git archive REV python | tar -x -C /tmp/base`, plus this tree's built `_native*.so` copied in).

Modes alternate direction every round (ABBA), so drift falls on all alike. Peak RSS is the child's
`ru_maxrss`. Run from the repository root:
`python benches/weights_load.py [--rounds 7] [--hand-written /tmp/st_hand.py] [--before /tmp/base/python]`.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _model_file() -> Path:
    from sie_sidecar.backend.minilm import find_model_dir

    return find_model_dir() / "model.safetensors"


def _touch(arrays: dict[str, Any]) -> float:
    """Sum every tensor so lazily mapped pages are really read (a model uses all of them)."""
    return float(sum(float(a.sum(dtype="f8")) for a in arrays.values()))


def _library_read(path: Path, _hand: str | None) -> dict[str, Any]:
    from safetensors import safe_open

    with safe_open(path, framework="np", backend="pread") as fh:
        return {name: fh.get_tensor(name) for name in fh.keys()}  # noqa: SIM118 (not a dict)


def _hand_read(path: Path, hand: str | None) -> dict[str, Any]:
    assert hand is not None
    spec = importlib.util.spec_from_file_location("st_hand", hand)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["st_hand"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    result: dict[str, Any] = module.load_file(path)
    return result


def _child(mode: str, hand: str | None) -> dict[str, float]:
    """One sample, in this (fresh) process."""
    if mode in ("model", "model-before"):
        started = time.perf_counter()
        from sie_sidecar.backend.minilm import MiniLMModel

        imported = time.perf_counter()
        MiniLMModel()
        done = time.perf_counter()
        return {"s": done - started, "import_s": imported - started}
    path = _model_file()
    readers: dict[str, Callable[[Path, str | None], dict[str, Any]]] = {"library": _library_read, "hand": _hand_read}
    started = time.perf_counter()
    arrays = readers[mode](path, hand)
    _touch(arrays)
    return {"s": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--hand-written", help="a copy of the earlier hand-written reader (its load_file is used)")
    parser.add_argument("--before", help="an earlier tree's python/ directory, for `model before`")
    parser.add_argument("--child", choices=("library", "hand", "model", "model-before"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        sample = _child(args.child, args.hand_written)
        sample["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(sample))
        return 0

    modes = ["library", "model"] + (["hand"] if args.hand_written else []) + (["model-before"] if args.before else [])
    samples: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    extra = ["--hand-written", args.hand_written] if args.hand_written else []
    for rnd in range(args.rounds):
        for mode in modes if rnd % 2 == 0 else modes[::-1]:
            env = dict(os.environ)
            if mode == "model-before":
                env["PYTHONPATH"] = args.before
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode, *extra],
                cwd=ROOT,
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            samples[mode].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{_model_file().stat().st_size / 2**20:.1f} MiB model.safetensors, {args.rounds} rounds, median (min)")
    for mode in modes:
        secs = [s["s"] * 1e3 for s in samples[mode]]
        rss = statistics.median(s["rss_mib"] for s in samples[mode])
        label = {"library": "library read", "hand": "hand read", "model-before": "model before"}.get(mode, mode)
        line = f"  {label:<13} {statistics.median(secs):7.1f} ms ({min(secs):.1f})"
        line += f"  peak RSS {rss:6.1f} MiB"
        if mode in ("model", "model-before"):
            imports = [s["import_s"] * 1e3 for s in samples[mode]]
            loads = [s["s"] * 1e3 - i for s, i in zip(samples[mode], imports, strict=True)]
            line += f"  (import {statistics.median(imports):.0f} ms, load {statistics.median(loads):.0f} ms)"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
