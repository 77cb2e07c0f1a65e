# SPDX-License-Identifier: Apache-2.0
"""`python -m benches.chaos.run --items N --scenario NAME|all`: each scenario on a fresh rig, a table of
lost / duplicates / p50 / p99 / items/s / recovery, and the raw results as JSON.

Exit status 0 only when no scenario lost an item (and none was answered twice on the clean path).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .pods import BackendShape
from .procs import install_cleanup, kill_all
from .scenarios import SCENARIOS, TAIL_MIN_ITEMS, Outcome, Rig, run_scenario


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def _window(o: Outcome, name: str) -> Any:
    return next((w for w in o.count.windows if w.name == name), None)


def table(outcomes: list[Outcome]) -> str:
    head = (
        f"{'scenario':<25} {'items':>6} {'once':>6} {'dup':>4} {'stream':>6} {'unacc':>5} {'LOST':>4}"
        f" | {'p50/p99 before':>15} {'p50/p99 during':>15} {'p50/p99 after':>15} | {'items/s b/d/a':>17}"
        f" | {'recov s':>7} {'settle s':>8}"
    )
    lines = [head, "-" * len(head)]
    for o in outcomes:
        c = o.count
        cells = []
        rates = []
        for name in ("before", "during", "after"):
            w = _window(o, name) or _window(o, "all")
            if name == "after" and o.tail is not None and (w is None or w.published < TAIL_MIN_ITEMS):
                w = o.tail.windows[0]  # the tail load, published once the fault was over
            cells.append("-" if w is None else f"{_ms(w.p50_ms)}/{_ms(w.p99_ms)}")
            rates.append("-" if w is None or w.items_per_s is None else f"{w.items_per_s:,.0f}")
        t = o.tail
        items, once = c.items + (t.items if t else 0), c.exactly_once + (t.exactly_once if t else 0)
        dup, stream = c.duplicate_answers + (t.duplicate_answers if t else 0), c.in_stream + (t.in_stream if t else 0)
        unacc, lost = c.never_accepted + (t.never_accepted if t else 0), c.lost + (t.lost if t else 0)
        lines.append(
            f"{o.scenario:<25} {items:>6} {once:>6} {dup:>4} {stream:>6} {unacc:>5} {lost:>4} |"
            f" {cells[0]:>15} {cells[1]:>15} {cells[2]:>15} |"
            f" {'/'.join(rates):>17} | {_ms(c.recovery_s):>7} {_ms(c.settle_s):>8}"
        )
    return "\n".join(lines)


def details(o: Outcome) -> str:
    c = o.count
    out = [
        f"== {o.scenario}: {o.what}",
        f"   {o.items:,} items at {o.rate:,.0f}/s (capacity {o.capacity:,.0f}/s on this rig), last publish"
        f" {o.publish_end_s:.1f} s, {'settled' if o.settled else 'NOT settled'}, wall {o.wall_s:.0f} s",
        f"   exactly once {c.exactly_once:,}, duplicated items {c.duplicated_items} ({c.duplicate_answers} extra"
        f" answers), error answers {c.error_answers}, still in stream {c.in_stream}, never accepted"
        f" {c.never_accepted}, republished {c.republished}, LOST {c.lost}",
    ]
    if o.tail is not None:
        t = o.tail
        w = t.windows[0]
        out.append(
            f"   tail load (after the fault): {t.items:,} items, exactly once {t.exactly_once:,}, duplicates"
            f" {t.duplicate_answers}, in stream {t.in_stream}, LOST {t.lost}; p50 {_ms(w.p50_ms)} ms, p99"
            f" {_ms(w.p99_ms)} ms, {w.items_per_s or 0:,.0f} items/s"
        )
    for cause, n in sorted(c.duplicates_by_cause.items()):
        out.append(f"   duplicates: {n} x {cause}")
    for wid, answers in list(c.duplicate_samples.items())[:3]:
        out.append(f"   duplicate {wid}: " + ", ".join(f"{t:.2f}s by {w}" for t, _, w in answers))
    if c.lost_ids:
        out.append(f"   lost ids (first {len(c.lost_ids)}): {', '.join(c.lost_ids[:10])}")
    out.append(f"   stream at end: {o.stream_end}; unconfirmed publishes {o.unconfirmed_publishes}")
    if c.recovery_threshold_ms is not None:
        out.append(
            f"   recovery {c.recovery_s:.1f} s (new items slower than {c.recovery_threshold_ms:.0f} ms), settle"
            f" {c.settle_s if c.settle_s is None else round(c.settle_s, 1)} s, max latency {_ms(c.max_latency_ms)} ms"
        )
    for m in o.marks:
        out.append(f"   t={m.t:7.2f}s {m.kind:<8} {m.label}")
    for note in o.process_notes:
        out.append(f"   note: {note}")
    for err in o.client_errors[:5]:
        out.append(f"   gateway client: {err}")
    return "\n".join(out)


async def run_all(args: argparse.Namespace) -> list[Outcome]:
    names = list(SCENARIOS) if args.scenario == ["all"] else args.scenario
    shape = BackendShape(args.batch_a_ms, args.batch_b_us, drain_s=args.drain_s)
    outcomes: list[Outcome] = []
    rate: float | None = args.rate or None
    base = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="sie-chaos-"))
    for name in names:
        workdir = base / name
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        print(f"-- {name}: starting the rig in {workdir}", flush=True)
        rig = Rig(workdir, shape, dict(args.sidecar_env))
        try:
            await rig.start()
            outcome = await asyncio.wait_for(
                run_scenario(
                    rig,
                    SCENARIOS[name],
                    items=args.items,
                    rate=rate,
                    capacity_items=args.capacity_items,
                    settle_timeout_s=args.settle_timeout_s,
                ),
                timeout=args.scenario_timeout_s,
            )
        finally:
            await rig.stop()
            kill_all()
        if rate is None:
            rate = outcome.rate  # later scenarios offer the same load
        outcomes.append(outcome)
        print(details(outcome), flush=True)
        tail_ok = outcome.tail is None or outcome.tail.ok
        if not args.keep_logs and outcome.count.ok and tail_ok and not outcome.process_notes:
            shutil.rmtree(workdir, ignore_errors=True)
    return outcomes


def _kv(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benches.chaos.run", description=__doc__.splitlines()[0] if __doc__ else ""
    )
    p.add_argument("--items", type=int, default=5000, help="items per scenario (default 5000)")
    p.add_argument(
        "--scenario", nargs="+", default=["all"], choices=["all", *SCENARIOS], help="scenarios to run (default all)"
    )
    p.add_argument("--rate", type=float, default=0.0, help="items/s (default: 70%% of the first rig's capacity)")
    p.add_argument("--capacity-items", type=int, default=2000, help="burst that measures capacity (default 2000)")
    p.add_argument("--batch-a-ms", type=float, default=10.0, help="null backend batch time a (ms, default 10)")
    p.add_argument("--batch-b-us", type=float, default=50.0, help="null backend batch time b (µs/token, default 50)")
    p.add_argument("--drain-s", type=float, default=5.0, help="graceful backend restart: drain time (default 5)")
    p.add_argument("--settle-timeout-s", type=float, default=120.0, help="wait for the last answers (default 120)")
    p.add_argument("--scenario-timeout-s", type=float, default=420.0, help="hard cap per scenario (default 420)")
    p.add_argument("--json", default=".benchmarks/chaos.json", help="raw results (default .benchmarks/chaos.json)")
    p.add_argument("--workdir", default=None, help="logs go to WORKDIR/<scenario> (default a temp dir)")
    p.add_argument("--keep-logs", action="store_true", help="keep every scenario's logs (default: failed ones only)")
    p.add_argument("--sidecar-env", type=_kv, action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    if args.items < 1:
        p.error("--items must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_cleanup()
    began = time.time()
    outcomes = asyncio.run(run_all(args))
    print()
    print(table(outcomes))
    counts = [c for o in outcomes for c in (o.count, o.tail) if c is not None]
    clean_dups = sum(n for c in counts for cause, n in c.duplicates_by_cause.items() if "CLEAN" in cause)
    lost = sum(c.lost for c in counts)
    print(f"\nlost {lost}, clean-path duplicates {clean_dups} ({'OK' if lost == 0 and clean_dups == 0 else 'FAILED'})")
    result = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(began)),
        "args": {k: v for k, v in vars(args).items()},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_end": os.getloadavg()},
        "outcomes": [asdict(o) for o in outcomes],
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"results written to {args.json}")
    return 0 if lost == 0 and clean_dups == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
