# SPDX-License-Identifier: Apache-2.0
"""The multiplexed IPC transport (wire-protocol §1.2) against the real reference backend: pipelined
requests on one connection, interleaved chunked responses, a timeout that keeps the connection, a
backend restart mid-request, and the whole sidecar over it. The typed calls run over both transports
in test_ipc.py."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer
from sie_sidecar.errors import IpcTimeout
from sie_sidecar.ipc.mux import MAX_IN_FLIGHT, MuxIpcClient
from sie_sidecar.telemetry import IPC_CHUNK_COUNT, IPC_RECONSTRUCTED_SIZE, Registry
from sie_sidecar.wire.limits import MiB

from .conftest import NatsServer
from .stack import running_stack, work_item
from .test_ipc import MODEL, run_batch_body, wrapped

pytestmark = pytest.mark.timeout(60)


async def until(predicate: object, timeout: float = 10.0) -> None:
    assert callable(predicate)
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_requests_are_pipelined_on_one_connection(sock_dir: str) -> None:
    """Ten batches are at the backend at the same time, all on the client's one connection."""
    sock = os.path.join(sock_dir, "mux.sock")
    adapter = NullAdapter(8, preloaded_models=[MODEL], batch_delay_s=0.5)
    async with BackendServer(adapter, sock, worker_id="w") as server:
        client = MuxIpcClient(sock, request_timeout_s=10)
        try:
            body = run_batch_body([wrapped("encode", i) for i in range(4)])
            calls = [asyncio.create_task(client.run_batch(body)) for _ in range(10)]
            await until(lambda: len(server._heavy) == 10)
            assert client.open_connections == 1 and client.in_flight == 10
            results = await asyncio.gather(*calls)
            assert [len(r.outcomes) for r in results] == [4] * 10
            assert all(o.disposition == "publish_and_ack" for r in results for o in r.outcomes)
            assert client.connects == 1 and client.in_flight == 0
        finally:
            await client.close()


async def test_chunked_responses_of_concurrent_requests_interleave(sock_dir: str) -> None:
    """Responses over 32 MiB come back as chunk frames; two at once are reassembled by id."""
    sock = os.path.join(sock_dir, "mux.sock")
    adapter = NullAdapter(8, oversized_bytes=33 * MiB, preloaded_models=[MODEL])
    async with BackendServer(adapter, sock, worker_id="w"):
        client = MuxIpcClient(sock, request_timeout_s=30)
        client.telemetry = telemetry = Registry()
        try:
            bodies = [run_batch_body([wrapped("encode", i)]) for i in range(2)]
            results = await asyncio.gather(*(client.run_batch(b) for b in bodies))
            assert [len(r.outcomes) for r in results] == [1, 1]
            sizes = [len(r.outcomes[0].result_msgpack or b"") for r in results]
            assert all(size > 32 * MiB for size in sizes), sizes
            assert client.connects == 1
            assert telemetry.histogram(IPC_CHUNK_COUNT).count == 2  # one record per reassembled transfer
            assert telemetry.histogram(IPC_RECONSTRUCTED_SIZE).sum > 64 * MiB
            assert (client.capacity, client.busy) == (MAX_IN_FLIGHT, 0)
        finally:
            await client.close()


async def test_a_timeout_keeps_the_connection_and_drops_the_late_answer(sock_dir: str) -> None:
    sock = os.path.join(sock_dir, "mux.sock")
    adapter = NullAdapter(8, preloaded_models=[MODEL], batch_delay_s=0.6)
    async with BackendServer(adapter, sock, worker_id="w"):
        client = MuxIpcClient(sock, request_timeout_s=0.2)
        try:
            with pytest.raises(IpcTimeout):
                await client.run_batch(run_batch_body([wrapped("encode", 0)]))
            pong = await client.ping()  # answered on the same connection while the batch still runs
            assert pong.worker_id == "w"
            await asyncio.sleep(0.6)  # the late RunBatch answer arrives for an id no longer in flight
            assert (await client.ping()).worker_id == "w"
            assert client.connects == 1 and client.in_flight == 0
        finally:
            await client.close()


async def test_a_restarted_backend_is_reconnected_and_the_request_retried(sock_dir: str) -> None:
    sock = os.path.join(sock_dir, "mux.sock")
    first = BackendServer(NullAdapter(8, preloaded_models=[MODEL]), sock, worker_id="first")
    await first.start()
    client = MuxIpcClient(sock, request_timeout_s=5)
    try:
        assert (await client.ping()).worker_id == "first"
        await first.close()
        Path(sock).unlink(missing_ok=True)
        second = BackendServer(NullAdapter(8, preloaded_models=[MODEL]), sock, worker_id="second")
        await second.start()
        try:
            assert (await client.ping()).worker_id == "second"  # the dead connection: one retry, reconnected
            assert client.connects == 2
        finally:
            await second.close()
    finally:
        await client.close()


async def test_the_sidecar_serves_over_the_mux(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path, env={"SIE_IPC_MUX": "1"}) as stack:
        ids = [await stack.publish(work_item(text=f"t{i}")) for i in range(60)]
        await stack.wait_for(lambda: all(len(stack.results_for(i)) == 1 for i in ids), timeout=20)
        assert all(stack.results_for(i)[0]["success"] for i in ids)
        await stack.settled_pool()
