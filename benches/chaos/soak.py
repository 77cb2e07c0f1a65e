# SPDX-License-Identifier: Apache-2.0
"""The soak (issue 15): the chaos rig under an open-loop load at 70% of its capacity for `--minutes`,
a fault every `--fault-every-min` (the faults of the scenarios in turn, each hitting pod 0 or the
stream leader), and every sidecar's RSS, open file descriptors and live memory sampled every 10 s
(live memory from its `/debug/state`: glibc's bytes in use and Python's allocated blocks, which a
leak raises and allocator fragmentation does not).

Pass: nothing lost, and every sidecar process that lived `--min-span-s` past its own warm-up flat:
its RSS at the end within `--rss-growth-pct` of its steady median, its live memory (C heap in use,
Python blocks) within `--live-growth-pct`, its fds within `--fd-growth` (a fault that restarts a
sidecar starts a new process, judged on its own). Writes the samples as JSON and a PNG plot (RSS,
C heap in use and fds over time, faults marked) drawn without a plotting library.

Run: `python -m benches.chaos.soak --minutes 30 --png docs/img/soak.png --json .benchmarks/soak.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import struct
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benches import heap_census

from .count import count
from .load import measure_capacity
from .pods import BackendShape, Pod
from .scenarios import SCENARIOS, Rig, _gave_up, _settle

#: The scenarios' faults, in turn (each one's leader placement first, then the fault).
FAULTS = tuple(
    SCENARIOS[name]
    for name in ("kill_sidecar", "kill_backend", "backend_graceful_restart", "kill_stream_leader", "rolling_restart")
)
SAMPLE_S = 10.0
#: |correlation| of held messages with time above which their effect cannot be separated from a leak.
COLLINEAR = 0.9


@dataclass
class Sample:
    t: float
    pod: int
    pid: int
    rss_mb: float
    fds: int
    heap_in_use_mb: float | None = None  # glibc's mallinfo2: heap chunks in use plus mmapped blocks
    python_blocks: int | None = None  # sys.getallocatedblocks()
    held: int | None = None  # messages the sidecar held unsettled (its consumers' `unsettled`)


@dataclass
class SoakResult:
    minutes: float
    rate: float
    capacity: float
    items: int
    lost: int
    duplicated_items: int
    exactly_once: int
    in_stream: int
    faults: list[tuple[float, str]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    flat: dict[str, Any] = field(default_factory=dict)


def _proc_stats(pid: int) -> tuple[float, int] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        return rss_kb / 1024, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration, ValueError):
        return None


async def _memory(pod: Pod) -> tuple[dict[str, Any], int | None]:
    """The sidecar's `/debug/state` `memory` document and the messages it holds ({} and None when it
    does not answer in time)."""
    status, body = await pod.get("/debug/state")
    if status != 200:
        return {}, None
    state = json.loads(body)
    memory: dict[str, Any] = state.get("memory") or {}
    consumers = state.get("consumers")
    return memory, None if consumers is None else sum(int(c["unsettled"]) for c in consumers)


async def _sampler(rig: Rig, out: list[Sample], stop: asyncio.Event) -> None:
    while not stop.is_set():
        for pod in rig.pods:
            with contextlib.suppress(Exception):
                pid = pod.sidecar.pid
                stats = _proc_stats(pid)
                if stats is not None:
                    memory: dict[str, Any] = {}
                    held: int | None = None
                    with contextlib.suppress(Exception):
                        memory, held = await _memory(pod)
                    in_use = memory.get("in_use_bytes")
                    out.append(
                        Sample(
                            rig.gateway.now(),
                            pod.index,
                            pid,
                            round(stats[0], 1),
                            stats[1],
                            None if in_use is None else round(in_use / 2**20, 2),
                            memory.get("python_blocks"),
                            held,
                        )
                    )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_S)


def _grew(values: list[float], pct: float) -> tuple[float, float, bool]:
    """(steady median, end = median of the last three, end within `pct` of the median)."""
    mid = statistics.median(values)
    end = statistics.median(values[-3:])
    return mid, end, end <= mid * (1 + pct / 100)


def blocks_trend(steady: list[Sample]) -> tuple[float, float] | None:
    """Least squares `blocks = a + b·held + c·t` over the samples that have both: (b, c), the Python
    blocks per held message and the growth per second with what is held taken out. None under 6 points;
    b is 0 (time explains everything) when `held` never varies or follows time too closely to tell apart.

    Why: a heap census (benches/heap_census.py) finds ~a dozen live blocks per message held (nats-py's
    Msg, its subject, reply, headers and data, our delivery), so blocks follow the backlog of the
    instant, which drifts over a soak as the machine slows; a leak is what grows with time beyond it."""
    points = [
        (float(s.python_blocks), float(s.held), s.t)
        for s in steady
        if s.python_blocks is not None and s.held is not None
    ]
    if len(points) < 6:
        return None
    blocks, held, t = (np.array(column) for column in zip(*points, strict=True))
    if np.ptp(held) == 0 or abs(np.corrcoef(held, t)[0, 1]) > COLLINEAR:
        # Held constant, or rising (or falling) with time so closely that the fit cannot tell a
        # per-message cost from a leak: all of the growth is charged to time, which fails safe.
        slope = np.polyfit(t, blocks, 1)[0]
        return 0.0, float(slope)
    design = np.column_stack([np.ones_like(t), held, t])
    coef = np.linalg.lstsq(design, blocks, rcond=None)[0]
    return float(coef[1]), float(coef[2])


def flatness(
    samples: list[Sample],
    warmup_s: float,
    rss_pct: float,
    fd_growth: int,
    min_span_s: float,
    *,
    live_pct: float = 10.0,
    blocks_pct: float = 1.0,
) -> dict[str, Any]:
    """Per sidecar process (pod and pid) that lived at least `min_span_s` after its own `warmup_s`:
    the median RSS, live memory and fds of that steady part against its last three samples. A leak
    shows as the end above the median by more than the allowance; a process restarted by a fault
    starts a new one. Live memory is judged where the samples have it (runs before it was sampled
    have RSS and fds only). Where the samples also have the messages held, Python's blocks are judged
    by their trend with the held messages taken out (`blocks_trend`): growth over the steady part
    within `blocks_pct` of the median."""
    verdict: dict[str, Any] = {}
    for pod, pid in sorted({(s.pod, s.pid) for s in samples}):
        mine = [s for s in samples if (s.pod, s.pid) == (pod, pid)]
        steady = [s for s in mine if s.t >= mine[0].t + warmup_s]
        name = f"pod-{pod} pid {pid}"
        if len(steady) < 6 or steady[-1].t - steady[0].t < min_span_s:
            verdict[name] = {"checked": False, "why": f"lived {mine[-1].t - mine[0].t:.0f} s"}
            continue
        rss_mid, rss_end, rss_ok = _grew([s.rss_mb for s in steady], rss_pct)
        fds_mid = statistics.median(s.fds for s in steady)
        fds_end = max(s.fds for s in steady[-3:])
        live: dict[str, Any] = {}
        live_ok = True
        for key in ("heap_in_use_mb", "python_blocks"):
            values = [float(v) for s in steady if (v := getattr(s, key)) is not None]
            if len(values) >= 6:
                mid, end, ok = _grew(values, live_pct)
                live |= {f"{key}_median": round(mid, 2), f"{key}_end": round(end, 2)}
                live_ok = live_ok and ok
        trend = blocks_trend(steady)
        if trend is not None and "python_blocks_median" in live:
            per_held, per_s = trend
            growth = per_s * (steady[-1].t - steady[0].t)
            trend_ok = growth <= live["python_blocks_median"] * blocks_pct / 100
            live |= {
                "python_blocks_per_held": round(per_held, 1),
                "python_blocks_trend": round(growth),  # over the steady part, what is held taken out
                "python_blocks_trend_ok": trend_ok,
            }
            live_ok = live_ok and trend_ok
        verdict[name] = {
            "checked": True,
            "ok": rss_ok and live_ok and fds_end <= fds_mid + fd_growth,
            "rss_ok": rss_ok,
            "live_ok": live_ok,
            "from_s": round(steady[0].t),
            "to_s": round(steady[-1].t),
            "rss_median_mb": rss_mid,
            "rss_end_mb": rss_end,
            "rss_min_mb": min(s.rss_mb for s in steady),
            "rss_max_mb": max(s.rss_mb for s in steady),
            "fds_median": fds_mid,
            "fds_end": fds_end,
            "fds_max": max(s.fds for s in steady),
            **live,
        }
    return verdict


# --- a PNG without a plotting library ------------------------------------------------------------------

_COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44)]


def _png(width: int, height: int, pixels: bytearray) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + bytes(pixels[y * width * 3 : (y + 1) * width * 3]) for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")


def plot(samples: list[Sample], faults: list[tuple[float, str]], duration_s: float) -> bytes:
    """Three panels (RSS MB, C heap in use MB, fds, top to bottom), one line per pod, a grey vertical
    line per fault; a panel whose samples lack the value stays empty."""
    width, panel, gap = 900, 220, 20
    height = 3 * panel + 2 * gap
    pixels = bytearray(b"\xff" * (width * height * 3))

    def put(x: int, y: int, colour: tuple[int, int, int]) -> None:
        if 0 <= x < width and 0 <= y < height:
            i = (y * width + x) * 3
            pixels[i : i + 3] = bytes(colour)

    def line(x0: int, y0: int, x1: int, y1: int, colour: tuple[int, int, int]) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for k in range(steps + 1):
            x, y = x0 + (x1 - x0) * k // steps, y0 + (y1 - y0) * k // steps
            put(x, y, colour)
            put(x, y + 1, colour)

    for top, value in ((0, "rss_mb"), (panel + gap, "heap_in_use_mb"), (2 * (panel + gap), "fds")):
        values = [v for s in samples if (v := getattr(s, value)) is not None] or [0.0]
        low, high = 0.0, max(values) * 1.15 or 1.0
        line(0, top + panel - 1, width - 1, top + panel - 1, (0, 0, 0))
        line(0, top, 0, top + panel - 1, (0, 0, 0))
        for t, _ in faults:
            x = int(t / duration_s * (width - 1))
            for y in range(top, top + panel, 3):
                put(x, y, (170, 170, 170))
        for pod in sorted({s.pod for s in samples}):
            scale = (panel - 2) / (high - low)
            points = [
                (int(s.t / duration_s * (width - 1)), top + panel - 1 - int((getattr(s, value) - low) * scale))
                for s in samples
                if s.pod == pod and getattr(s, value) is not None
            ]
            for (xa, ya), (xb, yb) in itertools.pairwise(points):
                line(xa, ya, xb, yb, _COLOURS[pod % len(_COLOURS)])
    return _png(width, height, pixels)


async def soak(args: argparse.Namespace, workdir: Path) -> SoakResult:
    census_dir = Path(args.census_dir).resolve() if args.census_dir else None
    argv = [sys.executable, "-m", "benches.heap_census", "child", str(census_dir)] if census_dir else None
    rig = Rig(workdir, BackendShape(), {"SIE_SIDECAR_DEBUG_ENDPOINT": "1"}, argv)  # live memory via /debug/state
    await rig.start()
    samples: list[Sample] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sampler(rig, samples, stop))
    faults: list[tuple[float, str]] = []
    try:
        capacity = await measure_capacity(rig.gateway, 2000)
        rate = 0.7 * capacity
        duration_s = args.minutes * 60
        items = int(rate * duration_s)
        ledger = rig.gateway.ledger("soak", items)
        start = rig.gateway.now()
        print(
            f"soak: {items:,} items at {rate:,.0f}/s for {args.minutes:g} min (capacity {capacity:,.0f}/s)", flush=True
        )

        async def inject() -> None:
            n = 0
            while True:
                await asyncio.sleep(args.fault_every_min * 60)
                fault = FAULTS[n % len(FAULTS)]
                faults.append((rig.gateway.now(), fault.name))
                print(f"  t={rig.gateway.now() - start:7.1f}s fault {fault.name}", flush=True)
                await fault.prepare(rig, rig.mark)
                await fault.inject(rig, rig.mark)
                n += 1

        async def census() -> None:
            assert census_dir is not None
            for minute in sorted(args.census_at_min):
                await asyncio.sleep(max(0.0, start + minute * 60 - rig.gateway.now()))
                for pod in rig.pods:
                    if pod.sidecar.alive and await heap_census.take_census(pod.sidecar.pid, census_dir):
                        print(f"  t={rig.gateway.now() - start:7.1f}s heap census of sidecar-{pod.index}", flush=True)

        background = [asyncio.create_task(inject())]
        if census_dir is not None:
            background.append(asyncio.create_task(census()))
        publish_end = await rig.gateway.publish_open_loop(ledger, rate)
        for task in background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        settled = await _settle(rig, [ledger], 180.0)
        result = count(ledger, rig.marks, set(), _gave_up(rig, ledger), publish_end)
        stop.set()
        await sampler
        out = SoakResult(
            minutes=args.minutes,
            rate=rate,
            capacity=capacity,
            items=items,
            lost=result.lost + (0 if settled else result.in_stream),
            duplicated_items=result.duplicated_items,
            exactly_once=result.exactly_once,
            in_stream=result.in_stream,
            faults=faults,
            samples=samples,
        )
        out.flat = _judge_and_plot(samples, faults, args)
        return out
    finally:
        stop.set()
        sampler.cancel()
        await rig.stop()


def _judge_and_plot(samples: list[Sample], faults: list[tuple[float, str]], args: argparse.Namespace) -> dict[str, Any]:
    """The flatness verdict with the command line's allowances, and the plot when `--png` asks."""
    verdict = flatness(
        samples,
        args.warmup_s,
        args.rss_growth_pct,
        args.fd_growth,
        args.min_span_s,
        live_pct=args.live_growth_pct,
        blocks_pct=args.blocks_growth_pct,
    )
    if args.png:
        Path(args.png).write_bytes(plot(samples, faults, max(s.t for s in samples)))
    return verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--fault-every-min", type=float, default=5.0)
    parser.add_argument("--rss-growth-pct", type=float, default=10.0, help="allowed RSS growth of a long-lived sidecar")
    parser.add_argument(
        "--live-growth-pct", type=float, default=10.0, help="allowed live-memory growth (C heap in use, Python blocks)"
    )
    parser.add_argument(
        "--blocks-growth-pct",
        type=float,
        default=1.0,
        help="allowed growth of Python blocks over the steady part, the messages held taken out",
    )
    parser.add_argument("--fd-growth", type=int, default=8, help="allowed open-fd growth of a long-lived sidecar")
    parser.add_argument("--warmup-s", type=float, default=180.0, help="a process's own start-up, not judged")
    parser.add_argument("--min-span-s", type=float, default=600.0, help="shortest steady part that is judged")
    parser.add_argument("--png", help="write the RSS/fd plot here")
    parser.add_argument("--from-json", help="judge and plot the samples of an earlier run's --json again")
    parser.add_argument("--json", help="write the samples and the verdict here")
    parser.add_argument("--census-dir", help="run the sidecars under benches.heap_census; censuses go here")
    parser.add_argument(
        "--census-at-min",
        type=lambda text: [float(part) for part in text.split(",") if part],
        default=[4.0, 24.0],
        metavar="M,M",
        help="minutes into the load at which every live sidecar takes a heap census",
    )
    args = parser.parse_args(argv)
    began = time.monotonic()
    if args.from_json:
        raw = json.loads(Path(args.from_json).read_text())
        samples = [Sample(**s) for s in raw.pop("samples")]
        result = SoakResult(**{**raw, "samples": samples, "faults": [tuple(f) for f in raw["faults"]]})
        result.flat = _judge_and_plot(samples, result.faults, args)
    else:
        with tempfile.TemporaryDirectory(prefix="sie-soak-") as tmp:
            result = asyncio.run(soak(args, Path(tmp)))
    checked = [v for v in result.flat.values() if v.get("checked")]
    ok = result.lost == 0 and bool(checked) and all(v["ok"] for v in checked)
    if args.census_dir:  # tracemalloc inflates RSS and each census's collection drops the blocks
        print("soak: memory not judged under the heap census; only items lost count")
        ok = result.lost == 0
    print(
        f"soak: {result.items:,} items, exactly once {result.exactly_once:,}, duplicated {result.duplicated_items:,},"
        f" lost {result.lost}; faults {len(result.faults)}; wall {time.monotonic() - began:.0f} s"
    )
    for pod, verdict in result.flat.items():
        print(f"  {pod}: {verdict}")
    print("PASS" if ok else "FAIL")
    if args.census_dir:
        print(heap_census.report(Path(args.census_dir)))
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(result), indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
