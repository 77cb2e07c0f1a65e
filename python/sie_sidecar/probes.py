# SPDX-License-Identifier: Apache-2.0
"""The `/healthz` and `/readyz` HTTP probes (sidecar-behaviour §10) on the probe port."""

from __future__ import annotations

import logging

from aiohttp import web

from .pipeline.readiness import Readiness

log = logging.getLogger(__name__)


async def start_probes(readiness: Readiness, port: int, host: str = "0.0.0.0") -> web.AppRunner | None:
    """Serve `/healthz` and `/readyz`; a bind failure is logged and the process keeps running."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok", content_type="text/plain", charset="utf-8")

    async def readyz(_: web.Request) -> web.Response:
        reason = readiness.reason()
        if reason is None:
            return web.Response(text="ok", content_type="text/plain", charset="utf-8")
        return web.Response(status=503, text=f"not ready: {reason}", content_type="text/plain", charset="utf-8")

    async def not_found(_: web.Request) -> web.Response:
        return web.Response(status=404, text="not found", content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_route("*", "/{tail:.*}", not_found)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        log.error("probe server could not bind", extra={"port": port, "error": repr(exc)})
        await runner.cleanup()
        return None
    return runner


__all__ = ["start_probes"]
