# SPDX-License-Identifier: Apache-2.0
"""A whole pipeline in one event loop for integration tests: a real nats-server, the real reference
backend on a real Unix socket, the real sidecar (`runtime.run`), and a gateway-side NATS client."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import nats
from nats.aio.client import Client
from nats.js import JetStreamContext

from sie_sidecar import wire
from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer
from sie_sidecar.config import Settings
from sie_sidecar.runtime import run
from sie_sidecar.tools.localhost import free_port

from .conftest import NatsServer

POOL, PROFILE, BUNDLE, WORKER = "default", "cpu", "default", "w-test"
MODEL = "org/model-a"
ROUTER = "gw"
NAK_DELAY_S = 0.2
MAX_DELIVERIES_ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"
_ids = itertools.count()


def work_item(
    *,
    model: str = MODEL,
    operation: str = "encode",
    text: str = "hello",
    reply_subject: str | None = None,
    request_id: str | None = None,
    item_index: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    """A gateway WorkItem (§7.2 order) with a fresh request id unless one is given."""
    rid = request_id or f"req-{next(_ids)}"
    item: dict[str, Any] = {
        "work_item_id": f"{rid}.{item_index}",
        "request_id": rid,
        "item_index": item_index,
        "total_items": item_index + 1,
        "operation": operation,
        "model_id": model,
        "profile_id": "default",
        "engine": "",
        "pool_name": POOL,
        "machine_profile": PROFILE,
        "item": {"text": text},
        "payload_ref": None,
        "output_types": ["dense"] if operation == "encode" else None,
        "bundle_config_hash": "",
        "router_id": ROUTER,
        "reply_subject": reply_subject if reply_subject is not None else f"_INBOX.{ROUTER}.{rid}",
        "timestamp": time.time(),
        "accepts_result_chunks": True,
    }
    item.update(extra)
    return item


@dataclass
class Stack:
    """The running pipeline plus what the gateway side observed."""

    nats_server: NatsServer
    nc: Client
    js: JetStreamContext
    adapter: NullAdapter
    backend: BackendServer | None
    settings: Settings
    stop: asyncio.Event
    task: asyncio.Task[int]
    replies: list[dict[str, Any]] = field(default_factory=list)
    raw_replies: list[bytes] = field(default_factory=list)
    #: JetStream's max-deliveries advisories: each is an item whose delivery budget ran out.
    max_deliveries: list[dict[str, Any]] = field(default_factory=list)

    async def publish(
        self,
        item: dict[str, Any],
        *,
        subject: str | None = None,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> str:
        """Publish through JetStream (waiting for the PubAck, like the gateway) and return the id."""
        subject = subject or wire.pool_work_subject(POOL, PROFILE, BUNDLE, item.get("model_id", MODEL))
        payload = data if data is not None else msgpack.packb(item, use_bin_type=True)
        await self.js.publish(subject, payload, headers=headers)
        return str(item.get("work_item_id", ""))

    async def cancel(self, subject: str) -> None:
        """Publish a cancel on NATS Core and wait until the sidecar has certainly seen it: a probe
        item published after it is answered only once the cancel, delivered first, was handled."""
        await self.nc.publish(subject, b"")
        probe = await self.publish(work_item(text="probe"))
        await self.wait_for(lambda: len(self.results_for(probe)) == 1)

    def results_for(self, work_item_id: str) -> list[dict[str, Any]]:
        return [r for r in self.replies if r.get("work_item_id") == work_item_id]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached in time")
            await asyncio.sleep(0.02)

    async def readyz(self) -> tuple[int, str]:
        """The sidecar's `/readyz` status and body."""
        url = f"http://127.0.0.1:{self.settings.worker_probe_port}/readyz"
        async with aiohttp.ClientSession() as http, http.get(url) as r:
            return r.status, await r.text()

    async def pool_consumer(self) -> Any:
        return await self.js.consumer_info(wire.pool_stream_name(POOL), wire.pool_durable_name(POOL, PROFILE, BUNDLE))

    async def settled_pool(self, timeout: float = 10.0) -> None:
        """Wait until nothing is pending or un-ACKed on the pool consumer."""
        deadline = time.monotonic() + timeout
        while True:
            info = await self.pool_consumer()
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"pool consumer not drained: {info.num_pending} pending, {info.num_ack_pending} un-ACKed"
                )
            await asyncio.sleep(0.05)

    async def close(self) -> int:
        self.stop.set()
        code = await asyncio.wait_for(self.task, 30)
        if self.backend is not None:
            await self.backend.close()
        await self.nc.close()
        return code


async def start_stack(
    nats_server: NatsServer,
    tmp_path: Path,
    *,
    adapter: NullAdapter | None = None,
    env: dict[str, str] | None = None,
    external_backend: str | None = None,
    gateway_options: dict[str, Any] | None = None,
) -> Stack:
    """Start backend, sidecar and the gateway client; return once the sidecar is running.

    `external_backend` is the socket of a backend the test runs itself (a subprocess that may crash);
    `gateway_options` go to the gateway client's `nats.connect` (credentials, a TLS context).
    """
    adapter = adapter or NullAdapter(dim=8, preloaded_models=[MODEL])
    sock = external_backend or str(tmp_path / "backend.sock")
    backend: BackendServer | None = None
    if external_backend is None:
        backend = BackendServer(adapter, sock, worker_id="backend-0")
        await backend.start()
    environ = {
        "SIE_NATS_URL": nats_server.url,
        "SIE_POOL": POOL,
        "SIE_BUNDLE": BUNDLE,
        "SIE_MACHINE_PROFILE": PROFILE,
        "SIE_IPC_SOCKET_PATH": sock,
        "SIE_WORKER_ID": WORKER,
        "SIE_WORKER_PROBE_PORT": str(free_port()),
        "SIE_NAK_DELAY_S": str(NAK_DELAY_S),
        "SIE_WORKER_PING_INTERVAL_MS": "100",
        "SIE_HEALTH_PUBLISH_INTERVAL_MS": "1000",
        **(env or {}),
    }
    settings = Settings.from_env(environ)
    nc = await nats.connect(
        nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1, **(gateway_options or {})
    )
    stack_replies: list[dict[str, Any]] = []
    raw: list[bytes] = []

    async def on_reply(msg: Any) -> None:
        raw.append(msg.data)
        decoded = msgpack.unpackb(msg.data, raw=False)
        if isinstance(decoded, dict) and decoded.get("kind") != "result_chunk_v1":
            stack_replies.append(decoded)

    await nc.subscribe(f"_INBOX.{ROUTER}.>", cb=on_reply)
    exhausted: list[dict[str, Any]] = []

    async def on_advisory(msg: Any) -> None:
        exhausted.append(json.loads(msg.data))

    await nc.subscribe(f"{MAX_DELIVERIES_ADVISORY}.>", cb=on_advisory)
    stop, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run(settings, stop=stop, started=started))
    done, _ = await asyncio.wait(
        {task, asyncio.ensure_future(started.wait())}, timeout=20, return_when=asyncio.FIRST_COMPLETED
    )
    if task in done:
        task.result()  # surface the startup error
        raise AssertionError("sidecar exited during startup")
    if not started.is_set():
        task.cancel()
        raise AssertionError("sidecar did not start in time")
    stack = Stack(
        nats_server, nc, nc.jetstream(), adapter, backend, settings, stop, task, stack_replies, raw, exhausted
    )
    return stack


@contextlib.asynccontextmanager
async def running_stack(nats_server: NatsServer, tmp_path: Path, **kw: Any) -> Any:
    stack = await start_stack(nats_server, tmp_path, **kw)
    try:
        yield stack
    finally:
        await stack.close()


__all__ = [
    "MAX_DELIVERIES_ADVISORY",
    "MODEL",
    "NAK_DELAY_S",
    "ROUTER",
    "WORKER",
    "Stack",
    "free_port",
    "running_stack",
    "start_stack",
    "work_item",
]
