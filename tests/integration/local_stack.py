# SPDX-License-Identifier: Apache-2.0
"""The sidecar in local-ingest mode (`SIE_SIDECAR_INGEST=local`, sidecar-behaviour §11) in one event
loop with the real reference backend on a real Unix socket, and the package's own local client."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from sie_sidecar.backend.null import NullAdapter
from sie_sidecar.backend.server import BackendServer
from sie_sidecar.config import Settings
from sie_sidecar.local import Client, work_items
from sie_sidecar.local.client import request_body
from sie_sidecar.runtime import run
from sie_sidecar.tools.localhost import free_port

POOL, PROFILE, BUNDLE, WORKER = "default", "cpu", "default", "w-local"
MODEL = "org/model-a"
LANE = f"{POOL}|{PROFILE}|{BUNDLE}"
_ids = itertools.count()


def new_request_id() -> str:
    return f"lreq-{next(_ids)}"


def encode_body(texts: list[str], *, request_id: str | None = None, **fields: Any) -> dict[str, Any]:
    """A `publish_work` body of encode items, one per text."""
    rid = request_id or new_request_id()
    items = work_items(
        rid,
        "encode",
        MODEL,
        [{"item": {"text": t}, "output_types": ["dense"]} for t in texts],
        pool_name=POOL,
        machine_profile=PROFILE,
    )
    return request_body(lane=LANE, endpoint="encode", model=MODEL, request_id=rid, items=msgpack.packb(items), **fields)


def generate_body(
    prompt: str = "tell me", max_new_tokens: int = 5, *, request_id: str | None = None, **fields: Any
) -> dict[str, Any]:
    rid = request_id or new_request_id()
    items = work_items(
        rid,
        "generate",
        MODEL,
        [{"generate": {"prompt": prompt, "max_new_tokens": max_new_tokens}}],
        pool_name=POOL,
        machine_profile=PROFILE,
    )
    return request_body(
        lane=LANE, endpoint="generate", model=MODEL, request_id=rid, items=msgpack.packb(items), **fields
    )


@dataclass
class LocalStack:
    adapter: NullAdapter
    backend: BackendServer
    settings: Settings
    socket: str
    stop: asyncio.Event
    task: asyncio.Task[int]

    async def client(self) -> Client:
        return await Client.connect(self.socket)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached in time")
            await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running_local(
    tmp_path: Path, *, adapter: NullAdapter | None = None, env: dict[str, str] | None = None
) -> AsyncIterator[LocalStack]:
    adapter = adapter or NullAdapter(dim=8, preloaded_models=[MODEL])
    backend_sock = str(tmp_path / "backend.sock")
    backend = BackendServer(adapter, backend_sock, worker_id="backend-0")
    await backend.start()
    socket = str(tmp_path / "ingest" / "local.sock")
    environ = {
        "SIE_SIDECAR_INGEST": "local",
        "SIE_SIDECAR_LOCAL_SOCKET": socket,
        "SIE_POOL": POOL,
        "SIE_BUNDLE": BUNDLE,
        "SIE_MACHINE_PROFILE": PROFILE,
        "SIE_IPC_SOCKET_PATH": backend_sock,
        "SIE_WORKER_ID": WORKER,
        "SIE_WORKER_PROBE_PORT": str(free_port()),
        "SIE_NAK_DELAY_S": "0.2",
        "SIE_WORKER_PING_INTERVAL_MS": "100",
        **(env or {}),
    }
    settings = Settings.from_env(environ)
    stop = asyncio.Event()
    started = asyncio.Event()
    task = asyncio.create_task(run(settings, stop=stop, started=started))
    waiter = asyncio.ensure_future(started.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        raise AssertionError(f"local sidecar exited with {task.result()}")
    stack = LocalStack(adapter, backend, settings, socket, stop, task)
    try:
        yield stack
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 40)
        await backend.close()
