#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Stand-in for py-spy in `e2e_throughput.py --py-spy PATH`: counts the bytecodes the sidecar's serving
thread runs, per function, and compares two settings per batch.

Why: callgrind says how much the interpreter costs but not for which Python function, and cProfile
counts calls, not the work inside them (an inline lookup is no call). An opcode tracer on the main
thread counts exactly what the interpreter executed. It slows the sidecar ~50x, so only the counts
mean anything, never its times; run two sizes and take the slope, so start-up falls out.

    for n in 3000 9000; do OPCOUNT_OUT=/tmp/op.off.$n.json python benches/e2e_throughput.py \\
        --items $n --rounds 1 --half-load-s 0 --phase-timeout-s 500 \\
        --py-spy benches/profilers/opcodes_sidecar.py; done      # and again with the "on" flags
    python benches/profilers/opcodes_sidecar.py --diff /tmp/op.off /tmp/op.on --sizes 3000 9000

With exports every second, the registry's snapshot runs more often per batch under the tracer than
in a real run (the run is ~50x longer): read `snapshot` and the `Point` constructor as that.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import runpy
import sys
from types import CodeType, FrameType
from typing import Any


def _name(code: CodeType) -> str:
    path = code.co_filename
    for cut in ("site-packages/", "sie_sidecar/", "python3.11/"):
        path = path.split(cut)[-1]
    return f"{path}:{code.co_firstlineno}:{code.co_name}"


def run_traced(args: list[str]) -> None:
    """Run `python -m sie_sidecar ...` (after `--`) here with every bytecode of the main thread counted."""
    command = args[args.index("--") + 1 :]
    if command[1:3] != ["-m", "sie_sidecar"]:
        raise SystemExit(f"expected `python -m sie_sidecar ...` after --, got {command}")
    if os.path.abspath(sys.executable) != os.path.abspath(command[0]):
        os.execv(command[0], [command[0], __file__, *args])  # the bench's interpreter (its venv)
    sys.argv = ["sie_sidecar", *command[3:]]
    counts: collections.Counter[CodeType] = collections.Counter()

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            counts[frame.f_code] += 1
        return local

    def enter(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return local

    sys.settrace(enter)
    try:
        runpy.run_module("sie_sidecar", run_name="__main__")
    except SystemExit:
        pass
    finally:
        sys.settrace(None)
        by_name: collections.Counter[str] = collections.Counter()
        for code, n in counts.items():
            by_name[_name(code)] += n
        with open(os.environ.get("OPCOUNT_OUT", "/tmp/opcount.json"), "w") as out:
            json.dump(by_name, out)


def per_batch(prefix: str, sizes: tuple[int, int], batch: int) -> dict[str, float]:
    """Bytecodes a `batch`-item batch, per function: the slope between the two sizes' counts."""
    counts = []
    for n in sizes:
        with open(f"{prefix}.{n}.json") as f:
            counts.append({k: float(v) for k, v in json.load(f).items()})
    small, large = counts
    scale = batch / (sizes[1] - sizes[0])
    return {k: (large.get(k, 0.0) - small.get(k, 0.0)) * scale for k in set(small) | set(large)}


def diff(a: str, b: str, sizes: tuple[int, int], batch: int, top: int) -> None:
    before, after = per_batch(a, sizes, batch), per_batch(b, sizes, batch)
    total_a, total_b = sum(before.values()), sum(after.values())
    print(f"bytecodes a {batch}-item batch: {total_a:,.0f} -> {total_b:,.0f} ({total_b - total_a:+,.0f})")
    rows = sorted(((after.get(k, 0.0) - before.get(k, 0.0), k) for k in set(before) | set(after)), reverse=True)
    shown = rows if len(rows) <= top + 5 else [*rows[:top], None, *rows[-5:]]
    for row in shown:
        if row is None:
            print("...")
            continue
        change, name = row
        print(f"{change:+9.1f}  {before.get(name, 0.0):9.1f} -> {after.get(name, 0.0):9.1f}  {name}")


def main() -> None:
    if "--" in sys.argv:
        run_traced(sys.argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--diff", nargs=2, metavar=("A", "B"), required=True, help="the two settings' prefixes")
    parser.add_argument("--sizes", nargs=2, type=int, default=(3000, 9000), help="the two runs' item counts")
    parser.add_argument("--batch", type=int, default=64, help="items a batch (default 64)")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    diff(args.diff[0], args.diff[1], tuple(args.sizes), args.batch, args.top)


if __name__ == "__main__":
    main()
