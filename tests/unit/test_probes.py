# SPDX-License-Identifier: Apache-2.0
"""The probe server (sidecar-behaviour §10): exact answers, and a bounded, uncrashable request path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

import sie_sidecar
from sie_sidecar import probes
from sie_sidecar.pipeline.readiness import Readiness
from sie_sidecar.probes import BadRequest, ProbeServer, Request, parse_request_head, start_probes
from sie_sidecar.telemetry import Registry

from ..peers import http_get_from, non_loopback_address

PLAIN = "Content-Type: text/plain; charset=utf-8"


def response(status: str, body: str) -> bytes:
    return (f"HTTP/1.1 {status}\r\n{PLAIN}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode()


async def exchange(port: int, data: bytes, *, half_close: bool = False) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        if half_close:
            writer.write_eof()
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_healthz_readyz_and_not_found_answer_exactly(server: ProbeServer, readiness: Readiness) -> None:
    get = "GET {} HTTP/1.1\r\nHost: x\r\n\r\n".format
    assert await exchange(server.port, get("/healthz").encode()) == response("200 OK", "ok")
    assert await exchange(server.port, get("/readyz").encode()) == response(
        "503 Service Unavailable", "not ready: handshake pending"
    )
    readiness.last_ping_ok = time.monotonic()
    assert await exchange(server.port, get("/readyz?verbose=1").encode()) == response("200 OK", "ok")
    for other in ("/", "/metrics", "/healthz/", "/readyzz", "*"):
        assert await exchange(server.port, get(other).encode()) == response("404 Not Found", "not found"), other
    post = b"POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
    assert await exchange(server.port, post) == response("404 Not Found", "not found")


async def test_head_has_the_get_headers_and_no_body(server: ProbeServer) -> None:
    got = await exchange(server.port, b"HEAD /healthz HTTP/1.0\r\n\r\n")
    assert got == response("200 OK", "ok")[: -len("ok")]


async def test_an_http_client_reads_the_answers(server: ProbeServer, readiness: Readiness) -> None:
    """A real client (kubelet-like, keep-alive by default) gets status, body and content type."""
    base = f"http://127.0.0.1:{server.port}"
    async with aiohttp.ClientSession() as http:
        for _ in range(3):  # the session reconnects after each `Connection: close`
            async with http.get(f"{base}/healthz") as r:
                assert (r.status, await r.text(), r.headers["Content-Type"]) == (200, "ok", "text/plain; charset=utf-8")
        readiness.draining = True
        async with http.get(f"{base}/readyz") as r:
            assert (r.status, await r.text()) == (503, "not ready: draining")
        async with http.get(f"{base}/nope") as r:
            assert (r.status, await r.text()) == (404, "not found")


@pytest.mark.parametrize(
    ("head", "reason"),
    [
        (b"GET /healthz\r\n\r\n", "request line is not 'method target version'"),
        (b"GET  /healthz HTTP/1.1\r\n\r\n", "request line is not 'method target version'"),
        (b"G(T /healthz HTTP/1.1\r\n\r\n", "method is not a token"),
        (b"GET /healthz HTTP/2.0\r\n\r\n", "not HTTP/1.0 or HTTP/1.1"),
        (b"GET /health\x00z HTTP/1.1\r\n\r\n", "request target is empty or not printable ASCII"),
        (b"GET /h\xc3\xa9 HTTP/1.1\r\n\r\n", "request target is empty or not printable ASCII"),
        (b"GET /healthz HTTP/1.1\r\nno colon\r\n\r\n", "malformed header line"),
        (b"GET /healthz HTTP/1.1\r\nHost : x\r\n\r\n", "malformed header line"),
        (b"GET /healthz HTTP/1.1\r\n folded\r\n\r\n", "malformed header line"),
        (b"\r\n\r\n", "request line is not 'method target version'"),
    ],
)
async def test_a_malformed_request_gets_a_clear_400(server: ProbeServer, head: bytes, reason: str) -> None:
    assert parse_request_head(head) == BadRequest(reason)
    assert await exchange(server.port, head) == response("400 Bad Request", f"bad request: {reason}")


async def test_an_oversized_head_gets_a_400_and_the_server_keeps_serving(server: ProbeServer) -> None:
    huge = b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * (2 * probes.MAX_HEAD_BYTES) + b"\r\n\r\n"
    got = await exchange(server.port, huge)
    assert got.startswith(b"HTTP/1.1 400 Bad Request\r\n") and got.endswith(b"bad request: request head too large")
    assert await exchange(server.port, b"GET /healthz HTTP/1.1\r\n\r\n") == response("200 OK", "ok")


async def test_a_slow_request_times_out_with_408(server: ProbeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes, "HEAD_TIMEOUT_S", 0.2)
    started = time.monotonic()
    got = await exchange(server.port, b"GET /healthz HTTP/1.1\r\n")  # never finishes its head
    assert got == response("408 Request Timeout", "request timeout")
    assert time.monotonic() - started < 5


async def test_a_client_that_leaves_early_costs_nothing(server: ProbeServer) -> None:
    assert await exchange(server.port, b"GET /heal", half_close=True) == b""
    with socket.create_connection(("127.0.0.1", server.port)) as raw:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        raw.sendall(b"GET /healthz HTTP/1.1\r\n")
    assert await exchange(server.port, b"GET /healthz HTTP/1.1\r\n\r\n") == response("200 OK", "ok")


async def test_connections_beyond_the_bound_are_closed(server: ProbeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes, "MAX_CONNECTIONS", 2)
    idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
    try:
        await asyncio.sleep(0.05)
        with contextlib.suppress(ConnectionResetError):  # closed on accept: EOF or a reset
            assert await exchange(server.port, b"GET /healthz HTTP/1.1\r\n\r\n") == b""
    finally:
        for _, writer in idle:
            writer.close()
    await asyncio.sleep(0.05)
    assert await exchange(server.port, b"GET /healthz HTTP/1.1\r\n\r\n") == response("200 OK", "ok")


async def test_cleanup_ends_open_connections_and_frees_the_port(readiness: Readiness) -> None:
    server = await start_probes(readiness, 0, host="127.0.0.1")
    assert server is not None
    port = server.port
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.sleep(0.05)
    await asyncio.wait_for(server.cleanup(), 5)
    writer.close()
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


async def test_a_port_in_use_is_logged_and_none_returned(
    readiness: Readiness, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        assert await start_probes(readiness, port, host="127.0.0.1") is None
    assert [r.getMessage() for r in caplog.records] == ["probe server could not bind"]


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("/healthz", "/healthz"),
        ("/readyz?x=1#y", "/readyz"),
        ("/%68ealthz", "/healthz"),
        ("http://host:9095/healthz?x", "/healthz"),
        ("http://host", "/"),
        ("*", ""),
        ("host:9095", ""),
    ],
)
def test_request_targets(target: str, path: str) -> None:
    assert parse_request_head(f"GET {target} HTTP/1.1\r\nHost: h\r\n\r\n".encode()) == Request("GET", path)


async def test_debug_state_is_served_as_json_only_when_enabled(server: ProbeServer, readiness: Readiness) -> None:
    """`/debug/state` (SIE_SIDECAR_DEBUG_ENDPOINT on) is a 404 until the app hands the server a
    state provider; then a JSON snapshot taken per request, with the readiness first."""
    get = b"GET /debug/state HTTP/1.1\r\nHost: x\r\n\r\n"
    assert await exchange(server.port, get) == response("404 Not Found", "not found")
    calls: list[int] = []

    def state() -> dict[str, object]:
        calls.append(1)
        return {"models": {"org/m": {"queue_depth": len(calls)}}}

    server.debug_state = state
    got = await exchange(server.port, get)
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Type: application/json" in head
    assert json.loads(body) == {
        "ready": False,
        "not_ready_reason": "handshake pending",
        "pulling": False,
        "not_pulling_reason": "handshake pending",
        "backend_draining": False,
        "models": {"org/m": {"queue_depth": 1}},
    }
    assert json.loads((await exchange(server.port, get)).partition(b"\r\n\r\n")[2])["models"]["org/m"] == {
        "queue_depth": 2
    }


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),  # all of 127.0.0.0/8
        ("::1", True),
        ("::1%lo", True),  # a scope id is no part of the address
        ("::ffff:127.0.0.1", True),  # a dual-stack socket's view of an IPv4 loopback peer
        ("::ffff:10.0.0.1", False),
        ("10.0.0.1", False),
        ("192.0.2.2", False),
        ("0.0.0.0", False),
        ("fe80::1%eth0", False),
        ("localhost", False),  # a name, not an address: peers are addresses
        ("", False),
        (None, False),
    ],
)
def test_the_loopback_peer_test(host: object, loopback: bool) -> None:
    assert probes.is_loopback_peer(host) is loopback


@pytest.fixture
async def open_server(readiness: Readiness) -> AsyncIterator[ProbeServer]:
    """A probe server on every interface, as the sidecar runs it."""
    started = await start_probes(readiness, 0, host="0.0.0.0")
    assert started is not None
    try:
        yield started
    finally:
        await started.cleanup()


async def test_debug_state_answers_loopback_peers_only_unless_opened(open_server: ProbeServer) -> None:
    """On by default for loopback peers: a peer on the machine's own non-loopback address (a real
    connection from that address) gets a 403 naming the setting, while the kubelet's probes are
    answered to anyone; `loopback_only=False` (`SIE_SIDECAR_DEBUG_ENDPOINT=all`) serves it too."""
    source = non_loopback_address()
    if source is None:
        pytest.skip("this machine has no non-loopback address (the peer test is checked above)")
    open_server.serve_debug(lambda: {"worker_id": "w-1"}, Registry())
    status, body = await http_get_from("127.0.0.1", open_server.port, "/debug/state")
    assert status == 200 and json.loads(body)["worker_id"] == "w-1"
    assert json.loads(body)["version"] == sie_sidecar.__version__
    status, body = await http_get_from(source, open_server.port, "/debug/state")
    assert (status, body.decode()) == (403, probes.LOOPBACK_ONLY)
    assert "SIE_SIDECAR_DEBUG_ENDPOINT=all" in body.decode() and "\n" not in body.decode()
    assert await http_get_from(source, open_server.port, "/healthz") == (200, b"ok")
    open_server.serve_debug(lambda: {"worker_id": "w-1"}, Registry(), loopback_only=False)
    status, body = await http_get_from(source, open_server.port, "/debug/state")
    assert status == 200 and json.loads(body)["worker_id"] == "w-1"
