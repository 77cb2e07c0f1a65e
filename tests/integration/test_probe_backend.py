# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar probe backend`: the backend container's liveness over its real IPC socket. A live
reference backend passes; one that is stuck (accepts, never answers), unhealthy (`ready = false`),
drained, or gone fails with the reason, so the kubelet restarts it."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sie_sidecar.backend import BackendServer, NullAdapter
from sie_sidecar.cli import build_parser
from sie_sidecar.config import DEFAULT_IPC_SOCKET_PATH
from sie_sidecar.ipc.client import IpcClient
from sie_sidecar.tools.probe import DEFAULT_SOCKET, backend_socket, run_probe

pytestmark = pytest.mark.timeout(30)
MODEL = "probe/model"


class SwitchableHealth(NullAdapter):
    """The null adapter whose accelerator check can be failed."""

    def __init__(self) -> None:
        super().__init__(8, preloaded_models=(MODEL,))
        self.device_ok = True

    def healthy(self) -> bool:
        return self.device_ok


@pytest.fixture
async def backend(sock_dir: str) -> AsyncIterator[tuple[BackendServer, SwitchableHealth]]:
    adapter = SwitchableHealth()
    server = BackendServer(adapter, os.path.join(sock_dir, "live.sock"), worker_id="probe-test")
    await server.start()
    try:
        yield server, adapter
    finally:
        await server.close()


async def probe(socket_path: str, timeout_s: float = 2.0) -> tuple[int, str]:
    out = io.StringIO()
    args = build_parser("probe").parse_args(["probe", "backend", "--socket", socket_path, "--timeout", str(timeout_s)])
    code = await asyncio.to_thread(run_probe, args, out)
    return code, out.getvalue()


async def test_a_live_backend_passes_and_names_its_models(backend: tuple[BackendServer, SwitchableHealth]) -> None:
    server, _ = backend
    assert await probe(server.socket_path) == (0, f"backend alive: ready; loaded {MODEL}\n")


async def test_an_unhealthy_backend_fails(backend: tuple[BackendServer, SwitchableHealth]) -> None:
    server, adapter = backend
    adapter.device_ok = False
    code, text = await probe(server.socket_path)
    assert (code, text) == (1, "backend dead: Ping answered ready=false (the backend's health check fails)\n")


async def test_a_drained_backend_fails(backend: tuple[BackendServer, SwitchableHealth]) -> None:
    """Drained while its sidecar is connected (this library takes work again once the draining
    sidecar's connections close; a `--keep-drain` or upstream backend stays drained for good)."""
    server, _ = backend
    client = IpcClient(server.socket_path, request_timeout_s=5)
    try:
        assert await client.drain(1000) is True
        code, text = await probe(server.socket_path)
    finally:
        await client.close()
    assert (code, text) == (1, "backend dead: the backend is draining and will take no more work\n")


async def test_a_stuck_backend_fails_at_the_timeout(sock_dir: str) -> None:
    path = os.path.join(sock_dir, "stuck.sock")
    accepted: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # read nothing, answer nothing: a wedged event loop looks like this

    server = await asyncio.start_unix_server(hold, path)
    try:
        started = time.monotonic()
        code, text = await probe(path, timeout_s=0.5)
        took = time.monotonic() - started
    finally:
        server.close()
        for writer in accepted:
            writer.close()
    assert code == 1 and text.startswith("backend dead: TimeoutError"), text
    assert 0.5 <= took < 2.0, took


async def test_no_backend_fails_with_the_reason(tmp_path: Path) -> None:
    code, text = await probe(str(tmp_path / "absent.sock"))
    assert code == 1 and text.startswith("backend dead: FileNotFoundError"), text


def test_the_socket_is_the_flag_else_the_variable_run_reads_else_its_default() -> None:
    assert DEFAULT_SOCKET == DEFAULT_IPC_SOCKET_PATH
    assert backend_socket("/a.sock", {"SIE_IPC_SOCKET_PATH": "/b.sock"}) == "/a.sock"
    assert backend_socket(None, {"SIE_IPC_SOCKET_PATH": " /b.sock "}) == "/b.sock"
    assert backend_socket(None, {}) == DEFAULT_SOCKET


async def test_the_installed_command_probes_a_live_backend(backend: tuple[BackendServer, SwitchableHealth]) -> None:
    """The exec probe as the kubelet runs it: a fresh process, exit status only."""
    server, _ = backend
    command = [sys.executable, "-m", "sie_sidecar", "probe", "backend", "--socket", server.socket_path]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("backend alive")
