# SPDX-License-Identifier: Apache-2.0
"""The sidecar's CPU per item at a fixed offered load, A against B in ABBA order.

Each run is a fresh stack (nats-server, null backend, sidecar with A's or B's environment) and
`sie-sidecar loadgen` in its own process publishing `--rate` items/s for `--seconds`. Over the
window from `--window-start-s` to one second before the load ends, the sidecar's CPU (each live
thread's `schedstat`) is divided by the items offered in it; the relative column divides by
nats-server's and the backend's CPU instead. Tried as a steadier measure than a preloaded backlog
(`metrics_overhead.py`): it is not (docs/benchmarks.md, "Telemetry on: one call a batch, and the
export threads"): below capacity a run's CPU per item spreads by a third, batches forming on
timers.

    python benches/paced_cpu.py --rate 15000 --seconds 10 --rounds 6 [--b KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats

if __package__ in (None, ""):  # run as a script: make `benches.*` importable like under pytest and mypy
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benches.e2e_throughput import (
    MODEL,
    Processes,
    ab_envs,
    abba,
    add_ab_env_options,
    run_with_children,
    start_consumer,
    start_environment,
    topology_spec,
)
from benches.paired_ab import group_cpu_ns
from sie_sidecar.bus.topology import ensure_topology
from sie_sidecar.config import Settings


async def paced_run(procs: Processes, env_extra: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """One run at the offered load: the sidecar's CPU per offered item in the window, and relative."""
    with tempfile.TemporaryDirectory(prefix="sie-paced-") as tmp:
        try:
            workdir = Path(tmp)
            env = await start_environment(procs, workdir, env_extra)
            nc = await nats.connect(env.nats_url)
            try:
                await ensure_topology(nc.jetstream(), topology_spec(Settings.from_env(env.consumer_env)))
            finally:
                await nc.close()
            sidecar = start_consumer(procs, env, "sidecar")
            await asyncio.sleep(args.settle_s)
            argv = [sys.executable, "-m", "sie_sidecar", "loadgen", "--nats-url", env.nats_url, "--model", MODEL]
            argv += ["--items", str(int(args.rate * args.seconds)), "--rate", str(args.rate), "--no-progress"]
            argv += ["--json", str(workdir / "load.json")]
            load = procs.start("loadgen", argv, env.consumer_env, workdir / "loadgen.log")
            began = time.monotonic()
            reference = (env.nats.proc.pid, env.backend.proc.pid)
            await asyncio.sleep(args.window_start_s)
            cpu0, ref0 = group_cpu_ns(sidecar.proc.pid), sum(map(group_cpu_ns, reference))
            window = args.seconds - 1.0 - args.window_start_s
            await asyncio.sleep(window)
            cpu1, ref1 = group_cpu_ns(sidecar.proc.pid), sum(map(group_cpu_ns, reference))
            while load.proc.poll() is None and time.monotonic() - began < args.seconds + 90:
                await asyncio.sleep(0.2)
            summary = json.loads((workdir / "load.json").read_text())
            return {
                "cpu_us_per_item": (cpu1 - cpu0) / 1000 / (args.rate * window),
                "relative": (cpu1 - cpu0) / max(1, ref1 - ref0),
                "lost": summary.get("lost"),
                "achieved_items_per_s": summary.get("items_per_s"),
            }
        finally:
            procs.stop_all()


async def run_paced(args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    for n, side in enumerate(abba(args.rounds, ("A", "B")), start=1):
        env = args.sidecar_env | (args.a if side == "A" else args.b)
        run = await paced_run(procs, env, args)
        runs[side].append(run)
        print(
            f"run {n} {side}: {run['cpu_us_per_item']:.2f} µs/item, relative {run['relative']:.4f},"
            f" lost {run['lost']}, {run['achieved_items_per_s']:,.0f} items/s",
            flush=True,
        )
    summary: dict[str, Any] = {"runs": runs}
    for key in ("cpu_us_per_item", "relative"):
        a = [r[key] for r in runs["A"]]
        b = [r[key] for r in runs["B"]]
        ratio = statistics.median(b) / statistics.median(a)
        summary[key] = {"b_over_a": ratio, "spread_a": max(a) / min(a) - 1, "spread_b": max(b) / min(b) - 1}
        print(f"{key}: B/A {ratio:.4f}x; spread within A {max(a) / min(a) - 1:.1%}, within B {max(b) / min(b) - 1:.1%}")
    return summary


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=15_000.0, help="offered items/s (default 15000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the load runs (default 10)")
    parser.add_argument("--window-start-s", type=float, default=3.0, help="the window opens this long into the load")
    parser.add_argument("--settle-s", type=float, default=1.5, help="sidecar start to load start")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of {A, B}, ABBA (default 6)")
    add_ab_env_options(parser)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if args.seconds - 1.0 <= args.window_start_s or args.rate <= 0 or args.rounds < 1:
        parser.error("--seconds must leave a window past --window-start-s; --rate > 0; --rounds >= 1")
    ab_envs(args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    async def run(procs: Processes) -> dict[str, Any]:
        return await run_paced(args, procs)

    run_with_children(run, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
