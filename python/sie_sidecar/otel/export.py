# SPDX-License-Identifier: Apache-2.0
"""The OTLP/HTTP push (sidecar-behaviour §13): every export interval (5 s, `OTEL_METRIC_EXPORT_INTERVAL`)
one POST of the registry's snapshot, and a last one at shutdown so the final counts are not lost.

Telemetry never affects serving: a failed export is logged (rate-limited) and the next one carries
the cumulative values anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from ..logs import Throttled
from ..telemetry import Registry

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)
_warn = Throttled(log)

EXPORT_TIMEOUT_S: Final = 10.0
CONTENT_TYPE: Final = "application/x-protobuf"


def _open_session() -> aiohttp.ClientSession:
    import aiohttp

    return aiohttp.ClientSession()


class MetricsExporter:
    """Pushes one registry to one OTLP/HTTP metrics endpoint."""

    def __init__(
        self,
        registry: Registry,
        endpoint: str,
        *,
        resource: Mapping[str, str],
        lane: str,
        interval_s: float = 5.0,
        version: str = "",
    ) -> None:
        self._registry = registry
        self._endpoint = endpoint
        self._resource = dict(resource)
        self._lane = lane
        self._interval_s = interval_s
        self._version = version
        self._start_ns = time.time_ns()
        self.exports = 0
        self.failures = 0

    def body(self) -> bytes:
        from .metrics import encode_metrics  # protobuf and aiohttp load at the first push, not at start-up

        return encode_metrics(
            self._registry.snapshot(),
            resource=self._resource,
            lane=self._lane,
            start_ns=self._start_ns,
            now_ns=time.time_ns(),
            version=self._version,
        )

    async def export(self, session: aiohttp.ClientSession) -> bool:
        """One POST; False (logged) when the receiver did not take it."""
        import aiohttp

        try:
            async with session.post(
                self._endpoint,
                data=self.body(),
                headers={"Content-Type": CONTENT_TYPE},
                timeout=aiohttp.ClientTimeout(total=EXPORT_TIMEOUT_S),
                allow_redirects=False,
            ) as response:
                await response.read()
                if response.status // 100 != 2:
                    raise RuntimeError(f"HTTP {response.status}")
        except Exception as exc:
            self.failures += 1
            _warn.warning("OTLP metrics export failed", key="otlp-metrics", extra={"error": repr(exc)})
            return False
        self.exports += 1
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Export every interval until `stop`, then once more. Nothing is imported or opened before
        the first push: the sidecar's first replies do not pay for the exporter."""
        session: aiohttp.ClientSession | None = None
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._interval_s):
                        await stop.wait()
                if not stop.is_set():
                    session = session or _open_session()
                    await self.export(session)
            session = session or _open_session()
            await self.export(session)
        finally:
            if session is not None:
                await session.close()


__all__ = ["MetricsExporter"]
