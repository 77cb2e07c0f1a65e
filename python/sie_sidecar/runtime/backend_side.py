# SPDX-License-Identifier: Apache-2.0
"""What every ingest mode opens first, before any transport of its own: the payload store, readiness
and the probes, and the backend client (sidecar-behaviour §2.1 startup order, §3, §10)."""

from __future__ import annotations

import contextlib

from ..config import Settings
from ..errors import StartupError
from ..ipc.children import BackendChildren
from ..ipc.client import IpcClient
from ..ipc.mux import MuxIpcClient
from ..payloads import PayloadStore, PayloadStoreConfigError
from ..pipeline.readiness import Readiness
from ..probes import ProbeServer, start_probes


def backend_client(settings: Settings) -> IpcClient | BackendChildren:
    """One IPC client, or one per backend child with placement and the config fan-out (§9.5); each
    pooled, or multiplexed over one connection with `SIE_IPC_MUX` (§1.2)."""
    limits = settings.concurrency
    paths = list(dict.fromkeys(settings.ipc_socket_paths)) or [settings.ipc_socket_path]
    clients: list[IpcClient] = []
    for path in paths:
        if settings.ipc_mux:
            client: IpcClient = MuxIpcClient(
                path,
                request_timeout_s=settings.ipc_request_timeout_s,
                model_ready_timeout_s=settings.model_ready_timeout_s,
            )
        else:
            client = IpcClient(
                path,
                pool_size=limits.ipc_connections,
                request_timeout_s=settings.ipc_request_timeout_s,
                model_ready_timeout_s=settings.model_ready_timeout_s,
            )
        clients.append(client)
    return clients[0] if len(clients) == 1 else BackendChildren(clients)


async def open_backend_side(
    settings: Settings, resources: contextlib.AsyncExitStack
) -> tuple[PayloadStore, Readiness, ProbeServer | None, IpcClient | BackendChildren]:
    """What every ingest mode opens first: the payload store (an unusable SIE_PAYLOAD_STORE_URL is
    fatal, §3), readiness and the probes (a bind failure is logged only, §10), the backend client."""
    try:
        payloads = PayloadStore.from_settings(settings)
    except PayloadStoreConfigError as exc:
        raise StartupError("payload store", str(exc), code=2) from None
    resources.callback(payloads.close)
    readiness = Readiness(
        ping_interval_ms=settings.worker_ping_interval_ms, stale_mult=settings.worker_readyz_stale_mult
    )
    probes = await start_probes(readiness, settings.worker_probe_port)
    if probes is not None:
        resources.push_async_callback(probes.cleanup)
    ipc = backend_client(settings)
    resources.push_async_callback(ipc.close)
    return payloads, readiness, probes, ipc


__all__ = ["backend_client", "open_backend_side"]
