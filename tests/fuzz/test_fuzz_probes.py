# SPDX-License-Identifier: Apache-2.0
"""Fuzz the probe server's request parser and request path: any bytes in, a Request or a BadRequest
out (never an exception), and the live server answers with one whole response or closes, then still
serves `/healthz`.

Bounded by the hypothesis profile (200 examples by default; `HYPOTHESIS_PROFILE=fuzz` for long runs).
"""

from __future__ import annotations

import asyncio
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sie_sidecar import probes
from sie_sidecar.pipeline.readiness import Readiness
from sie_sidecar.probes import BadRequest, Request, parse_request_head

from .strategies import mutated

pytestmark = pytest.mark.fuzz

TOKEN = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
VALID = b"GET /readyz?x=1 HTTP/1.1\r\nHost: localhost:9095\r\nUser-Agent: kube-probe/1.30\r\nAccept: */*\r\n\r\n"

tokens = st.text(st.sampled_from(TOKEN), min_size=1, max_size=12)
paths = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40).map(lambda p: "/" + p)
header_lines = st.lists(
    st.tuples(tokens, st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30)), max_size=6
)
PIECES = [b"GET", b"HEAD", b"POST", b" ", b"/healthz", b"/readyz", b"?", b"%", b"HTTP/1.1", b"HTTP/1.0"]
PIECES += [b"\r\n", b":", b"Host", b"\x00", b"\xff", b"\n", b"\r", b"\t", b"http://", b"*"]
pieces = st.lists(st.sampled_from(PIECES), max_size=30).map(b"".join)
heads = st.one_of(
    st.binary(max_size=300),
    pieces.map(lambda b: b + b"\r\n\r\n"),
    mutated(VALID),
    st.binary(max_size=200).map(lambda b: b"GET /healthz HTTP/1.1\r\n" + b + b"\r\n\r\n"),
)


@given(head=heads)
def test_fuzz_the_parser_returns_a_request_or_a_bad_request(head: bytes) -> None:
    parsed = parse_request_head(head)
    if isinstance(parsed, BadRequest):
        assert parsed.reason and probes.render_response(400, f"bad request: {parsed.reason}")
        return
    assert isinstance(parsed, Request)
    assert parsed.method and set(parsed.method) <= set(TOKEN)
    assert parsed.path == "" or parsed.path.startswith("/")
    status, body, _ = probes.answer(Readiness(), parsed)
    assert status in (200, 404, 503)
    assert probes.render_response(status, body).startswith(f"HTTP/1.1 {status} ".encode())


@given(method=tokens, path=paths, headers=header_lines)
def test_fuzz_well_formed_requests_parse_to_their_method_and_path(
    method: str, path: str, headers: list[tuple[str, str]]
) -> None:
    lines = [f"{method} {path} HTTP/1.1", *(f"{name}: {value}" for name, value in headers), "", ""]
    parsed = parse_request_head("\r\n".join(lines).encode())
    expected = unquote(path.partition("?")[0].partition("#")[0], errors="replace")
    assert parsed == Request(method, expected)


async def _exchange(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        writer.write_eof()
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        return b""  # closed with our bytes unread: the kernel resets
    finally:
        writer.close()


async def _serve_then_check(data: bytes) -> tuple[bytes, bytes]:
    server = await probes.start_probes(Readiness(), 0, host="127.0.0.1")
    assert server is not None
    try:
        got = await _exchange(server.port, data)
        after = await _exchange(server.port, b"GET /healthz HTTP/1.1\r\n\r\n")
    finally:
        await server.cleanup()
    return got, after


@settings(max_examples=100)
@given(data=st.one_of(heads, st.binary(max_size=2 * probes.MAX_HEAD_BYTES)))
def test_fuzz_the_live_server_answers_once_or_closes_and_keeps_serving(data: bytes) -> None:
    got, after = asyncio.run(_serve_then_check(data))
    if got:
        head, sep, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 ") and sep
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        assert len(body) in (0, length)  # HEAD has none
    assert after.startswith(b"HTTP/1.1 200 OK\r\n") and after.endswith(b"\r\n\r\nok")
