# SPDX-License-Identifier: Apache-2.0
"""A config service (`sie-config`) on loopback, a real aiohttp server shaped as sidecar-behaviour §9.3:
`GET /v1/configs/epoch` and `GET /v1/configs/export`, with the bearer recorded on every request.

It holds the control plane's truth: models with their configs, bundles and pools, and an epoch. Its
hashes are the reference backend's (`registry_hash`), so a backend that holds the same configs
agrees with it, and one that missed a write does not. `notification()` builds the §9.1 message a
control plane would publish for one model write.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from sie_sidecar.backend.config_registry import registry_hash
from sie_sidecar.tools.localhost import free_port

PRODUCER = "sie-config"


@dataclass
class ExportedConfig:
    model_id: str
    config: str
    bundles: tuple[str, ...] = ("default",)
    pool: str | None = None


@dataclass
class ConfigService:
    port: int
    epoch: int = 0
    models: dict[str, ExportedConfig] = field(default_factory=dict)
    #: When set, both endpoints answer this status with an empty body (a service that is down).
    fail_status: int | None = None
    #: (path, Authorization header) of each request.
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    #: When set, the hashes this service attests are computed over other bytes: a control plane
    #: that disagrees with every backend (a persistent hash mismatch).
    hash_salt: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"  # a trailing slash, which the client must ignore

    def configs_for(self, bundle: str = "default", pool: str = "default") -> dict[str, str]:
        return {
            m.model_id: m.config.strip()
            for m in self.models.values()
            if bundle in m.bundles and (m.pool or "default") == pool
        }

    def bundle_hash(self, bundle: str = "default", pool: str = "default") -> str:
        return registry_hash(bundle + self.hash_salt, self.configs_for(bundle, pool))

    def write(self, model_id: str, config: str, *, bump: bool = True, **kw: Any) -> None:
        """A control-plane write: the model's config replaced and (unless `bump=False`, a control plane
        without epochs) the epoch raised."""
        self.models[model_id] = ExportedConfig(model_id, config, **kw)
        if bump:
            self.epoch += 1

    def notification(self, model_id: str, *, producer: str = PRODUCER, **overrides: Any) -> bytes:
        """The §9.1 message for the last write of `model_id`."""
        model = self.models[model_id]
        body: dict[str, Any] = {
            "producer_id": producer,
            "bundle_id": "default",
            "epoch": self.epoch,
            "bundle_config_hash": self.bundle_hash(),
            "model_id": model_id,
            "profiles_added": [],
            "model_config": model.config,
            "affected_bundles": list(model.bundles),
        }
        body.update(overrides)
        return json.dumps(body).encode()

    def fingerprint(self) -> str:
        return registry_hash("fingerprint", {"default": self.bundle_hash()})

    async def epoch_handler(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, request.headers.get("Authorization")))
        if self.fail_status is not None:
            return web.Response(status=self.fail_status)
        return web.json_response({"epoch": self.epoch, "bundle_config_hashes_hash": self.fingerprint()})

    async def export_handler(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, request.headers.get("Authorization")))
        if self.fail_status is not None:
            return web.Response(status=self.fail_status)
        models = [
            {"model_id": m.model_id, "raw_yaml": m.config, "affected_bundles": list(m.bundles), "pool": m.pool}
            for m in self.models.values()
        ]
        return web.json_response(
            {
                "epoch": self.epoch,
                "bundle_config_hashes": {"default": self.bundle_hash()},
                "bundle_pool_config_hashes": {},
                "models": models,
            }
        )


@contextlib.asynccontextmanager
async def running_config_service() -> AsyncIterator[ConfigService]:
    service = ConfigService(port=free_port())
    app = web.Application()
    app.router.add_get("/v1/configs/epoch", service.epoch_handler)
    app.router.add_get("/v1/configs/export", service.export_handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", service.port)
    await site.start()
    try:
        yield service
    finally:
        await runner.cleanup()


__all__ = ["PRODUCER", "ConfigService", "running_config_service"]
