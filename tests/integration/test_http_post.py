# SPDX-License-Identifier: Apache-2.0
"""The OTLP/HTTP client (`otel/http_post.py`) against real servers on loopback: an aiohttp server
for the normal exchange (keep-alive, TLS), raw asyncio servers for the shapes aiohttp would not send
(no Content-Length, chunked, 1xx, a close while idle, garbage)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from sie_sidecar.otel.http_post import HttpPost, HttpPostError
from sie_sidecar.tools.localhost import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server running `handler` per connection; yields its URL and a one-element connection count."""
    connections = [0]

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(counted, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/metrics", connections
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[str, bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    length = next(
        int(line.split(":", 1)[1]) for line in head.split("\r\n") if line.lower().startswith("content-length")
    )
    return head, await reader.readexactly(length)


@contextlib.asynccontextmanager
async def aiohttp_server(ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[tuple[int, list[bytes]]]:
    bodies: list[bytes] = []

    async def handle(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        assert request.headers["Content-Type"] == "application/x-protobuf"
        return web.Response(status=200, body=b"ok", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/metrics", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context).start()
    try:
        yield port, bodies
    finally:
        await runner.cleanup()


HEADERS = {"Content-Type": "application/x-protobuf"}


async def test_posts_keep_one_connection_alive() -> None:
    connections = 0

    async with aiohttp_server() as (port, bodies):
        client = HttpPost(f"http://127.0.0.1:{port}/v1/metrics")
        original = asyncio.open_connection

        async def counting(*args: object, **kwargs: object) -> object:
            nonlocal connections
            connections += 1
            return await original(*args, **kwargs)  # type: ignore[arg-type]

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(asyncio, "open_connection", counting)
            for n in range(5):
                assert await client.post(b"body-%d" % n, HEADERS, 5.0) == (200, b"ok")
        await client.close()
    assert bodies == [b"body-%d" % n for n in range(5)]
    assert connections == 1


async def test_a_connection_closed_while_idle_is_retried_once_on_a_new_one() -> None:
    async def one_request_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, body = await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()  # no Connection: close: the client keeps it, and finds it closed next time

    async with raw_server(one_request_then_close) as (url, connections):
        client = HttpPost(url)
        assert await client.post(b"first", HEADERS, 5.0) == (200, b"first")
        await asyncio.sleep(0.05)
        assert await client.post(b"second", HEADERS, 5.0) == (200, b"second")
        await client.close()
    assert connections[0] == 2


async def test_connection_close_body_until_eof_chunked_and_interim_responses() -> None:
    replies = [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nab",
        b"HTTP/1.0 200 OK\r\n\r\nuntil-eof",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\nX-Trailer: t\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\n\r\n",
    ]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while replies:
            await read_request(reader)
            reply = replies.pop(0)
            writer.write(reply)
            await writer.drain()
            if b"Connection: close" in reply or b"HTTP/1.0" in reply:
                return

    async with raw_server(serve) as (url, connections):
        client = HttpPost(url)
        assert await client.post(b"1", HEADERS, 5.0) == (200, b"ab")
        assert await client.post(b"2", HEADERS, 5.0) == (200, b"until-eof")
        assert await client.post(b"3", HEADERS, 5.0) == (202, b"abcdefg")
        assert await client.post(b"4", HEADERS, 5.0) == (204, b"")
        await client.close()
    assert connections[0] == 3  # the first two answers closed their connections; the last two shared one


async def test_the_request_carries_host_path_query_length_and_headers() -> None:
    heads: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, body = await read_request(reader)
        heads.append(head)
        assert body == b"\x00\x01"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    async with raw_server(serve) as (url, _):
        client = HttpPost(url + "?a=1")
        assert await client.post(b"\x00\x01", HEADERS, 5.0) == (200, b"")
        await client.close()
    port = url.split(":")[2].split("/")[0]
    lines = heads[0].split("\r\n")
    assert lines[0] == "POST /v1/metrics?a=1 HTTP/1.1"
    assert f"Host: 127.0.0.1:{port}" in lines and "Content-Length: 2" in lines
    assert "Content-Type: application/x-protobuf" in lines


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"SMTP ready\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "mid-response"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", "response head over"),
        (b"", "closed before a response"),
    ],
)
async def test_malformed_responses_are_typed_errors(reply: bytes, message: str) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply)
        await writer.drain()

    async with raw_server(serve) as (url, _):
        client = HttpPost(url)
        with pytest.raises(HttpPostError, match=message):
            await client.post(b"x", HEADERS, 5.0)
        await client.close()


async def test_a_silent_server_times_out_and_the_next_post_uses_a_new_connection() -> None:
    calls = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        calls[0] += 1
        if calls[0] == 1:
            await asyncio.sleep(10)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    async with raw_server(serve) as (url, connections):
        client = HttpPost(url)
        with pytest.raises(TimeoutError):
            await client.post(b"x", HEADERS, 0.2)
        assert await client.post(b"y", HEADERS, 5.0) == (200, b"")
        await client.close()
    assert connections[0] == 2


def test_only_http_urls_are_accepted() -> None:
    for url in ("ftp://h/x", "http:///nohost", "localhost:4318"):
        with pytest.raises(ValueError, match="not an http"):
            HttpPost(url)


async def test_https_verifies_the_server_against_the_system_roots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    async with aiohttp_server(server_context) as (port, bodies):
        untrusted = HttpPost(f"https://127.0.0.1:{port}/v1/metrics")
        with pytest.raises(ssl.SSLCertVerificationError):
            await untrusted.post(b"x", HEADERS, 5.0)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # OpenSSL's default verify paths read it per context
        trusted = HttpPost(f"https://127.0.0.1:{port}/v1/metrics")
        assert await trusted.post(b"secret", HEADERS, 5.0) == (200, b"ok")
        await trusted.close()
    assert bodies == [b"secret"]
