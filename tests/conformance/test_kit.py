# SPDX-License-Identifier: Apache-2.0
"""The conformance kit (`sie_sidecar.tools.conformance`) against the reference backend over a real
socket: every check passes, its command reports it, and a backend that breaks the protocol fails
the checks it should."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer
from sie_sidecar.tools import conformance

MODEL = "org/conformance"


@pytest.fixture
async def socket_path() -> AsyncIterator[str]:
    directory = tempfile.mkdtemp(prefix="sie-conf-", dir="/tmp")
    try:
        yield os.path.join(directory, "backend.sock")
    finally:
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)


VIAS = ["frames", "client"]


@pytest.mark.parametrize("via", VIAS)
async def test_the_reference_backend_passes_every_check(socket_path: str, via: conformance.Via) -> None:
    """Raw frames prove the backend against the spec; the same transcripts through the sidecar's IPC
    client and typed decoders prove the two halves of a pod agree."""
    server = BackendServer(NullAdapter(8, load_delay_s=0.2), socket_path, worker_id="ref")
    await server.start()
    try:
        results = await conformance.run_checks(socket_path, MODEL, via=via)
    finally:
        await server.close()
    assert [(name, failure) for name, failure in results if failure is not None] == []
    assert len(results) == len(conformance.CHECKS)
    assert server.method_calls["RunBatch"] >= 6 and server.method_calls["Drain"] == 1


@pytest.mark.parametrize("via", VIAS)
async def test_a_per_op_backend_fails_only_the_run_batch_check(socket_path: str, via: conformance.Via) -> None:
    server = BackendServer(
        NullAdapter(8, supports_run_batch=False, preloaded_models=[MODEL]), socket_path, worker_id="old"
    )
    await server.start()
    try:
        results = dict(await conformance.run_checks(socket_path, MODEL, via=via))
    finally:
        await server.close()
    assert results["RunBatch"] == "RunBatch failed: unknown method RunBatch"
    failed = {name for name, failure in results.items() if failure is not None}
    run_batch_checks = {name for name in results if name.startswith("RunBatch")}
    assert failed == run_batch_checks | {"Drain (last: leaves the backend draining)"}  # its refusal: unknown method
    assert all("unknown method RunBatch" in (results[name] or "") for name in run_batch_checks)


async def test_a_backend_with_a_broken_envelope_fails_loudly(socket_path: str) -> None:
    """A server answering with the envelope keys out of order (the fast path needs them in order)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import struct

        import msgpack

        try:
            while True:
                try:
                    head = await reader.readexactly(4)
                except asyncio.IncompleteReadError:
                    return
                request: dict[str, Any] = msgpack.unpackb(await reader.readexactly(struct.unpack(">I", head)[0]))
                reply = {"ok": True, "version": 1, "request_id": request["request_id"], "body": {}, "error": None}
                data = msgpack.packb(reply)
                writer.write(struct.pack(">I", len(data)) + data)
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_unix_server(serve, socket_path)
    try:
        results = await conformance.run_checks(socket_path, MODEL)
    finally:
        server.close()
        await server.wait_closed()
    assert all(failure is not None and "in order" in failure for _, failure in results)


async def test_the_client_path_fails_an_answer_the_sidecar_cannot_decode(socket_path: str) -> None:
    """A backend whose Ping says `ready: "yes"`: the frames path names the field, and the client path
    reports that the sidecar's own decoder refuses the answer (a pod with it would never be ready)."""
    server = BackendServer(NullAdapter(8, preloaded_models=[MODEL]), socket_path, worker_id="odd")

    async def odd_ping(body: dict[str, Any]) -> dict[str, Any]:
        return {"timestamp_ms": body["timestamp_ms"], "worker_id": "odd", "ready": "yes"}

    server._handlers["Ping"] = odd_ping  # a backend built elsewhere, answering a non-bool
    await server.start()
    try:
        frames = dict(await conformance.run_checks(socket_path, MODEL, conformance.CHECKS[:1]))
        client = dict(await conformance.run_checks(socket_path, MODEL, conformance.CHECKS[:1], via="client"))
    finally:
        await server.close()
    assert frames["Ping"] == "ready is not a bool"
    assert (client["Ping"] or "").startswith("the sidecar's decoder refused the Ping answer: ")


def test_the_command_prints_pass_and_fail_per_check(socket_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    async def main() -> int:
        server = BackendServer(NullAdapter(8, preloaded_models=[MODEL]), socket_path, worker_id="ref")
        await server.start()
        try:
            args = ["--socket", socket_path, "--model", MODEL]
            frames = await asyncio.to_thread(conformance.main, args)
            server.undrain()  # the Drain check leaves it draining
            return frames + await asyncio.to_thread(conformance.main, [*args, "--via", "client"])
        finally:
            await server.close()

    assert asyncio.run(main()) == 0
    out = capsys.readouterr().out
    assert "pass  Ping" in out and out.count(f"{len(conformance.CHECKS)}/{len(conformance.CHECKS)} passed") == 2
