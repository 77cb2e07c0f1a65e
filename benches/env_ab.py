# SPDX-License-Identifier: Apache-2.0
"""The sidecar's items/s and CPU per 1,000 items under two environments, side by side in one run.

`--rounds` x {A, B} end-to-end sidecar runs in ABBA order (A, B, B, A, A, B, ...), each exactly
e2e_throughput's throughput round: a fresh nats-server and null backend, `--items` preloaded
WorkItems, one sidecar start timed to the last reply. A gets `--a KEY=VALUE`s, B gets `--b`s; both get
`--sidecar-env`. For a setting's price on the hot path, e.g. confirmed ACKs:

    python benches/env_ab.py --items 50000 --rounds 4 --a SIE_NATS_ACK_CONFIRM_S=0 --b SIE_NATS_ACK_CONFIRM_S=2
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benches.*` importable like under pytest and mypy
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benches.e2e_throughput import (
    Processes,
    ThroughputRun,
    _busy_cpus,
    _median,
    ab_envs,
    abba,
    add_ab_env_options,
    add_pin_option,
    pin_if_asked,
    precompile_package,
    relative_cpu,
    run_with_children,
    steady_cpu_ms_per_1k,
    throughput_round,
    warm_cpu_ms_per_1k,
)


def side_medians(runs: list[tuple[str, ThroughputRun]], side: str) -> dict[str, float]:
    mine = [run for s, run in runs if s == side]
    cpu = [c for c in (steady_cpu_ms_per_1k(run) for run in mine) if c is not None]
    warm = [c for c in (warm_cpu_ms_per_1k(run) for run in mine) if c is not None]
    relative = [c for c in (relative_cpu(run, run.cpu_warm_s) for run in mine) if c is not None]
    return {
        "items_per_s": _median([run.items_per_s for run in mine]),
        "steady_items_per_s": _median([run.steady_items_per_s for run in mine if run.steady_items_per_s]),
        "steady_cpu_ms_per_1k": _median(cpu),
        "warm_cpu_ms_per_1k": _median(warm),
        "warm_relative_cpu": _median(relative),
        "startup_s": _median([run.startup_s for run in mine if run.startup_s is not None]),
    }


async def run_ab(args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    began = time.monotonic()
    if not args.no_precompile and precompile_package() != 0:
        print("warning: some sie_sidecar modules did not compile", flush=True)
    busy_before = _busy_cpus()
    envs = {"A": {**args.sidecar_env, **args.a}, "B": {**args.sidecar_env, **args.b}}
    runs: list[tuple[str, ThroughputRun]] = []
    problems: list[str] = []
    for index, side in enumerate(abba(args.rounds, ("A", "B")), start=1):
        round_args = argparse.Namespace(**{"keep_logs": None, **vars(args), "sidecar_env": envs[side]})
        run = await throughput_round(procs, "sidecar", index, round_args)
        runs.append((side, run))
        cpu = steady_cpu_ms_per_1k(run)
        print(
            f"run {index} {side}: {run.items_per_s:8,.0f} items/s (steady {run.steady_items_per_s or 0:,.0f}),"
            f" steady sidecar CPU/1k {cpu or 0:.1f} ms, lost {run.lost}, dup {run.duplicates}",
            flush=True,
        )
        if run.lost or run.duplicates or run.failures or run.timed_out:
            problems.append(f"run {index} {side}: lost {run.lost}, dup {run.duplicates}, failed {run.failures}")
    medians = {side: side_medians(runs, side) for side in "AB"}
    ratios = {k: medians["B"][k] / medians["A"][k] if medians["A"][k] else None for k in medians["A"]}
    print(f"\nA = {envs['A']}\nB = {envs['B']}\n")
    warm = f"past the first {args.warm_fraction:.0%} of the replies" if args.warm_fraction else "(no warm point)"
    print(
        f"| side | items/s | steady items/s | steady sidecar CPU / 1,000 items | the same {warm}"
        " | sidecar CPU / nats-server + backend CPU, the same window | start-up |"
    )
    print("|---|---|---|---|---|---|---|")
    for side in "AB":
        m = medians[side]
        cells = f"{m['items_per_s']:,.0f} | {m['steady_items_per_s']:,.0f} | {m['steady_cpu_ms_per_1k']:.2f} ms"
        print(
            f"| {side} (median) | {cells} | {m['warm_cpu_ms_per_1k']:.2f} ms | {m['warm_relative_cpu']:.4f}"
            f" | {m['startup_s']:.3f} s |"
        )
    print("| B/A | " + " | ".join("-" if r is None else f"{r:.3f}x" for r in ratios.values()) + " |")
    for line in problems:
        print(f"  warning: {line}")
    print(f"\ntotal time {time.monotonic() - began:.0f} s")
    return {
        "config": {"items": args.items, "rounds": args.rounds, "envs": envs},
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "busy_cpus_before": busy_before,
            "loadavg_after": os.getloadavg(),
        },
        "medians": medians,
        "ratios_b_over_a": ratios,
        "problems": problems,
        "runs": [{"side": side} | asdict(run) for side, run in runs],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--items", type=int, default=50_000, help="preloaded encode items per run (default 50000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of {A, B} runs, ABBA (default 3)")
    parser.add_argument("--work", choices=("gateway", "loadgen"), default="gateway", help="WorkItems' shape")
    add_pin_option(parser)
    add_ab_env_options(parser)
    parser.add_argument("--phase-timeout-s", type=float, default=120.0, help="give up on a run after this long")
    parser.add_argument(
        "--warm-fraction",
        type=float,
        default=0.0,
        help="also measure steady CPU past this fraction of the replies (one-off work of the first seconds excluded)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the raw numbers as JSON to PATH")
    parser.add_argument("--no-precompile", action="store_true", help="leave the bytecode unwritten")
    args = parser.parse_args(argv)
    if args.items < 1 or args.rounds < 1:
        parser.error("--items and --rounds must be >= 1")
    ab_envs(args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pin_if_asked(args)
    result = run_with_children(lambda procs: run_ab(args, procs), args.json)
    return 0 if not result["problems"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
