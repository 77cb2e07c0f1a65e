# SPDX-License-Identifier: Apache-2.0
"""Turn a pytest-benchmark JSON file into the ratio table of docs/benchmarks.md.

Every ratio is between two cases of the same run, so machine noise mostly cancels out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _medians(path: Path) -> dict[str, float]:
    data: dict[str, Any] = json.loads(path.read_text())
    return {bench["name"]: float(bench["stats"]["median"]) for bench in data["benchmarks"]}


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} µs"


def rows(m: dict[str, float]) -> list[tuple[str, str, str, str]]:
    """(measure, native, reference, ratio and target) rows for the issue's targets."""
    out: list[tuple[str, str, str, str]] = []

    def add(label: str, native: str, ref: str, ratio: float, target: str) -> None:
        if native in m and ref in m:
            out.append((label, _fmt(m[native]), _fmt(m[ref]), f"{ratio:.2f}x (target {target})"))

    n, p = "test_split_and_decode_run_batch[native]", "test_split_and_decode_run_batch[py]"
    if n in m and p in m:
        add("split + decode 256-item RunBatch response: twin / native", n, p, m[p] / m[n], "≥ 3x")
    n, f = "test_reassemble_128mib[native]", "test_sha256_floor_128mib"
    if n in m and f in m:
        add("128 MiB reassembly throughput / hashlib.sha256 alone", n, f, m[f] / m[n], "≥ 0.8x")
    p = "test_reassemble_128mib[py]"
    if n in m and p in m:
        add("128 MiB reassembly: twin / native", n, p, m[p] / m[n], "-")
    n, p, f = "test_frame_dense_batch[native]", "test_frame_dense_batch[py]", "test_memcpy_floor_dense"
    if n in m and p in m:
        add("dense framing 256 x 1024 f32: twin / native", n, p, m[p] / m[n], "≥ 5x")
    if n in m and f in m:
        add("dense framing 256 x 1024 f32: native / one memcpy", n, f, m[n] / m[f], "≤ 2x")
    n1, p1 = "test_frame_dense_per_item[native]", "test_frame_dense_per_item[py]"
    if n1 in m and p1 in m:
        add("dense framing, one call per item: twin / native", n1, p1, m[p1] / m[n1], "-")
    n, p, f = "test_tombstone_lookup[native]", "test_tombstone_lookup[py]", "test_tombstone_loop_floor"
    lookups = len(range(0, 100_000, 97)) + 1000
    if n in m:
        out.append(
            (
                "tombstone is_cancelled, per call (Cython)",
                f"{m[n] / lookups * 1e9:.0f} ns",
                f"{m[p] / lookups * 1e9:.0f} ns (twin)" if p in m else "-",
                "target ≤ 200 ns",
            )
        )
    if n in m and f in m:
        out.append(
            (
                "  of which the Python loop + dict floor",
                f"{m[f] / lookups * 1e9:.0f} ns",
                "-",
                "-",
            )
        )
    n, p = "test_formation[native]", "test_formation[py]"
    if n in m:
        out.append(
            (
                "batch formation, per item (1,024 items in groups of 64)",
                f"{m[n] / 1024 * 1e9:.0f} ns",
                f"{m[p] / 1024 * 1e9:.0f} ns (twin)" if p in m else "-",
                f"{m[p] / m[n]:.2f}x (target ≤ 1 µs and ≥ 10x)" if p in m else "target ≤ 1 µs",
            )
        )
    n, p = "test_step_every_call[native]", "test_step_every_call[py]"
    add("adaptive controller, 1,000 PI steps: twin / native", n, p, m.get(p, 0) / m.get(n, 1), "-")
    return out


def main(argv: list[str]) -> int:
    medians = _medians(Path(argv[1] if len(argv) > 1 else ".benchmarks/latest.json"))
    print("| measure | native | reference | ratio |")
    print("|---|---|---|---|")
    for row in rows(medians):
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
