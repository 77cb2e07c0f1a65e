# SPDX-License-Identifier: Apache-2.0
"""Fuzz the OTLP/HTTP client's response parser (`otel/http_post.py`): whatever bytes an endpoint
sends back, reading them gives a status and a body or an `HttpPostError`, never another exception;
and a well-formed response reads back exactly.

Bounded by the hypothesis profile (200 examples by default; `HYPOTHESIS_PROFILE=fuzz` for long runs).
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sie_sidecar.otel import http_post
from sie_sidecar.otel.http_post import HttpPostError

from .strategies import mutated

pytestmark = pytest.mark.fuzz

VALID = (
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n"
)
PIECES = [b"HTTP/1.1 ", b"HTTP/1.0 ", b"200", b"100", b"204", b" OK", b"\r\n", b"\n", b":", b"0", b"ff"]
PIECES += [b"Content-Length: ", b"Transfer-Encoding: chunked", b"Connection: close", b"\x00", b"\xff", b"-1"]
responses = st.one_of(
    st.binary(max_size=300),
    st.lists(st.sampled_from(PIECES), max_size=40).map(b"".join),
    mutated(VALID),
)


async def _read(data: bytes) -> tuple[int, bytes, bool]:
    reader = asyncio.StreamReader(limit=http_post.MAX_HEAD)
    reader.feed_data(data)
    reader.feed_eof()
    status, headers = await http_post._read_head(reader)
    body, closing = await http_post._read_body(reader, status, headers)
    return status, body, closing


@example(b"HTTP/1.1 2\xb2 OK\r\n\r\n")  # a latin-1 superscript digit: str.isdigit() says yes, int() no
@example(b"HTTP/1.1 200 OK\r\nContent-Length: \xb9\r\n\r\n")
@given(data=responses)
def test_fuzz_any_response_reads_or_is_an_http_post_error(data: bytes) -> None:
    try:
        status, body, _ = asyncio.run(_read(data))
    except HttpPostError:
        return
    assert status >= 200 and len(body) <= http_post.MAX_BODY


@given(
    status=st.integers(200, 599).filter(lambda s: s not in (204, 304)),
    body=st.binary(max_size=2000),
    framing=st.sampled_from(["length", "chunked", "eof"]),
    chunk=st.integers(1, 300),
)
def test_fuzz_well_formed_responses_read_back_exactly(status: int, body: bytes, framing: str, chunk: int) -> None:
    if framing == "length":
        raw = b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)
    elif framing == "chunked":
        parts = [body[i : i + chunk] for i in range(0, len(body), chunk)]
        raw = b"HTTP/1.1 %d X\r\nTransfer-Encoding: chunked\r\n\r\n" % status
        raw += b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    else:
        raw = b"HTTP/1.0 %d X\r\n\r\n%s" % (status, body)
    assert asyncio.run(_read(raw)) == (status, body, framing == "eof")
