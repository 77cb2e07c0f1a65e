# SPDX-License-Identifier: Apache-2.0
"""The light requests session the SDK's OTLP/HTTP exporters post through (`otel.http_session`),
against a real HTTP server on loopback: requests' interface and exceptions, one kept-alive
connection, and requests' own session wherever the environment's proxy or `.netrc` applies."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from benches.raw_http import OK, RawHttpServer

from sie_sidecar.otel.http_session import LightSession, default_ca_bundle, light_session


@contextmanager
def raw_server(answer: Callable[[bytes], bytes | None]) -> Iterator[RawHttpServer]:
    server = RawHttpServer(answer)
    try:
        yield server
    finally:
        server.close()


def post(session: requests.Session, url: str, headers: dict[str, str] | None = None) -> requests.Response:
    """As the SDK's transport calls it."""
    return session.request(
        method="POST",
        url=url,
        headers={"Content-Type": "application/x-protobuf", **(headers or {})},
        data=b"abc",
        timeout=5.0,
        allow_redirects=False,
    )


def test_posts_go_over_one_kept_alive_connection_with_one_header_of_each_name() -> None:
    with raw_server(lambda _: OK) as server:
        session = LightSession()
        for _ in range(3):
            response = post(
                session, f"http://127.0.0.1:{server.port}/v1/metrics", {"user-agent": "OTel-OTLP-Exporter-Python"}
            )
            assert (response.status_code, response.reason, response.content) == (200, "OK", b"ok")
            assert response.headers["content-type"] == "application/x-protobuf"
        session.close()
    assert server.connections == 1 and len(server.requests) == 3
    head = server.requests[0].lower()
    assert head.count(b"user-agent:") == 1 and b"user-agent: otel-otlp-exporter-python" in head
    assert server.requests[0].startswith(b"POST /v1/metrics HTTP/1.1") and server.requests[0].endswith(b"abc")


def test_a_response_that_closes_the_connection_is_followed_by_a_new_one() -> None:
    closing = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 2\r\nContent-Length: 0\r\n\r\n"
    with raw_server(lambda _: closing) as server:
        session = LightSession()
        first = post(session, f"http://127.0.0.1:{server.port}/v1/traces")
        second = post(session, f"http://127.0.0.1:{server.port}/v1/traces")
    assert (first.status_code, first.headers["retry-after"], second.status_code) == (503, "2", 503)
    assert server.connections == 2


def test_failures_are_requests_exceptions_the_sdk_retries_on() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # nothing listens once it is closed
    with pytest.raises(requests.exceptions.ConnectionError):
        post(LightSession(), f"http://127.0.0.1:{port}/v1/metrics")
    # A server that reads the request and closes without an answer.
    with raw_server(lambda _: None) as server, pytest.raises(requests.exceptions.ConnectionError):
        post(LightSession(), f"http://127.0.0.1:{server.port}/v1/metrics")
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the backlog), never answers
    try:
        session = LightSession()
        with pytest.raises(requests.exceptions.ReadTimeout):
            session.request(
                method="POST", url=f"http://127.0.0.1:{silent.getsockname()[1]}/v1/metrics", data=b"x", timeout=0.2
            )
    finally:
        silent.close()


def test_the_environment_s_proxy_or_netrc_leaves_the_endpoint_to_requests(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "absent"))
    assert isinstance(light_session("http://collector:4318/v1/metrics"), LightSession)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    assert light_session("http://collector:4318/v1/metrics") is None
    monkeypatch.setenv("NO_PROXY", "collector")
    assert isinstance(light_session("http://collector:4318/v1/metrics"), LightSession)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine collector login me password secret\n")
    monkeypatch.setenv("NETRC", str(netrc))
    assert light_session("http://collector:4318/v1/metrics") is None


def test_without_a_configured_certificate_requests_bundle_rules_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    assert default_ca_bundle() == requests.utils.DEFAULT_CA_BUNDLE_PATH
    monkeypatch.setenv("CURL_CA_BUNDLE", "/etc/curl.pem")
    assert default_ca_bundle() == "/etc/curl.pem"
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/requests.pem")
    assert default_ca_bundle() == "/etc/requests.pem"
