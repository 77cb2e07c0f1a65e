# SPDX-License-Identifier: Apache-2.0
"""A gateway's `/v1/pools` on loopback (sidecar-behaviour §8), a real aiohttp server: what it answers
is set by the test (a body, a status, garbage, or nothing at all), and every request is recorded."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from sie_sidecar.tools.localhost import free_port


@dataclass
class Gateway:
    port: int
    #: What GET /v1/pools answers: a JSON-able body, or raw bytes (sent as they are).
    body: Any = field(default_factory=lambda: {"pools": []})
    status: int = 200
    #: Seconds to wait before answering (a slow gateway).
    delay_s: float = 0.0
    #: Send the body chunked (no Content-Length for the client to check first).
    chunked: bool = False
    #: (monotonic time, Authorization header) of each request.
    requests: list[tuple[float, str | None]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def assign(self, pool: str, workers: list[str], *, caps: dict[str, Any] | None = None, **spec: Any) -> None:
        """Answer one pool (replacing the list) with these workers assigned."""
        self.body = {"pools": [pool_entry(pool, workers, caps=caps, **spec)]}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((time.monotonic(), request.headers.get("Authorization")))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if isinstance(self.body, bytes) and self.chunked:
            response = web.StreamResponse(status=self.status, headers={"Content-Type": "application/json"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            for at in range(0, len(self.body), 1 << 20):
                await response.write(self.body[at : at + (1 << 20)])
            await response.write_eof()
            return response
        if isinstance(self.body, bytes):
            return web.Response(body=self.body, status=self.status, content_type="application/json")
        return web.json_response(self.body, status=self.status)


def pool_entry(name: str, workers: list[str], *, caps: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    entry_spec: dict[str, Any] = {"name": name, **spec}
    if caps is not None:
        entry_spec["gpu_caps"] = caps
    return {"spec": entry_spec, "status": {"assigned_workers": [{"name": w} for w in workers]}}


@contextlib.asynccontextmanager
async def running_gateway() -> AsyncIterator[Gateway]:
    gateway = Gateway(port=free_port())
    app = web.Application()
    app.router.add_get("/v1/pools", gateway.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", gateway.port)
    await site.start()
    try:
        yield gateway
    finally:
        await runner.cleanup()


__all__ = ["Gateway", "pool_entry", "running_gateway"]
