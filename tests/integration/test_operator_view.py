# SPDX-License-Identifier: Apache-2.0
"""The operator's view (issue 32) against a real nats-server and the real probe server on a real
port: `/debug/state` is on by default for loopback peers only (`SIE_SIDECAR_DEBUG_ENDPOINT`:
`loopback`, `all`, `off`), carries the version, the NATS server and its reconnects, and the consumer
lag as JetStream reports it, fetched only while someone reads; and the start-up line carries the
version and the settings with no secret."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from nats.aio.client import Client

import sie_sidecar
from sie_sidecar import wire
from sie_sidecar.bus.lag import ConsumerLag, Watched
from sie_sidecar.bus.topology import TopologySpec, ensure_topology
from sie_sidecar.config import Settings

from ..peers import http_get_from, non_loopback_address
from .conftest import NatsServer, NatsServerFactory
from .stack import BUNDLE, POOL, PROFILE, WORKER, running_stack, work_item
from .test_startup import sidecar, sidecar_env

pytestmark = pytest.mark.timeout(120)

FILE_STORAGE = {"SIE_STREAM_STORAGE": "file"}  # the streams outlive a nats-server restart


async def state_of(port: int) -> dict[str, Any]:
    """`GET /debug/state` from 127.0.0.1, as `sie-sidecar top` in the pod reads it."""
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/debug/state") as r:
        assert r.status == 200, await r.text()
        doc = await r.json()
    assert isinstance(doc, dict)
    return doc


# ------------------------------------------------------------------------------------------ who reads


@pytest.mark.parametrize(
    ("setting", "loopback", "other"),
    [(None, 200, 403), ("loopback", 200, 403), ("1", 200, 403), ("all", 200, 200), ("off", 404, 404)],
)
async def test_who_the_state_answers(
    setting: str | None, loopback: int, other: int, nats_server: NatsServer, tmp_path: Path
) -> None:
    """By default (and with `loopback` or an on word) a loopback peer is answered and a peer on the
    machine's own non-loopback address gets 403 naming the setting; `all` answers both; `off` neither
    (404). The kubelet's probes are answered to anyone, whatever the setting."""
    env = {} if setting is None else {"SIE_SIDECAR_DEBUG_ENDPOINT": setting}
    async with running_stack(nats_server, tmp_path, env=env) as stack:
        port = stack.settings.worker_probe_port
        status, body = await http_get_from("127.0.0.1", port, "/debug/state")
        assert status == loopback
        if status == 200:
            assert json.loads(body)["version"] == sie_sidecar.__version__
        source = non_loopback_address()
        if source is None:
            pytest.skip("no non-loopback address here: the peer test is checked in tests/unit/test_probes.py")
        status, body = await http_get_from(source, port, "/debug/state")
        assert status == other
        if other == 403:
            assert body.decode() == (
                "forbidden: /debug/state answers loopback peers only (SIE_SIDECAR_DEBUG_ENDPOINT=all: any peer)"
            )
        assert (await http_get_from(source, port, "/healthz")) == (200, b"ok")


# ----------------------------------------------------------------------------------------------- lag


async def test_the_lag_appears_after_a_read_and_matches_jetstream(nats_server: NatsServer, tmp_path: Path) -> None:
    """No backend: the sidecar never pulls, so 25 published items stay pending. The first read does
    not wait for JetStream (nulls, a refresh started); a later one shows what CONSUMER.INFO says. A
    value is not refreshed while nobody reads: after a quiet spell the next read serves it with an
    age at least that long and starts a refresh."""
    async with running_stack(nats_server, tmp_path, external_backend=str(tmp_path / "none.sock")) as stack:
        ids = [await stack.publish(work_item(text=f"t{i}")) for i in range(25)]
        port = stack.settings.worker_probe_port
        first = (await state_of(port))["lag"]
        assert first["refreshing"] is True
        assert first["consumers"]["pool"]["num_pending"] is None and first["consumers"]["pool"]["age_s"] is None
        lag = first
        while lag["consumers"]["pool"]["num_pending"] is None:
            await asyncio.sleep(0.05)
            lag = (await state_of(port))["lag"]
        pool, worker = lag["consumers"]["pool"], lag["consumers"]["worker"]
        info = await stack.pool_consumer()
        assert pool["num_pending"] == info.num_pending == len(ids)
        assert pool["num_ack_pending"] == info.num_ack_pending == 0  # nothing was pulled
        assert pool["consumer"] == info.name and pool["error"] is None
        direct = await stack.js.consumer_info(wire.worker_stream_name(WORKER), wire.worker_consumer_name(WORKER))
        assert worker["num_pending"] == direct.num_pending == 0
        await asyncio.sleep(2.5)  # nobody reads
        quiet = (await state_of(port))["lag"]
        assert quiet["consumers"]["pool"]["age_s"] >= 2.5 and quiet["refreshing"] is True
        doc = await state_of(port)
        assert doc["ready"] is False and doc["not_ready_reason"]
        assert stack.replies == []


async def test_consumer_lag_refreshes_once_per_max_age_and_reports_errors(nc: Client) -> None:
    """Against a real JetStream: reads within `max_age_s` start no second refresh; a consumer that
    does not exist shows its error and no value; after `close` no refresh starts."""
    settings = Settings(pool=POOL, bundle=BUNDLE, machine_profile=PROFILE, worker_id=WORKER)
    spec = TopologySpec.from_settings(settings)
    js = nc.jetstream()
    await ensure_topology(js, spec)
    now = [100.0]
    lag = ConsumerLag(
        js,
        [Watched("pool", spec.pool_stream, spec.pool_durable), Watched("gone", spec.pool_stream, "no-such")],
        max_age_s=2.0,
        clock=lambda: now[0],
    )
    try:
        lag.read()
        while lag.read()["refreshing"]:
            await asyncio.sleep(0.01)
        read = lag.read()
        assert lag.refreshes == 1
        assert read["consumers"]["pool"]["num_pending"] == 0 and read["consumers"]["pool"]["age_s"] == 0
        assert (
            read["consumers"]["gone"]["num_pending"] is None
            and "consumer not found" in read["consumers"]["gone"]["error"]
        )
        now[0] += 1.9
        assert lag.read()["consumers"]["pool"]["age_s"] == pytest.approx(1.9) and lag.refreshes == 1
        now[0] += 0.1
        assert lag.read()["refreshing"] is True and lag.refreshes == 2
    finally:
        await lag.close()
    now[0] += 10
    assert lag.read()["refreshing"] is False and lag.refreshes == 2


# ------------------------------------------------------------------------------------------------ NATS


async def test_reconnects_are_counted_after_a_nats_server_restart(nats_server: NatsServer, tmp_path: Path) -> None:
    async with running_stack(nats_server, tmp_path, env=FILE_STORAGE) as stack:
        port = stack.settings.worker_probe_port
        before = (await state_of(port))["nats"]
        assert before == {
            "server": nats_server.url,
            "connected": True,
            "disconnected_s": None,
            "reconnects": 0,
            "failures": 0,
            "last_error": None,
        }
        await nats_server.restart()
        await stack.wait_for(lambda: stack.nc.is_connected, timeout=20)
        nats = (await state_of(port))["nats"]
        for _ in range(400):
            if nats["reconnects"] == 1 and nats["connected"]:
                break
            await asyncio.sleep(0.05)
            nats = (await state_of(port))["nats"]
        assert (nats["reconnects"], nats["connected"], nats["server"]) == (1, True, nats_server.url)
        wid = await stack.publish(work_item())  # and it serves on the new connection
        await stack.wait_for(lambda: len(stack.results_for(wid)) == 1, timeout=20)


# ------------------------------------------------------------------------------------ the start-up line


async def test_the_start_up_line_carries_the_version_and_no_secret(
    nats_server_factory: NatsServerFactory, tmp_path: Path
) -> None:
    secrets = {
        "SIE_NATS_PASSWORD": "pw-0xC0FFEE-startup",
        "SIE_GATEWAY_API_KEY": "gk-0xFEED-startup",
        "SIE_CONFIG_SERVICE_TOKEN": "cs-0xBEEF-startup",
    }
    server = await nats_server_factory(args=["--user", "worker", "--pass", secrets["SIE_NATS_PASSWORD"]])
    env = sidecar_env(tmp_path, server.url, SIE_NATS_USER="worker", **secrets)
    async with sidecar(env) as process:
        await process.wait_for("NATS connected")
        starting = [r for r in process.records if r["msg"] == "starting"]
    assert len(starting) == 1
    (line,) = starting
    assert line["level"] == "info" and line["version"] == sie_sidecar.__version__
    settings = line["settings"]
    assert settings["nats_url"] == server.url and settings["debug_endpoint_peers"] == "loopback"
    assert settings["nats_password"] == settings["gateway_api_key"] == settings["config_service_token"] == "<redacted>"
    assert not any(secret in raw for raw in process.raw for secret in secrets.values())
