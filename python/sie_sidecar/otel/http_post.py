# SPDX-License-Identifier: Apache-2.0
"""A minimal HTTP/1.1 POST client on asyncio streams, for the OTLP/HTTP pushes.

Why not aiohttp: importing its client costs ~0.13 s of CPU (a third of it the SSL context its
connector builds at import), which the sidecar's start-up otherwise avoids (cli.py, probes.py), and
an OTLP push needs one request shape: a POST of a protobuf body to one endpoint, every few seconds.
This keeps one connection alive between pushes and opens a new one when the last was closed or
failed. `https://` endpoints get TLS with the system roots; the SSL context is built only for them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Final
from urllib.parse import urlsplit

from ..errors import HttpClosedBeforeResponse, HttpPostError

#: Response heads and bodies larger than this are refused (an OTLP response is a few bytes).
MAX_HEAD: Final = 64 * 1024
MAX_BODY: Final = 4 * 1024 * 1024


class HttpPost:
    """POSTs to one `http://` or `https://` URL over a kept-alive connection (one request at a time)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// or https:// URL: {url!r}")
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        default_port = self._port == (443 if self._tls else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = host if default_port else f"{host}:{self._port}"
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._lock = asyncio.Lock()

    async def post(self, body: bytes, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
        """(status, response body) of one POST. A connection that fails or that the server closes
        is dropped; the next call opens a new one. A kept-alive connection the server closed while
        idle (no response byte came back) is retried once on a new connection."""
        async with self._lock:
            try:
                async with asyncio.timeout(timeout_s):
                    reused = self._streams is not None
                    try:
                        return await self._exchange(body, headers)
                    except (HttpClosedBeforeResponse, ConnectionError):
                        if not reused:
                            raise
                        await self.close()
                        return await self._exchange(body, headers)
            except BaseException:
                await self.close()
                raise

    async def _exchange(self, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        reader, writer = self._streams or await self._connect()
        head = [f"POST {self._path} HTTP/1.1", f"Host: {self._host_header}", f"Content-Length: {len(body)}"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        status, response_headers = await _read_head(reader)
        data, closing = await _read_body(reader, status, response_headers)
        if closing:
            await self.close()
        return status, data

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        ssl_context = None
        if self._tls:
            import ssl

            ssl_context = ssl.create_default_context()
        reader, writer = await asyncio.open_connection(self._host, self._port, ssl=ssl_context, limit=MAX_HEAD)
        self._streams = (reader, writer)
        return reader, writer

    async def close(self) -> None:
        streams, self._streams = self._streams, None
        if streams is not None:
            writer = streams[1]
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def _is_decimal(text: str) -> bool:
    """ASCII digits only: `str.isdigit` also accepts the latin-1 superscripts, which `int` refuses."""
    return text.isascii() and text.isdigit()


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """Status code and headers (names lowercased); 1xx interim responses are skipped."""
    while True:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise HttpClosedBeforeResponse("the connection closed before a response") from exc
            raise HttpPostError("the connection closed mid-response") from exc
        except asyncio.LimitOverrunError as exc:
            raise HttpPostError(f"response head over {MAX_HEAD} bytes") from exc
        lines = raw.decode("latin-1").split("\r\n")
        fields = lines[0].split(" ", 2)
        if len(fields) < 2 or not fields[0].startswith("HTTP/1.") or not _is_decimal(fields[1]):
            raise HttpPostError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(fields[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if status >= 200:
            return status, headers


async def _read_body(reader: asyncio.StreamReader, status: int, headers: Mapping[str, str]) -> tuple[bytes, bool]:
    """(body, whether the server ends the connection): by Content-Length, chunked transfer coding,
    or, with neither, up to the close (RFC 9112 §6.3)."""
    closing = headers.get("connection", "").lower() == "close"
    if status in (204, 304):
        return b"", closing
    try:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return await _read_chunked(reader), closing
        length = headers.get("content-length")
        if length is not None:
            if not _is_decimal(length) or int(length) > MAX_BODY:
                raise HttpPostError(f"bad Content-Length {length[:20]!r}")
            return await reader.readexactly(int(length)), closing
        data = await reader.read(MAX_BODY + 1)
        while len(data) <= MAX_BODY and not reader.at_eof():
            data += await reader.read(MAX_BODY + 1 - len(data))
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise HttpPostError("the connection closed or overflowed mid-response") from exc
    if len(data) > MAX_BODY:
        raise HttpPostError(f"response body over {MAX_BODY} bytes")
    return data, True


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size_line = (await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError as exc:
            raise HttpPostError(f"bad chunk size {size_line[:20]!r}") from exc
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the empty line
                pass
            return bytes(body)
        if len(body) + size > MAX_BODY:
            raise HttpPostError(f"response body over {MAX_BODY} bytes")
        body += await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise HttpPostError("chunk not followed by CRLF")


__all__ = ["HttpPost", "HttpPostError"]
