# SPDX-License-Identifier: Apache-2.0
"""The `/v1/pools` poller against a real aiohttp gateway on loopback: every way a poll fails becomes a
short detail (no URL, no bearer), and each answer is recorded into the admission state."""

from __future__ import annotations

import aiohttp
import pytest

from sie_sidecar.control.gateway import MAX_BODY_BYTES, fetch_pools, poll_once, pools_url
from sie_sidecar.errors import PoolsPollError
from sie_sidecar.pipeline.admission import Admission

from .gateway import running_gateway

WORKER = "w-1"


@pytest.mark.parametrize(
    ("status", "body", "detail"),
    [
        (503, {"pools": []}, "HTTP 503"),
        (302, {"pools": []}, "HTTP 302"),  # redirects are not followed
        (200, b"{not json", "json: "),
        (200, b"\xff\xfe", "json: "),
        (200, b" " * (MAX_BODY_BYTES + 1), f"body over {MAX_BODY_BYTES} bytes"),
    ],
)
async def test_each_failure_has_a_short_detail(status: int, body: object, detail: str) -> None:
    async with running_gateway() as gateway, aiohttp.ClientSession() as session:
        gateway.status, gateway.body = status, body
        with pytest.raises(PoolsPollError) as info:
            await fetch_pools(session, pools_url(gateway.url), "secret-key")
    assert info.value.detail.startswith(detail)
    assert "secret-key" not in info.value.detail and "127.0.0.1" not in info.value.detail


async def test_a_chunked_body_is_bounded_while_it_is_read() -> None:
    async with running_gateway() as gateway, aiohttp.ClientSession() as session:
        gateway.chunked = True
        gateway.body = b'{"pools": []}'
        assert await fetch_pools(session, pools_url(gateway.url), None) == {"pools": []}
        gateway.body = b" " * (MAX_BODY_BYTES + 1)
        with pytest.raises(PoolsPollError, match=f"^body over {MAX_BODY_BYTES} bytes$"):
            await fetch_pools(session, pools_url(gateway.url), None)


async def test_a_slow_gateway_times_out_and_a_missing_one_is_a_transport_error() -> None:
    async with running_gateway() as gateway, aiohttp.ClientSession() as session:
        gateway.delay_s = 1.0
        with pytest.raises(PoolsPollError, match=r"^transport: TimeoutError"):
            await fetch_pools(session, pools_url(gateway.url), None, timeout_s=0.2)
        url = pools_url(gateway.url)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(PoolsPollError, match=r"^transport: Client"):
            await fetch_pools(session, url, None)


async def test_a_poll_records_the_decision_and_a_wrong_shape_as_an_error() -> None:
    admission = Admission("gpu-a", stale_after_s=0.0)
    async with running_gateway() as gateway, aiohttp.ClientSession() as session:
        url = pools_url(gateway.url)
        gateway.assign("gpu-a", [WORKER], caps={"l4": "2"})
        await poll_once(session, admission, url=url, api_key="k", worker=WORKER, machine_profile="L4")
        assert (admission.decision.admitted, admission.decision.reason) == (True, "assigned")
        assert gateway.requests[-1][1] == "Bearer k"
        gateway.body = {"pools": "nope"}
        await poll_once(session, admission, url=url, api_key=None, worker=WORKER, machine_profile="L4")
        assert admission.decision.reason.startswith("status_error:shape: ")
        assert gateway.requests[-1][1] is None  # no key, no Authorization header
