# SPDX-License-Identifier: Apache-2.0
"""A setting's CPU price per item, from two sidecars run at once over the same seconds.

The idea: runs one after another (`env_ab.py`, `metrics_overhead.py`) each meet the shared host at
its own speed. Here each round starts two full stacks side by side (nats-server, null backend,
sidecar: A's environment and B's), preloads `--items` gateway-shaped WorkItems into each, and starts
both sidecars together. Over the window from when both have `--warm-fraction` of their replies to
when the first has all of them, each sidecar's CPU per reply is read from /proc (each live thread's
`schedstat`, in nanoseconds: clock ticks were ±1% of a window); B's over A's is the round's ratio.
The start order alternates A-first, B-first, B-first, A-first... (ABBA); the median round is
reported, with the spread.

What it showed (docs/benchmarks.md, "Telemetry on: one call a batch, and the export threads"): an
A/A pairing spreads as widely as runs one after another (0.85-1.05x in 8 rounds, batches full in
both), so the spread is the sidecar's own CPU per item moving with how the two cores are shared,
not only the host's speed. Kept as the instrument that showed it:

    python benches/paired_ab.py --items 90000 --rounds 8 [--b KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import nats

if __package__ in (None, ""):  # run as a script: make `benches.*` importable like under pytest and mypy
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benches.e2e_throughput import (
    MODEL,
    Child,
    Environment,
    Processes,
    ReplyCollector,
    ab_envs,
    abba,
    add_ab_env_options,
    group_stats,
    precompile_package,
    preload,
    run_with_children,
    start_environment,
    topology_spec,
    work_items,
)
from sie_sidecar.bus.topology import ensure_topology
from sie_sidecar.config import Settings
from sie_sidecar.tools.loadgen import LoadConfig


def group_cpu_ns(leader: int) -> int:
    """CPU nanoseconds of every live thread of every process in `leader`'s process group."""
    total = 0
    for _, proc, _ in group_stats({leader}):
        try:
            tasks = list((proc / "task").iterdir())
        except OSError:  # the process ended meanwhile
            continue
        for task in tasks:
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):  # the thread ended meanwhile
                continue
    return total


@dataclass
class Side:
    """One stack of a round and what its sidecar did in the shared window."""

    name: str
    env: Environment
    collector: ReplyCollector
    nc: Any
    sidecar: Child | None = None
    cpu_ns: int = 0
    replies: int = 0

    def reference(self) -> list[Child]:
        return [self.env.nats, self.env.backend]


@dataclass
class Round:
    round: int
    first: str  # which side's sidecar was started first
    window_s: float
    a_cpu_us_per_item: float
    b_cpu_us_per_item: float
    ratio: float  # B's CPU per item over A's, same window
    a_reference_us_per_item: float  # nats-server + backend, per A reply (the yardstick, for the record)
    b_reference_us_per_item: float
    lost: dict[str, int]


async def _stack(procs: Processes, workdir: Path, name: str, args: argparse.Namespace, round_no: int) -> Side:
    """One side's stack, `--items` preloaded; its sidecar is not started yet."""
    items = args.items
    environment = await start_environment(procs, workdir, args.sidecar_env | (args.a if name == "A" else args.b))
    for child in (environment.nats, environment.backend):
        child.name = f"{child.name}-{name}"
    spec = topology_spec(Settings.from_env(environment.consumer_env))
    nc = await nats.connect(environment.nats_url, pending_size=16 * 1024 * 1024)
    js = nc.jetstream()
    await ensure_topology(js, spec)
    router = f"pair{round_no}{name}"
    config = LoadConfig(nats_url=environment.nats_url, model=MODEL, router_id=router)
    expected, _ = await preload(nc, config, work_items(config, items, round_no, "gateway"), items)
    collector = ReplyCollector(expected)
    await nc.subscribe(f"_INBOX.{router}.>", cb=collector.on_reply, pending_msgs_limit=0, pending_bytes_limit=0)
    await nc.flush()
    return Side(name, environment, collector, nc)


async def paired_round(procs: Processes, args: argparse.Namespace, round_no: int, first: str) -> Round:
    with tempfile.TemporaryDirectory(prefix="sie-paired-") as tmp:
        sides: dict[str, Side] = {}
        try:
            for name in ("A", "B"):
                (Path(tmp) / name).mkdir()
                sides[name] = await _stack(procs, Path(tmp) / name, name, args, round_no)
            order = [first, "B" if first == "A" else "A"]
            for name in order:
                side = sides[name]
                log = side.env.workdir / "sidecar.log"
                side.sidecar = procs.start(
                    f"sidecar-{name}", [sys.executable, "-m", "sie_sidecar", "run"], side.env.consumer_env, log
                )
            warm = int(args.items * args.warm_fraction)
            deadline = time.monotonic() + args.phase_timeout_s
            while min(s.collector.unique for s in sides.values()) < warm:
                if time.monotonic() > deadline:
                    raise RuntimeError("the sidecars did not reach the warm point in time")
                await asyncio.sleep(0.005)
            began = time.perf_counter()
            start = {n: (group_cpu_ns(s.sidecar.proc.pid), s.collector.unique) for n, s in sides.items() if s.sidecar}
            refs = {n: sum(group_cpu_ns(c.proc.pid) for c in s.reference()) for n, s in sides.items()}
            while not any(s.collector.done.is_set() for s in sides.values()):
                if time.monotonic() > deadline:
                    raise RuntimeError("neither sidecar finished in time")
                await asyncio.sleep(0.005)
            window = time.perf_counter() - began
            per_item: dict[str, float] = {}
            ref_per_item: dict[str, float] = {}
            for name, side in sides.items():
                assert side.sidecar is not None
                cpu0, n0 = start[name]
                replies = side.collector.unique - n0
                side.cpu_ns = group_cpu_ns(side.sidecar.proc.pid) - cpu0
                side.replies = replies
                per_item[name] = side.cpu_ns / 1000 / max(1, replies)
                ref = sum(group_cpu_ns(c.proc.pid) for c in side.reference()) - refs[name]
                ref_per_item[name] = ref / 1000 / max(1, replies)
            # Let the slower side finish, so nothing is lost (and each stack is stopped whole).
            while not all(s.collector.done.is_set() for s in sides.values()):
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.01)
            lost = {n: args.items - s.collector.unique for n, s in sides.items()}
            return Round(
                round=round_no,
                first=first,
                window_s=window,
                a_cpu_us_per_item=per_item["A"],
                b_cpu_us_per_item=per_item["B"],
                ratio=per_item["B"] / per_item["A"],
                a_reference_us_per_item=ref_per_item["A"],
                b_reference_us_per_item=ref_per_item["B"],
                lost=lost,
            )
        finally:
            for side in sides.values():
                await side.nc.close()
            procs.stop_all()


async def run_pairs(args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    if precompile_package() != 0:
        print("warning: some sie_sidecar modules did not compile", flush=True)
    print(f"A = {args.sidecar_env | args.a}\nB = {args.sidecar_env | args.b}", flush=True)
    rounds: list[Round] = []
    for n, first in enumerate(abba(args.rounds, ("A", "B"))[::2], start=1):
        result = await paired_round(procs, args, n, first)
        rounds.append(result)
        print(
            f"round {n} ({first} first): window {result.window_s:.2f} s, sidecar CPU per item"
            f" A {result.a_cpu_us_per_item:.2f} µs, B {result.b_cpu_us_per_item:.2f} µs, B/A {result.ratio:.4f}x;"
            f" lost {result.lost}",
            flush=True,
        )
    ratios = [r.ratio for r in rounds]
    median = statistics.median(ratios)
    spread = (max(ratios) - min(ratios)) / 2
    lost = sum(sum(r.lost.values()) for r in rounds)
    print(
        f"\nB/A sidecar CPU per item, same window: median {median:.4f}x over {len(rounds)} rounds"
        f" (min {min(ratios):.4f}x, max {max(ratios):.4f}x, ±{spread:.4f}); lost in all {lost}"
    )
    return {
        "a": args.sidecar_env | args.a,
        "b": args.sidecar_env | args.b,
        "median_ratio": median,
        "rounds": [asdict(r) for r in rounds],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--items", type=int, default=60_000, help="preloaded WorkItems per side per round")
    parser.add_argument("--rounds", type=int, default=8, help="rounds (the start order alternates ABBA)")
    parser.add_argument("--warm-fraction", type=float, default=0.25, help="the window opens when both have this share")
    add_ab_env_options(parser)
    parser.add_argument("--phase-timeout-s", type=float, default=180.0)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if not 0 < args.warm_fraction < 1 or args.items < 100 or args.rounds < 1:
        parser.error("--warm-fraction in (0, 1), --items >= 100, --rounds >= 1")
    ab_envs(args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    async def run(procs: Processes) -> dict[str, Any]:
        return await run_pairs(args, procs)

    run_with_children(run, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
