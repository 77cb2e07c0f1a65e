# SPDX-License-Identifier: Apache-2.0
"""Sidecar + backend pairs on one pool: start, readiness, kill -9, SIGTERM, graceful backend restart.

Each pod is `python -m sie_sidecar run` (its own worker id and probe port, every cluster URL in
`SIE_NATS_URL`) next to `python -m benches.chaos.backend` (the null adapter with an `a + b·tokens`
batch time, the model preloaded) on its own Unix socket.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .procs import Proc

MODEL = "null/vectors"
POOL = "default"
BUNDLE = "default"
PROFILE = "cpu"
READY_TIMEOUT_S = 60.0
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class BackendShape:
    """The null adapter's cost model, the graceful restart's drain and the batch hang's length (longer
    than the pool's 30 s ack_wait)."""

    batch_time_a_ms: float = 10.0
    batch_time_b_us: float = 50.0
    batch_budget: int = 64
    drain_s: float = 5.0
    hang_s: float = 35.0


def worker_id(index: int) -> str:
    return f"chaos-pod-{index}"


class Pod:
    """One sidecar and its backend."""

    def __init__(
        self,
        index: int,
        workdir: Path,
        nats_urls: list[str],
        *,
        probe_port: int,
        shape: BackendShape,
        sidecar_env: dict[str, str],
        sidecar_argv: list[str] | None = None,
    ) -> None:
        """`sidecar_argv` replaces `python -m sie_sidecar run` (the leak check's heap census wraps it)."""
        self.index = index
        self.worker_id = worker_id(index)
        self.socket = str(workdir / f"pod{index}.sock")
        self.probe_port = probe_port
        base = {k: v for k, v in os.environ.items() if not k.startswith("SIE_")}
        # The children run `-m benches...` (the chaos backend, the heap census): wherever the rig was
        # started from, they find the repository's `benches`.
        base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH", "")]))
        self.backend = Proc(
            f"backend-{index}",
            [
                sys.executable,
                "-m",
                "benches.chaos.backend",
                "--adapter",
                "null",
                "--socket",
                self.socket,
                "--preload",
                MODEL,
                "--worker-id",
                self.worker_id,
                "--batch-time",
                f"{shape.batch_time_a_ms:g},{shape.batch_time_b_us:g}",
                "--batch-budget",
                str(shape.batch_budget),
                "--drain-s",
                f"{shape.drain_s:g}",
                "--hang-s",
                f"{shape.hang_s:g}",
            ],
            base,
            workdir / f"backend-{index}.log",
        )
        env = {
            **base,
            "SIE_NATS_URL": ",".join(nats_urls),
            "SIE_POOL": POOL,
            "SIE_BUNDLE": BUNDLE,
            "SIE_MACHINE_PROFILE": PROFILE,
            "SIE_IPC_SOCKET_PATH": self.socket,
            "SIE_WORKER_ID": self.worker_id,
            "SIE_WORKER_PROBE_PORT": str(probe_port),
            "SIE_STREAM_STORAGE": "file",
            # The rig creates the streams first (one creator, no election race at the sidecars' start-up);
            # each sidecar then ensures the same count, as a pool on a cluster would be configured.
            "SIE_STREAM_REPLICAS": "3",
            "RUST_LOG": "info",
            **sidecar_env,
        }
        self.sidecar = Proc(
            f"sidecar-{index}",
            sidecar_argv or [sys.executable, "-m", "sie_sidecar", "run"],
            env,
            workdir / f"sidecar-{index}.log",
        )

    # -- backend --

    async def start_backend(self) -> None:
        self.backend.start()
        await self.wait_backend()

    async def wait_backend(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until the backend's socket accepts a connection."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.backend.alive:
                raise RuntimeError(f"{self.backend.name} exited:\n{self.backend.tail()}")
            try:
                _, writer = await asyncio.open_unix_connection(self.socket)
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.backend.name} not serving after {timeout_s:g} s") from None
                await asyncio.sleep(0.05)
                continue
            writer.close()
            return

    def kill_backend(self) -> None:
        self.backend.kill()

    def hang_backend_batches(self) -> None:
        """SIGUSR2: batches hang for the backend's `--hang-s` while its heartbeat answers."""
        self.backend.signal(signal.SIGUSR2)

    async def graceful_backend_restart(self, timeout_s: float = 60.0) -> float:
        """SIGUSR1: drain (refuse batches) for the shape's drain_s, exit 0; then start it again.
        Returns when the new backend serves; the result is how long the old one took to exit."""
        started = time.monotonic()
        self.backend.signal(signal.SIGUSR1)
        code = await asyncio.to_thread(self.backend.wait, timeout_s)
        exited = time.monotonic() - started
        if code is None:
            raise RuntimeError(f"{self.backend.name} did not exit within {timeout_s:g} s of SIGUSR1")
        self.backend.kill()  # reap the group
        await self.start_backend()
        return exited

    # -- sidecar --

    async def start_sidecar(self, *, wait: bool = True) -> None:
        self.sidecar.start()
        if wait:
            await self.wait_ready()

    async def get(self, path: str) -> tuple[int, bytes]:
        """(status, body) of a GET on the sidecar's probe port; (0, b"") when it does not answer in time."""
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.probe_port), 1.0)
        except (OSError, TimeoutError):
            return 0, b""
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            raw = await asyncio.wait_for(reader.read(), 2.0)
        except (OSError, TimeoutError):
            return 0, b""
        finally:
            writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        status = head.split(b" ")[1:2]
        return (int(status[0]), body) if status and status[0].isdigit() else (0, b"")

    async def ready(self) -> bool:
        return (await self.get("/readyz"))[0] == 200

    async def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not await self.ready():
            if not self.sidecar.alive:
                raise RuntimeError(f"{self.sidecar.name} exited ({self.sidecar.returncode}):\n{self.sidecar.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.sidecar.name} not ready after {timeout_s:g} s:\n{self.sidecar.tail()}")
            await asyncio.sleep(0.1)

    def kill_sidecar(self) -> None:
        self.sidecar.kill()

    async def terminate_sidecar(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait for the drain to finish; the exit code (None: killed after `timeout_s`)."""
        self.sidecar.signal(signal.SIGTERM)
        code = await asyncio.to_thread(self.sidecar.wait, timeout_s)
        self.sidecar.kill()
        return code

    def stop(self) -> None:
        self.sidecar.stop()
        self.backend.stop()


__all__ = ["BUNDLE", "MODEL", "POOL", "PROFILE", "BackendShape", "Pod", "worker_id"]
