# SPDX-License-Identifier: Apache-2.0
"""KEDA's `nats-jetstream` trigger against NATS accounts, on a real nats-server running the shipped
deploy/nats/accounts.conf: the sidecar logs in as the example's worker user, and JetStream's
monitoring endpoint, asked the way KEDA asks it (`/jsz?acc=<account>&consumers=true`) for the
trigger's account, reports the lane's consumer with its lag. With the default `$G` account the
consumer is not there to be found, which is why the trigger names the account."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import msgpack
import pytest

from sie_sidecar import wire
from sie_sidecar.tools.localhost import free_port

from ..deploy.manifests import container, one
from .conftest import NatsServerFactory
from .stack import BUNDLE, MODEL, POOL, PROFILE, running_stack, work_item

pytestmark = pytest.mark.timeout(60)
ACCOUNTS = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "accounts.conf"
PASSWORD = "test-secret"


def _jsz(monitor_port: int, account: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{monitor_port}/jsz?acc={account}&consumers=true&config=true"
    with urllib.request.urlopen(url, timeout=5) as response:
        return dict(json.loads(response.read()))


def _sidecar_connections(monitor_port: int) -> int:
    """Client connections the sidecar holds (it names them `sie-sidecar <worker id>`)."""
    url = f"http://127.0.0.1:{monitor_port}/connz?limit=1024"
    with urllib.request.urlopen(url, timeout=5) as response:
        connz = json.loads(response.read())
    return sum(1 for c in connz.get("connections") or [] if str(c.get("name", "")).startswith("sie-sidecar "))


def _lag(jsz: dict[str, Any], account: str, stream: str, consumer: str) -> int | None:
    """num_pending of `consumer`, as KEDA's scaler finds it, or None when it is not reported."""
    for details in jsz.get("account_details") or []:
        if details.get("name") != account:
            continue
        for s in details.get("stream_detail") or []:
            if s.get("name") == stream:
                for c in s.get("consumer_detail") or []:
                    if c.get("name") == consumer:
                        return int(c["num_pending"])
    return None


async def test_the_trigger_account_reports_the_lanes_lag(
    nats_server_factory: NatsServerFactory, tmp_path: Path
) -> None:
    worker_user = {e["name"]: e.get("value") for e in container("worker-sidecar")["env"]}["SIE_NATS_USER"]
    trigger = one("ScaledObject")["spec"]["triggers"][0]["metadata"]
    account = trigger["account"]
    shipped = ACCOUNTS.read_text()
    assert re.search(rf"\buser:\s*{re.escape(worker_user)}\b", shipped), "the example's worker user is in the file"
    (tmp_path / "accounts.conf").write_text(shipped.replace("REPLACE-ME", PASSWORD))
    (tmp_path / "nats.conf").write_text("include accounts.conf\n")
    monitor = free_port()
    server = await nats_server_factory(args=["-c", str(tmp_path / "nats.conf"), "-m", str(monitor)])
    login = {"user": worker_user, "password": PASSWORD}
    env = {"SIE_NATS_USER": worker_user, "SIE_NATS_PASSWORD": PASSWORD}
    stream, consumer = wire.pool_stream_name(POOL), wire.pool_durable_name(POOL, PROFILE, BUNDLE)
    async with running_stack(server, tmp_path, env=env, gateway_options=login) as stack:
        served = await stack.publish(work_item(text="served"))
        await stack.wait_for(lambda: len(stack.results_for(served)) == 1)
        await stack.settled_pool()
        assert _lag(await asyncio.to_thread(_jsz, monitor, account), account, stream, consumer) == 0
        assert await asyncio.to_thread(_sidecar_connections, monitor) >= 1
        stack.stop.set()
        await stack.task  # the sidecar is gone; its durable stays and the backlog grows
        # ...once the server has seen its connection close: until then the server may still hand
        # the first message to the sidecar's last pull request (then ack-pending, not pending).
        deadline = asyncio.get_running_loop().time() + 10.0
        while await asyncio.to_thread(_sidecar_connections, monitor):
            assert asyncio.get_running_loop().time() < deadline, "the server still lists the sidecar's connection"
            await asyncio.sleep(0.05)
        subject = wire.pool_work_subject(POOL, PROFILE, BUNDLE, MODEL)
        for i in range(7):
            await stack.js.publish(subject, msgpack.packb(work_item(text=f"backlog {i}"), use_bin_type=True))
        # The monitor's consumer counts follow the stream a moment later (the server updates a
        # consumer's pending count after the store): read until they settle, as KEDA polls.
        lags: list[int | None] = []
        deadline = asyncio.get_running_loop().time() + 10.0
        while not lags or (lags[-1] != 7 and asyncio.get_running_loop().time() < deadline):
            if lags:
                await asyncio.sleep(0.05)
            lags.append(_lag(await asyncio.to_thread(_jsz, monitor, account), account, stream, consumer))
        assert lags[-1] == 7, lags
        assert _lag(await asyncio.to_thread(_jsz, monitor, "$G"), "$G", stream, consumer) is None
