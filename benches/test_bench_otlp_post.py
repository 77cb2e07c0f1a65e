# SPDX-License-Identifier: Apache-2.0
"""One OTLP/HTTP post of an ~11 KB metrics body (what one export of the sidecar's ~40 points
encodes to), as the SDK's exporter makes it: through requests' own session, and through the light
session the sidecar hands the exporter (`otel.http_session`), side by side, against a kept-alive
HTTP server on loopback. The export threads make one or two posts a second beside the serving loop
(docs/benchmarks.md, "Telemetry on: the export threads")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from pytest_benchmark.fixture import BenchmarkFixture

from benches.raw_http import OK, RawHttpServer
from sie_sidecar.otel.http_session import LightSession

BODY = bytes(range(256)) * 45  # 11,520 bytes


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = RawHttpServer(lambda _: OK)
    yield server.url()
    server.close()


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
