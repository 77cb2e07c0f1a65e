# SPDX-License-Identifier: Apache-2.0
"""One OTLP/HTTP post of an ~11 KB metrics body (what one export of the sidecar's ~40 points
encodes to), as the SDK's exporter makes it: through requests' own session, and through the light
session the sidecar hands the exporter (`otel.http_session`), side by side, against a kept-alive
HTTP server on loopback. The export threads make one or two posts a second beside the serving loop
(docs/benchmarks.md, "Telemetry on: the export threads")."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import requests
from pytest_benchmark.fixture import BenchmarkFixture

from sie_sidecar.otel.http_session import LightSession

BODY = bytes(range(256)) * 45  # 11,520 bytes
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"


def _serve(listener: socket.socket) -> None:
    """Answer every request with 200, on each kept-alive connection (one at a time)."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            buffered = b""
            while True:
                while b"\r\n\r\n" not in buffered:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    buffered += chunk
                if b"\r\n\r\n" not in buffered:
                    break
                head, _, rest = buffered.partition(b"\r\n\r\n")
                length = next(
                    int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
                )
                while len(rest) < length:
                    rest += conn.recv(65536)
                buffered = rest[length:]
                conn.sendall(OK)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_serve, args=(listener,), daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1/metrics"
    listener.close()


@pytest.mark.parametrize("session", ["requests", "light"])
def test_one_otlp_post(benchmark: BenchmarkFixture, url: str, session: str) -> None:
    benchmark.group = "one OTLP/HTTP post of 11.5 KB, kept alive"
    client = requests.Session() if session == "requests" else LightSession()
    headers = {"content-type": "application/x-protobuf", "user-agent": "OTel-OTLP-Exporter-Python"}

    def post() -> int:  # as the SDK's transport calls it
        response = client.request(
            method="POST", url=url, headers=headers, data=BODY, timeout=10.0, allow_redirects=False
        )
        return response.status_code

    assert benchmark(post) == 200
    client.close()
