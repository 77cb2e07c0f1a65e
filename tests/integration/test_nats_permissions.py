# SPDX-License-Identifier: Apache-2.0
"""The sidecar under exactly the documented worker permissions (sidecar-behaviour §2.6) on a real
nats-server with a gateway user and a worker user: it starts, serves pool and worker-direct work and
its health, and the server logs no permissions violation. The worker user cannot read the gateways'
`_INBOX.>` nor publish work, which is what the `_INBOX_WORKER` prefix makes possible."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.errors import Error as NatsError

from sie_sidecar import wire
from sie_sidecar.bus.permissions import WORKER_PUBLISH, WORKER_SUBSCRIBE, authorization_block

from .conftest import NatsServerFactory
from .stack import BUNDLE, POOL, PROFILE, WORKER, running_stack, work_item

GATEWAY = {"user": "gateway", "password": "gw-secret"}
WORKER_USER, WORKER_PASSWORD = "worker", "wk-secret"


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "nats.conf"
    path.write_text(
        "authorization {\n  users = [\n"
        f'    {{user: "{GATEWAY["user"]}", password: "{GATEWAY["password"]}"}}\n'
        f"    {authorization_block(WORKER_USER, WORKER_PASSWORD)}\n"
        "  ]\n}\n"
    )
    return path


async def test_the_sidecar_serves_under_exactly_the_documented_permissions(
    nats_server_factory: NatsServerFactory, tmp_path: Path
) -> None:
    server = await nats_server_factory(args=["-c", str(_config(tmp_path))])
    env = {
        "SIE_NATS_USER": WORKER_USER,
        "SIE_NATS_PASSWORD": WORKER_PASSWORD,
        "SIE_HEALTH_PUBLISH_INTERVAL_MS": "200",
        "SIE_NATS_ACK_CONFIRM_S": "2",
    }
    beats: list[dict[str, Any]] = []
    async with running_stack(server, tmp_path, env=env, gateway_options=GATEWAY) as stack:

        async def on_beat(msg: Any) -> None:
            beats.append(json.loads(msg.data))

        await stack.nc.subscribe(f"sie.health.{WORKER}", cb=on_beat)
        pooled = [await stack.publish(work_item(text=f"p{i}")) for i in range(20)]
        direct_subject = wire.worker_direct_subject(POOL, PROFILE, BUNDLE, "org/model-a", WORKER)
        direct = await stack.publish(work_item(text="direct"), subject=direct_subject)
        await stack.cancel(f"work_cancel.gw.{'nobody'}")  # a cancel reaches the worker too
        await stack.wait_for(lambda: all(len(stack.results_for(w)) == 1 for w in [*pooled, direct]))
        await stack.settled_pool()
        await stack.wait_for(lambda: any(b["ready"] for b in beats), timeout=5)
    log = server.log_path.read_text(errors="replace")
    assert "Permissions Violation" not in log, [line for line in log.splitlines() if "Violation" in line]


@pytest.mark.parametrize(
    ("action", "subject"),
    [("subscribe", "_INBOX.>"), ("publish", "sie.work.default.cpu.default.x"), ("publish", "work_cancel.gw.r")],
)
async def test_the_worker_user_cannot_read_gateway_inboxes_or_publish_work(
    nats_server_factory: NatsServerFactory, tmp_path: Path, action: str, subject: str
) -> None:
    server = await nats_server_factory(args=["-c", str(_config(tmp_path))])
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await nats.connect(server.url, user=WORKER_USER, password=WORKER_PASSWORD, error_cb=on_error)
    try:
        if action == "subscribe":
            await nc.subscribe(subject)
        else:
            await nc.publish(subject, b"x")
        await nc.flush()
        for _ in range(50):
            if errors:
                break
            await asyncio.sleep(0.02)
    finally:
        await nc.close()
    assert any(isinstance(e, NatsError) and "permissions violation" in str(e).lower() for e in errors), errors


def test_the_lists_are_what_section_2_6_names() -> None:
    assert WORKER_SUBSCRIBE[0] == "_INBOX_WORKER.>" and "_INBOX.>" not in WORKER_SUBSCRIBE
    assert "_INBOX.>" in WORKER_PUBLISH and not any(s.startswith(("sie.work", "sie.config")) for s in WORKER_PUBLISH)
    assert not any("DELETE" in s and "STREAM" in s for s in WORKER_PUBLISH)
    assert not any("PURGE" in s for s in WORKER_PUBLISH)


def test_deploying_md_prints_exactly_these_permissions() -> None:
    """The operator copies docs/deploying.md's block: it must be the one this test runs under."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "deploying.md").read_text()
    block = authorization_block("worker", "PASSWORD")
    for line in block.splitlines()[1:-1]:  # the subscribe and publish lines, verbatim
        assert line in doc, line
