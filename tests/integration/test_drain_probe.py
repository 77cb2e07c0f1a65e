# SPDX-License-Identifier: Apache-2.0
"""The drain probe (issue 11): Ping's `ready` is the backend's health, so a drain shows only as
`draining` refusals; the sidecar learns it from an empty batch, which spends no work item's delivery.
Real backend servers over real sockets; `heartbeat` is the function the app runs."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable

import pytest

from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer
from sie_sidecar.ipc.client import IpcClient
from sie_sidecar.pipeline.readiness import Readiness, heartbeat

MODEL = "org/model"


class AdoptedHashes:
    """The config sink the heartbeat reports the backend's bundle hash to."""

    def __init__(self) -> None:
        self.hashes: list[str] = []

    def adopt(self, backend_hash: str) -> None:
        self.hashes.append(backend_hash)


async def serve(sock_dir: str, name: str, *, supports_run_batch: bool = True) -> BackendServer:
    adapter = NullAdapter(8, preloaded_models=[MODEL], supports_run_batch=supports_run_batch)
    server = BackendServer(adapter, os.path.join(sock_dir, name), worker_id=name)
    await server.start()
    return server


@pytest.fixture
async def backend(sock_dir: str) -> AsyncIterator[BackendServer]:
    server = await serve(sock_dir, "a.sock")
    try:
        yield server
    finally:
        await server.close()


@pytest.mark.parametrize("run_batch", [True, False], ids=["run-batch", "per-op"])
async def test_the_probe_tells_a_draining_backend_without_spending_work(sock_dir: str, run_batch: bool) -> None:
    """A RunBatch backend and a per-op one (RunBatch is an unknown method): the probe is an empty
    batch either way, the backend counts no refused item, and its adapter never sees a batch."""
    server = await serve(sock_dir, "b.sock", supports_run_batch=run_batch)
    ipc = IpcClient(server.socket_path, pool_size=1, request_timeout_s=5.0)
    adapter = server.adapter
    assert isinstance(adapter, NullAdapter)
    try:
        assert await ipc.probe_draining(MODEL) is False
        server.drain_for(None)
        assert (await ipc.ping()).ready is True  # healthy while draining
        assert await ipc.probe_draining(MODEL) is True
        assert await ipc.probe_draining("") is True  # no model known yet (the handshake)
        server.undrain()
        assert await ipc.probe_draining("") is False
        assert server.refused_items == 0 and adapter.batches == 0
        if not run_batch:
            assert server.method_calls["ProcessEncodeBatch"] == 4
    finally:
        await ipc.close()
        await server.close()


@contextlib.asynccontextmanager
async def beating(clients: list[IpcClient], readiness: Readiness) -> AsyncIterator[None]:
    """The heartbeat running over `clients` for the block's length."""
    stop = asyncio.Event()
    task = asyncio.create_task(heartbeat(list(clients), readiness, AdoptedHashes(), stop))
    try:
        yield
    finally:
        stop.set()
        await task
        for client in clients:
            await client.close()


async def next_rounds(readiness: Readiness, until: Callable[[], bool]) -> None:
    """Wait for heartbeat rounds until `until()` holds after one."""
    async with asyncio.timeout(10):
        while True:
            readiness.changed.clear()
            await readiness.changed.wait()
            if until():
                return


async def test_the_handshake_probes_before_the_gate_can_open(backend: BackendServer) -> None:
    """A backend left draining answers its first Ping ready; the round that publishes that answer
    already says "backend draining", so the pull gate never sees a moment to pull in."""
    backend.drain_for(None)
    readiness = Readiness(ping_interval_ms=50)
    seen: list[str | None] = []

    def three_rounds() -> bool:
        seen.append(readiness.pull_reason())
        return len(seen) >= 3

    async with beating([IpcClient(backend.socket_path, pool_size=1, request_timeout_s=5.0)], readiness):
        await next_rounds(readiness, three_rounds)
        assert readiness.reason() is None  # the heartbeat is fine: /readyz keeps the v0.7.1 rule
        assert all(r is not None and r.startswith("backend draining") for r in seen), seen
        backend.undrain()
        await next_rounds(readiness, lambda: readiness.pull_reason() is None)
        assert not readiness.backend_draining and not readiness.probe_due
        probes, pings = backend.method_calls["RunBatch"], backend.method_calls["Ping"]
        await next_rounds(readiness, lambda: backend.method_calls["Ping"] >= pings + 3)
        assert backend.method_calls["RunBatch"] == probes  # no probe in steady state


async def test_a_refused_batch_closes_the_gate_until_a_probe_reopens_it(backend: BackendServer) -> None:
    readiness = Readiness(ping_interval_ms=50)
    async with beating([IpcClient(backend.socket_path, pool_size=1, request_timeout_s=5.0)], readiness):
        await next_rounds(readiness, lambda: readiness.pull_reason() is None)
        backend.drain_for(None)
        readiness.backend_refused()  # what the dispatcher does when a batch comes back `draining`
        assert (readiness.pull_reason() or "").startswith("backend draining")
        calls = backend.method_calls["RunBatch"]
        await next_rounds(readiness, lambda: backend.method_calls["RunBatch"] >= calls + 3)
        assert readiness.backend_draining  # each round probed, and each said draining
        backend.undrain()
        await next_rounds(readiness, lambda: readiness.pull_reason() is None)


async def test_a_refusal_during_a_probe_is_not_undone_by_its_answer(backend: BackendServer) -> None:
    """The probe answered "takes work", but a batch was refused as draining while it was asked: the
    refusal is newer, so the gate stays shut until the next probe."""

    class RefusedMeanwhile(IpcClient):
        async def probe_draining(self, model_id: str = "") -> bool:
            answer = await super().probe_draining(model_id)
            readiness.backend_refused()
            return answer

    readiness = Readiness(ping_interval_ms=50)
    async with beating([RefusedMeanwhile(backend.socket_path, pool_size=1, request_timeout_s=5.0)], readiness):
        await next_rounds(readiness, lambda: readiness.last_ping_ok is not None)
        assert readiness.backend_draining and (readiness.pull_reason() or "").startswith("backend draining")


async def test_a_child_that_cannot_be_probed_leaves_the_probe_due(backend: BackendServer) -> None:
    """Two children: one answers its Ping and then goes away before the probe (a transport failure).
    The verdict stays as it was and the next round probes again."""

    class GoneBeforeProbe(IpcClient):
        async def probe_draining(self, model_id: str = "") -> bool:
            raise ConnectionResetError("gone")

    readiness = Readiness(ping_interval_ms=50)
    good = IpcClient(backend.socket_path, pool_size=1, request_timeout_s=5.0)
    bad = GoneBeforeProbe(backend.socket_path, pool_size=1, request_timeout_s=5.0)
    async with beating([good, bad], readiness):
        await next_rounds(readiness, lambda: True)
        assert readiness.probe_due and not readiness.backend_draining and readiness.ready_children == 2
