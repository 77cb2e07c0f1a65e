#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where two settings' sidecar CPU differs, per symbol, from `perf_window.sh` recordings.

Each recording is one steady-state window of the whole machine. A sidecar sample counts against the
reference processes' samples of the same window (nats-server and the backend do the same work under
either setting), so a run on a slow moment of the shared machine weighs like one on a fast moment.
Prints, per side, the sidecar's samples per reference sample (all threads, main thread), then the
symbols whose share moved most, per 10,000 reference samples:

    python benches/profilers/perf_window_diff.py --a /tmp/win.off.? --b /tmp/win.on.?
"""

from __future__ import annotations

import argparse
import collections
import subprocess
from dataclasses import dataclass, field

Key = tuple[str, str, str]  # (shared object, symbol, "main" or "thread")


@dataclass
class Side:
    symbols: collections.Counter[Key] = field(default_factory=collections.Counter)
    reference: int = 0
    sidecar: int = 0
    main: int = 0

    def per_reference(self, key: Key) -> float:
        return self.symbols[key] / self.reference if self.reference else 0.0


def read_pids(path: str) -> dict[int, str]:
    roles = {}
    with open(f"{path}.pids") as lines:
        for line in lines:
            role, pid = line.split()
            roles[int(pid)] = role
    return roles


def add_recording(side: Side, path: str) -> tuple[int, int, int]:
    """Tally one recording into `side`; returns its (sidecar, main thread, reference) samples."""
    roles = read_pids(path)
    script = subprocess.run(
        ["perf", "script", "-i", path, "-F", "pid,tid,ip,sym,dso"], capture_output=True, text=True, check=True
    ).stdout
    sidecar = main = reference = 0
    for line in script.splitlines():
        fields = line.split(None, 2)
        if len(fields) < 2 or "/" not in fields[0]:
            continue
        pid_text, _, tid_text = fields[0].partition("/")
        pid, tid = int(pid_text), int(tid_text)
        role = roles.get(pid)
        if role == "reference":
            reference += 1
        elif role == "sidecar":
            sidecar += 1
            main += tid == pid
            symbol, _, dso = (fields[2] if len(fields) > 2 else "").rpartition(" (")
            key = (dso.rstrip(")").rsplit("/", 1)[-1], symbol.strip()[:100], "main" if tid == pid else "thread")
            side.symbols[key] += 1
    side.sidecar += sidecar
    side.main += main
    side.reference += reference
    return sidecar, main, reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--a", nargs="+", required=True, metavar="RECORDING", help="A's recordings")
    parser.add_argument("--b", nargs="+", required=True, metavar="RECORDING", help="B's recordings")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    sides = {"A": Side(), "B": Side()}
    for name, paths in (("A", args.a), ("B", args.b)):
        for path in paths:
            sidecar, main_thread, reference = add_recording(sides[name], path)
            print(
                f"{name} {path}: sidecar/reference {sidecar / max(1, reference):.4f}"
                f" (main thread {main_thread / max(1, reference):.4f}), {reference:,} reference samples"
            )
    a, b = sides["A"], sides["B"]
    for name, side in sides.items():
        print(
            f"{name}: sidecar/reference {side.sidecar / max(1, side.reference):.4f},"
            f" main thread {side.main / max(1, side.reference):.4f}"
        )
    ratio = (b.sidecar / max(1, b.reference)) / max(1e-9, a.sidecar / max(1, a.reference))
    print(f"B/A: {ratio:.3f}x")
    moved = sorted(((b.per_reference(k) - a.per_reference(k)) * 1e4, k) for k in set(a.symbols) | set(b.symbols))
    print("largest increases, B over A (per 10,000 reference samples; A's own in the second column):")
    for delta, key in moved[::-1][: args.top]:
        print(f"{delta:8.1f} {a.per_reference(key) * 1e4:8.1f}  {key[0]}  {key[1]}  ({key[2]})")
    print("largest decreases:")
    for delta, key in moved[: max(1, args.top // 3)]:
        print(f"{delta:8.1f} {a.per_reference(key) * 1e4:8.1f}  {key[0]}  {key[1]}  ({key[2]})")


if __name__ == "__main__":
    main()
